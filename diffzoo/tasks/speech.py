"""Keyword spotting as a LightningModule: a registered speech encoder on ``(waveform, label, length)`` batches.

It is :class:`~diffzoo.tasks.classification.ImageClassificationTask` with audio batches: the same AdamW
parameter groups, warmup + cosine schedule, optional weight EMA, and RNG state in checkpoints for exact
resume. Only :meth:`~SpeechClassificationTask.split_batch` differs: the valid length of each clip reaches
the model, which masks padded frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from .classification import ImageClassificationTask


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
        init_from, train_only, unfreeze_after: start from a converted model and train only its attention
            layers first, as :class:`ImageClassificationTask`.
        attn: the attention spec (``softmax``, ``diff``, ``diff_nonorm``, ... :mod:`diffzoo.layers.spec`); None
            keeps the model name's own (``diff*``: diff, ``soft*``: softmax).
    """

    def __init__(
        self,
        model: str = "diffkwt_nano",
        num_classes: int = 12,
        model_kwargs: dict[str, Any] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        ema_decay: float | None = None,
        grad_checkpointing: bool = False,
        init_from: str | None = None,
        train_only: str | None = None,
        unfreeze_after: int | None = None,
        attn: str | None = None,
    ) -> None:
        import diffzoo.models.speech  # noqa: F401  (registers the speech models with timm)

        super().__init__(
            model=model, num_classes=num_classes, in_chans=1, model_kwargs=model_kwargs, lr=lr,
            weight_decay=weight_decay, betas=betas, warmup_epochs=warmup_epochs, min_lr_ratio=min_lr_ratio,
            label_smoothing=label_smoothing, ema_decay=ema_decay, grad_checkpointing=grad_checkpointing,
            init_from=init_from, train_only=train_only, unfreeze_after=unfreeze_after, attn=attn,
        )

    skipped_samples = "unusable audio file(s)"

    def split_batch(self, batch: Sequence[Tensor]) -> tuple[tuple[Tensor, ...], Tensor | None]:
        """``(wave, lengths), labels`` of a ``(waveform, label, length)`` batch."""
        wave, y, lengths = batch
        return (wave, lengths), y

    def forward(self, wave: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``(B, T)`` waveforms and ``(B,)`` valid samples -> ``(B, num_classes)`` logits."""
        return self.model(wave, lengths)
