"""Train only a model's attention layers for the first steps (``--model.train_only attention``), typically
after starting from a converted model (``--model.init_from DIR``, loaded by
:func:`diffzoo.weights.load_init_from`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..layers.attention import AttentionBase

__all__ = ["TRAIN_ONLY", "TrainsOnlyFirst", "check_train_only", "set_trainable"]

TRAIN_ONLY = ("attention",)


def check_train_only(train_only: str | None) -> None:
    """Raise a one-line ``ValueError`` unless ``train_only`` is None or one of :data:`TRAIN_ONLY`."""
    if train_only is not None and train_only not in TRAIN_ONLY:
        raise ValueError(f"--model.train_only {train_only!r}; expected one of {list(TRAIN_ONLY)} or null")


def _is_attention(module: nn.Module) -> bool:
    if isinstance(module, (AttentionBase, nn.MultiheadAttention)):
        return True
    try:
        from timm.layers import Attention as TimmAttention
    except ImportError:  # pragma: no cover
        return False
    return isinstance(module, TimmAttention)


def set_trainable(model: nn.Module, train_only: str | None) -> int:
    """``requires_grad`` True only on the attention layers' parameters (``train_only="attention"``), or on
    every parameter (``None``). Returns the number of trainable parameter tensors."""
    if train_only is None:
        for p in model.parameters():
            p.requires_grad_(True)
        return sum(1 for _ in model.parameters())
    check_train_only(train_only)
    keep = {id(p) for m in model.modules() if _is_attention(m) for p in m.parameters()}
    if not keep:
        raise ValueError("--model.train_only attention: the model has no attention layer")
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return len(keep)


class TrainsOnlyFirst:
    """LightningModule mixin: while ``global_step < hparams.unfreeze_after`` (always, when it is None) only
    the parameters chosen by ``hparams.train_only`` receive gradients (the others get none, so AdamW leaves
    them untouched); from then on all do. The optimizer holds every parameter throughout."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        hp = self.hparams
        train_only = hp.get("train_only")
        if train_only is not None:
            after = hp.get("unfreeze_after")
            frozen = after is None or self.global_step < int(after)
            set_trainable(self.model, train_only if frozen else None)
        return super().on_train_batch_start(batch, batch_idx)
