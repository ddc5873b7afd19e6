"""The optimiser and learning-rate schedule every task trains with: AdamW on two parameter groups (weight
decay on weight matrices only) and a per-step linear warm-up followed by a cosine decay.

Which parameters decay is decided by timm (:func:`timm.optim.param_groups_weight_decay`); the schedule is a
:class:`torch.optim.lr_scheduler.LambdaLR` over :func:`warmup_cosine` (see its docstring for why it is not
one of torch's or timm's schedulers).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

__all__ = ["adamw_warmup_cosine", "epochs_to_steps", "warmup_cosine", "weight_decay_groups"]


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up from ``1/warmup_steps`` to 1 over ``warmup_steps``, then cosine to ``min_ratio``.

    Kept by hand because neither library computes this sequence: torch's ``CosineAnnealingLR`` steps a
    recursive formula (its values drift from the closed form in the last bits, so runs would not repeat
    earlier ones exactly) and rises again after ``T_max``, and timm's ``CosineLRScheduler`` starts its
    warm-up at ``warmup_lr_init`` and reaches the peak one step later. Here the multiplier is a closed form of
    the step, holds ``min_ratio`` after ``total_steps`` (a resumed run with more steps), and a run resumed
    from a checkpoint sees the same value at every step as one that never stopped.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def weight_decay_groups(
    model: nn.Module, weight_decay: float, no_decay_names: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """AdamW groups ``[decay, no decay]``: ``weight_decay`` on weight matrices only; none on 1-d parameters
    (gains, biases, lambdas), the model's ``no_weight_decay()`` names and names containing any of
    ``no_decay_names``.

    The split is timm's :func:`~timm.optim.param_groups_weight_decay`. It is asked with a placeholder decay
    of 1 because with ``weight_decay=0`` timm merges everything into one group; two groups are always
    returned so that a checkpoint's optimiser state loads whatever the decay value.
    """
    from timm.optim import param_groups_weight_decay

    # timm matches fnmatch patterns: the model's exact names, and ``*name*`` for a substring
    patterns = {*getattr(model, "no_weight_decay", lambda: set())(), *(f"*{s}*" for s in no_decay_names)}
    groups = param_groups_weight_decay(model, weight_decay=1.0, no_weight_decay_list=sorted(patterns))
    decay = [p for g in groups if g["weight_decay"] for p in g["params"]]
    no_decay = [p for g in groups if not g["weight_decay"] for p in g["params"]]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def epochs_to_steps(trainer: pl.Trainer, epochs: float) -> int:
    """``epochs`` (fractions allowed) in optimizer steps of this run, rounded; with ``max_epochs=-1`` (a run
    bounded by ``max_steps``) an epoch is the loader's length over the gradient accumulation, or the whole
    run for a loader without a length."""
    total = trainer.estimated_stepping_batches
    if trainer.max_epochs and trainer.max_epochs > 0:
        return int(round(epochs * int(total) / trainer.max_epochs))
    if trainer.train_dataloader is None:
        trainer.fit_loop.setup_data()
    batches = trainer.num_training_batches
    per_epoch = batches / max(1, trainer.accumulate_grad_batches) if math.isfinite(batches) else total
    return int(round(epochs * per_epoch)) if epochs else 0


def adamw_warmup_cosine(
    params: list[dict[str, Any]],
    trainer: pl.Trainer,
    *,
    lr: float,
    betas: tuple[float, float],
    warmup_steps: int,
    min_lr_ratio: float,
    eps: float = 1e-8,
) -> dict[str, Any]:
    """``configure_optimizers`` result: AdamW over ``params`` and a per-step :func:`warmup_cosine` schedule
    over the run's ``trainer.estimated_stepping_batches`` (warm-up clipped to 1 .. total steps)."""
    opt = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=eps)
    total = int(trainer.estimated_stepping_batches)
    warmup = max(1, min(total, int(warmup_steps)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: warmup_cosine(step, warmup, total, min_lr_ratio))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
