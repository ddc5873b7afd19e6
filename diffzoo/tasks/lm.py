"""Causal language modelling as a LightningModule: AdamW + warmup + cosine, validation loss and perplexity.

Gradient accumulation is the Trainer's (``accumulate_grad_batches``); the learning-rate schedule counts
optimizer steps. Checkpoints carry the Python/NumPy/torch RNG states, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from ..models.lm import LM_PRESETS, CausalLM, LMConfig
from .callbacks import GuardedTraining, require_trained
from .classification import warmup_cosine, weight_decay_groups
from .export import read_metadata, safetensors_metadata, save_safetensors
from .init_from import TRAIN_ONLY, TrainsOnlyFirst, load_init_from
from .resume import RestoresRNG

__all__ = ["LMRunSummary", "LanguageModelTask", "export_lm", "load_lm"]


class LanguageModelTask(GuardedTraining, RestoresRNG, TrainsOnlyFirst, pl.LightningModule):
    """Train a :class:`~diffzoo.models.lm.CausalLM` on next-token prediction.

    Args:
        model: a preset name of :data:`~diffzoo.models.lm.LM_PRESETS`.
        attn: ``"diff"``, ``"diff_v2"`` or ``"softmax"``.
        vocab_size: tokenizer vocabulary (linked from the DataModule by the recipe).
        model_kwargs: further :class:`~diffzoo.models.lm.LMConfig` fields (``dim``, ``depth``, ...).
        lr: peak learning rate.
        weight_decay: AdamW weight decay on matrices (not on norms, lambdas, embeddings).
        betas: AdamW betas.
        warmup_steps: linear warmup in optimizer steps.
        min_lr_ratio: final learning rate of the cosine relative to ``lr``.
        init_from: a folder written by ``python -m recipes.convert`` to start from (``model``/``attn``/
            ``model_kwargs`` must give the converted architecture), see :mod:`diffzoo.tasks.init_from`.
        train_only: ``"attention"`` to train only the attention layers until ``unfreeze_after``.
        unfreeze_after: optimizer step from which every parameter trains (None: never, with ``train_only``).
    """

    def __init__(
        self,
        model: str = "lm_nano",
        attn: str = "diff",
        vocab_size: int = 256,
        model_kwargs: Optional[dict[str, Any]] = None,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.1,
        init_from: Optional[str] = None,
        train_only: Optional[str] = None,
        unfreeze_after: Optional[int] = None,
    ) -> None:
        super().__init__()
        if train_only is not None and train_only not in TRAIN_ONLY:
            raise ValueError(f"--model.train_only {train_only!r}; expected one of {list(TRAIN_ONLY)} or null")
        self.save_hyperparameters()
        if model not in LM_PRESETS:
            raise ValueError(f"unknown model preset {model!r}; choose one of {sorted(LM_PRESETS)}")
        self.config = LMConfig(**{**LM_PRESETS[model], "vocab_size": vocab_size, "attn": attn, **(model_kwargs or {})})
        self.model = CausalLM(self.config)
        if init_from is not None:
            load_init_from(self.model, init_from)
        self.val_loss = MeanMetric()

    def forward(self, tokens: Tensor, **kwargs: Any) -> Tensor:
        """``(B, N)`` tokens -> ``(B, N, vocab)`` logits."""
        return self.model(tokens, **kwargs)

    def loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(batch[0]))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.val_loss.update(self.loss(batch), weight=len(batch[0]))

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()  # synchronised over ranks
        self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", torch.exp(loss))

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    on_test_epoch_end = on_validation_epoch_end

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups of :func:`~diffzoo.tasks.classification.weight_decay_groups`."""
        return weight_decay_groups(self.model, self.hparams.weight_decay)

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        opt = torch.optim.AdamW(self.param_groups(), lr=hp.lr, betas=tuple(hp.betas))
        total = int(self.trainer.estimated_stepping_batches)
        warmup = max(1, min(hp.warmup_steps, total))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: warmup_cosine(step, warmup, total, hp.min_lr_ratio))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def export_lm(task: LanguageModelTask, path: Any) -> Path:
    """Write the model's weights to safetensors (a tied output weight is stored once, as the embedding)."""
    sd = task.model.state_dict()
    if task.config.tie_embeddings:
        sd.pop("output.weight")
    args = {**LM_PRESETS[task.hparams["model"]], **(task.hparams.get("model_kwargs") or {})}
    args.update(attn=task.hparams["attn"], vocab_size=task.hparams["vocab_size"])
    return save_safetensors(sd, path, task.hparams["model"], args)


def load_lm(path: Any) -> CausalLM:
    """Rebuild a :class:`CausalLM` from a file written by :func:`export_lm`.

    Raises ``ValueError`` (one line) for a file that is not such an export: not safetensors, no diffzoo
    metadata, or the weights of another model family (e.g. a ViT export).
    """
    from safetensors.torch import load_file

    meta = safetensors_metadata(path)
    if "model" not in meta or "model_args" not in meta:
        raise ValueError(f"{path} has no diffzoo metadata (model, model_args); load_lm reads the model.safetensors "
                         "that python -m recipes.lm (export_lm) writes")
    name, args = read_metadata(path)
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    if name not in LM_PRESETS or not set(args) <= fields:
        raise ValueError(
            f"{path} holds a {name!r} model, not a diffzoo language model; pass a model.safetensors written by "
            f"python -m recipes.lm (presets: {', '.join(sorted(LM_PRESETS))})"
        )
    model = CausalLM(LMConfig(**args))
    model.load_state_dict(load_file(str(path)), strict=not model.config.tie_embeddings)
    return model


class LMRunSummary(pl.Callback):
    """At the end of ``fit``: export ``model.safetensors``, write ``summary.json``, print loss and perplexity."""

    def __init__(self, export: bool = True) -> None:
        self.export = export
        self.summary: dict[str, Any] = {}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        out = Path(trainer.log_dir or trainer.default_root_dir)
        require_trained(trainer)
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
        ckpt = trainer.checkpoint_callback
        summary: dict[str, Any] = {
            "model": pl_module.hparams.get("model"),
            "attn": pl_module.hparams.get("attn"),
            "parameters": sum(p.numel() for p in pl_module.model.parameters()),
            "global_step": trainer.global_step,
            "metrics": metrics,
            "last_checkpoint": getattr(ckpt, "last_model_path", None) or None,
            "log_dir": str(out),
        }
        if self.export:
            summary["safetensors"] = str(export_lm(pl_module, out / "model.safetensors"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.summary = summary
        loss = metrics.get("val/loss")
        shown = f"val/loss {loss:.4f} (perplexity {math.exp(loss):.2f})" if loss is not None else "val/loss: not measured"
        print(f"{shown}\ncheckpoint: {summary['last_checkpoint']}\nlog: {out / 'metrics.csv'}", flush=True)
