"""Keyword spotting as a LightningModule: a registered speech encoder on ``(waveform, label, length)`` batches.

It is :class:`~diffzoo.tasks.classification.ImageClassificationTask` with audio batches: the same AdamW
parameter groups, warmup + cosine schedule, optional weight EMA, and RNG state in checkpoints for exact
resume. The valid length of each clip reaches the model, which masks padded frames.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from .classification import ImageClassificationTask
from .metrics import FiniteMulticlassAccuracy


class SpeechClassificationTask(ImageClassificationTask):
    """Train a ``diffkwt_*`` / ``softkwt_*`` / ``diffast_*`` / ``softast_*`` model (timm registry names).

    Args:
        model: registered speech model name.
        num_classes: classifier outputs (linked from the DataModule by the recipe).
        model_kwargs: extra model arguments (``drop_path_rate``, ``time_mask_param``, ``lambda_init``, ...).
        lr, weight_decay, betas, warmup_epochs, min_lr_ratio: AdamW and its schedule.
        label_smoothing: label smoothing of the training loss.
        ema_decay: weight EMA decay, or None; validated as ``val/top1_ema``.
        grad_checkpointing: recompute block activations in the backward pass.
    """

    def __init__(
        self,
        model: str = "diffkwt_nano",
        num_classes: int = 12,
        model_kwargs: Optional[dict[str, Any]] = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        ema_decay: Optional[float] = None,
        grad_checkpointing: bool = False,
    ) -> None:
        import diffzoo.models.speech  # noqa: F401  (registers the speech models with timm)

        super().__init__(
            model=model, num_classes=num_classes, in_chans=1, model_kwargs=model_kwargs, lr=lr,
            weight_decay=weight_decay, betas=betas, warmup_epochs=warmup_epochs, min_lr_ratio=min_lr_ratio,
            label_smoothing=label_smoothing, ema_decay=ema_decay, grad_checkpointing=grad_checkpointing,
        )
        self.test_top1 = FiniteMulticlassAccuracy(num_classes, top_k=1, average="micro")

    def forward(self, wave: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
        """``(B, T)`` waveforms and ``(B,)`` valid samples -> ``(B, num_classes)`` logits."""
        return self.model(wave, lengths)

    def training_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> Tensor:
        wave, y, lengths = batch
        logits = self(wave, lengths)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=self.hparams.label_smoothing)
        self.train_top1(logits.detach(), y)
        self.log("train/top1", self.train_top1, on_step=False, on_epoch=True)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(y))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_train_epoch_end(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        bad = int(getattr(dm, "num_bad", 0) or 0)
        self.log("data/bad_samples", float(bad), reduce_fx="sum", sync_dist=True)
        if bad:
            rank_zero_warn(f"{bad} unusable audio file(s) were skipped so far (see the log for which)")

    def validation_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> None:
        wave, y, lengths = batch
        self.count_evaluated(len(y))
        logits = self(wave, lengths)
        self.val_top1(logits, y)
        self.val_top5(logits, y)
        self.log("val/loss", F.cross_entropy(logits.float(), y), on_epoch=True, sync_dist=True, batch_size=len(y))
        self.log("val/top1", self.val_top1, on_epoch=True, prog_bar=True)
        self.log("val/top5", self.val_top5, on_epoch=True)
        if self.ema is not None:
            self.val_top1_ema(self.ema.module(wave, lengths), y)
            self.log("val/top1_ema", self.val_top1_ema, on_epoch=True)

    def test_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> None:
        wave, y, lengths = batch
        self.count_evaluated(len(y))
        logits = self(wave, lengths)
        self.test_top1(logits, y)
        self.log("test/loss", F.cross_entropy(logits.float(), y), on_epoch=True, sync_dist=True, batch_size=len(y))
        self.log("test/top1", self.test_top1, on_epoch=True)
