"""Image classification as a LightningModule: any timm model, AdamW + warmup + cosine, DeiT's regularisers.

Label smoothing and Mixup/CutMix come from timm (``timm.data.Mixup``, ``SoftTargetCrossEntropy``), the
optional weight EMA from ``timm.utils.ModelEmaV3``, top-1/top-5 from torchmetrics (a NaN or infinite logit row counts as wrong).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from .callbacks import GuardedTraining
from .init_from import TRAIN_ONLY, TrainsOnlyFirst, load_init_from
from .metrics import FiniteMulticlassAccuracy
from .resume import RestoresRNG


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warmup from ~0 to 1 over ``warmup_steps``, then cosine to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def weight_decay_groups(model: nn.Module, weight_decay: float, no_decay_names: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """AdamW groups: ``weight_decay`` on weight matrices only; none on 1-d parameters (gains, biases,
    lambdas), the model's ``no_weight_decay()`` names and names containing any of ``no_decay_names``."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        excluded = p.ndim <= 1 or name in skip or any(s in name for s in no_decay_names)
        (no_decay if excluded else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _num_skipped(dataset: Any) -> int:
    """``num_bad`` of an evaluation data set (through ``Subset`` wrappers); 0 for one without."""
    while dataset is not None and not hasattr(dataset, "num_bad") and hasattr(dataset, "dataset"):
        dataset = dataset.dataset
    return int(getattr(dataset, "num_bad", 0) or 0)


class ImageClassificationTask(GuardedTraining, RestoresRNG, TrainsOnlyFirst, pl.LightningModule):
    """Train a timm-registered classifier (``diffvit_*``, ``softvit_*`` or any timm model).

    Args:
        model: timm model name.
        num_classes: classifier outputs (linked from the DataModule by the recipes).
        in_chans: input channels (linked from the DataModule).
        img_size: input resolution, or None for the model's default (linked from the DataModule).
        model_kwargs: extra ``timm.create_model`` arguments (``drop_path_rate``, ``global_pool``, ...).
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay; biases, norms, embeddings and 1-d parameters get none.
        betas: AdamW betas.
        warmup_epochs: linear warmup length in epochs (fractions allowed).
        min_lr_ratio: final learning rate of the cosine schedule relative to ``lr``.
        label_smoothing: label smoothing (also applied to Mixup targets).
        mixup_alpha, cutmix_alpha: Mixup / CutMix strength (0 disables; DeiT: 0.8 / 1.0).
        mixup_prob: probability of mixing a batch.
        ema_decay: weight EMA decay (e.g. 0.9998), or None for none; validated as ``val/top1_ema``.
        grad_checkpointing: recompute block activations in the backward pass.
        init_from: a folder written by ``python -m recipes.convert`` to start from (the model must have
            the converted architecture), see :mod:`diffzoo.tasks.init_from`.
        train_only: ``"attention"`` to train only the attention layers until ``unfreeze_after``.
        unfreeze_after: optimizer step from which every parameter trains (None: never, with ``train_only``).
    """

    def __init__(
        self,
        model: str = "diffvit_nano_patch7_28",
        num_classes: int = 10,
        in_chans: int = 3,
        img_size: Optional[int] = None,
        model_kwargs: Optional[dict[str, Any]] = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        ema_decay: Optional[float] = None,
        grad_checkpointing: bool = False,
        init_from: Optional[str] = None,
        train_only: Optional[str] = None,
        unfreeze_after: Optional[int] = None,
    ) -> None:
        super().__init__()
        if train_only is not None and train_only not in TRAIN_ONLY:
            raise ValueError(f"--model.train_only {train_only!r}; expected one of {list(TRAIN_ONLY)} or null")
        self.save_hyperparameters()
        import timm

        import diffzoo.models  # noqa: F401  (registers diffvit_* / softvit_* with timm)

        kwargs = dict(model_kwargs or {})
        if img_size is not None:
            kwargs.setdefault("img_size", img_size)
        self.model = timm.create_model(model, num_classes=num_classes, in_chans=in_chans, **kwargs)
        if init_from is not None:
            load_init_from(self.model, init_from)
        if grad_checkpointing:
            self.model.set_grad_checkpointing(True)
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            from timm.data import Mixup

            self.mixup = Mixup(
                mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=mixup_prob,
                label_smoothing=label_smoothing, num_classes=num_classes,
            )
        self.ema: Optional[nn.Module] = None
        if ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=ema_decay)
        top5 = min(5, num_classes)
        self.train_top1 = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_top1 = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_top5 = FiniteMulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.val_top1_ema = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro") if self.ema is not None else None

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> ``(B, num_classes)`` logits."""
        return self.model(x)

    # -- training ------------------------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch[0], batch[1]
        hard = y
        if self.mixup is not None:
            if len(x) % 2:  # timm's Mixup pairs samples and needs an even batch
                x, y, hard = x[:-1], y[:-1], y[:-1]
            x, y = self.mixup(x, y)  # y: (B, num_classes) soft targets
        logits = self(x)
        if y.dim() == 2:
            loss = torch.sum(-y * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(logits.float(), y, label_smoothing=self.hparams.label_smoothing)
            self.train_top1(logits.detach(), hard)
            self.log("train/top1", self.train_top1, on_step=False, on_epoch=True)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(x))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)

    def on_train_epoch_start(self) -> None:
        # Shard data sets reshuffle by epoch (the DataLoader pickles them to its workers afterwards).
        loader = self.trainer.train_dataloader
        dataset = getattr(loader, "dataset", None)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.current_epoch)

    def on_train_epoch_end(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        bad = int(getattr(dm, "num_bad", 0) or 0)
        self.log("data/bad_samples", float(bad), reduce_fx="sum", sync_dist=True)
        if bad:
            rank_zero_warn(f"{bad} unreadable image(s) or corrupt shard entries were skipped so far (see the log)")

    # -- evaluation ----------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._evaluated = 0

    def on_test_epoch_start(self) -> None:
        self._evaluated = 0

    def count_evaluated(self, n: int) -> None:
        """Add ``n`` samples to the evaluated count logged as ``val/evaluated`` / ``test/evaluated``."""
        self._evaluated = getattr(self, "_evaluated", 0) + int(n)

    def on_validation_epoch_end(self) -> None:
        self.log_eval_counts("val", self.trainer.val_dataloaders)

    def on_test_epoch_end(self) -> None:
        self.log_eval_counts("test", self.trainer.test_dataloaders)

    def log_eval_counts(self, stage: str, loaders: Any) -> None:
        """Log ``<stage>/evaluated`` (samples scored) and ``<stage>/skipped`` (unusable samples left out)."""
        loaders = [] if loaders is None else loaders if isinstance(loaders, (list, tuple)) else [loaders]
        skipped = sum(_num_skipped(getattr(dl, "dataset", None)) for dl in loaders)
        evaluated = getattr(self, "_evaluated", 0)
        self.log(f"{stage}/evaluated", float(evaluated), reduce_fx="sum", sync_dist=True)
        self.log(f"{stage}/skipped", float(skipped), reduce_fx="sum", sync_dist=True)
        if skipped and not self.trainer.sanity_checking:
            rank_zero_warn(
                f"{stage}: {skipped} unusable sample(s) were left out of the {stage} metrics, which cover "
                f"{evaluated} sample(s) on this device (see the log for which)"
            )

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        self.count_evaluated(len(y))
        logits = self(x)
        loss = F.cross_entropy(logits.float(), y)
        self.val_top1(logits, y)
        self.val_top5(logits, y)
        self.log("val/loss", loss, on_epoch=True, sync_dist=True, batch_size=len(x))
        self.log("val/top1", self.val_top1, on_epoch=True, prog_bar=True)
        self.log("val/top5", self.val_top5, on_epoch=True)
        if self.ema is not None:
            self.val_top1_ema(self.ema.module(x), y)
            self.log("val/top1_ema", self.val_top1_ema, on_epoch=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    # -- optimisation --------------------------------------------------------------------------
    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups: weight decay on matrices only (no decay on biases, norms, embeddings, lambdas)."""
        return weight_decay_groups(self.model, self.hparams.weight_decay)

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        opt = torch.optim.AdamW(self.param_groups(), lr=hp.lr, betas=tuple(hp.betas))
        total = int(self.trainer.estimated_stepping_batches)
        epochs = max(1, self.trainer.max_epochs or 1)
        warmup = min(total, int(round(hp.warmup_epochs * total / epochs)))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: warmup_cosine(step, max(1, warmup), total, hp.min_lr_ratio)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
