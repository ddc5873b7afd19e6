"""Start a task's model from a converted model (``python -m recipes.convert ... --out DIR``) and, optionally,
train only its attention layers for the first steps.

``DIR`` holds ``model.safetensors`` and ``convert.json`` (see :mod:`diffzoo.convert`). The task builds its
model as usual; :func:`load_init_from` loads the converted weights into it strictly, so the task's model
must have the converted architecture (e.g. ``diffvit_nano_patch7_28`` with ``attn: diff_v2`` for weights
converted from ``softvit_nano_patch7_28``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from ..layers.attention import AttentionBase
from ..layers.diff_attention import DiffAttention

__all__ = ["TRAIN_ONLY", "TrainsOnlyFirst", "check_train_only", "load_init_from", "set_trainable"]

TRAIN_ONLY = ("attention",)


def check_train_only(train_only: str | None) -> None:
    """Raise a one-line ``ValueError`` unless ``train_only`` is None or one of :data:`TRAIN_ONLY`."""
    if train_only is not None and train_only not in TRAIN_ONLY:
        raise ValueError(f"--model.train_only {train_only!r}; expected one of {list(TRAIN_ONLY)} or null")


def load_init_from(model: nn.Module, path: str | Path) -> dict[str, Any]:
    """Load the converted weights in the folder ``path`` into ``model``; returns ``convert.json``'s content.

    Differential V1 layers get the ``lambda_init`` the conversion fixed (it is not a weight).

    Raises:
        FileNotFoundError / ValueError: one line naming the folder and what to change.
    """
    from ..checkpoint_io import read_weights

    folder = Path(path)
    meta_path, weights_path = folder / "convert.json", folder / "model.safetensors"
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise FileNotFoundError(
                f"--model.init_from {folder}: {p.name} is missing; write the folder with python -m recipes.convert --out"
            )
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--model.init_from {folder}: convert.json is not valid JSON ({e.msg})") from None
    state = read_weights(weights_path, what="--model.init_from")
    # checked before loading: torch raises a multi-line RuntimeError on a shape mismatch even with strict=False
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, unexpected = [k for k in shapes if k not in state], [k for k in state if k not in shapes]
    hint = meta.get("rebuild_hint", "the architecture the weights were converted to")
    if missing or unexpected:
        raise ValueError(
            f"--model.init_from {folder}: the weights do not fit this model ({len(missing)} missing, e.g. "
            f"{missing[:2]}; {len(unexpected)} unexpected, e.g. {unexpected[:2]}); build {hint}"
        )
    bad = [k for k, v in state.items() if tuple(v.shape) != shapes[k]]
    if bad:
        raise ValueError(f"--model.init_from {folder}: {bad[0]} has shape {tuple(state[bad[0]].shape)}, "
                         f"the model's is {shapes[bad[0]]}; build {hint}")
    model.load_state_dict(state, strict=True)
    if meta.get("lambda_init") is not None:
        for m in model.modules():
            if isinstance(m, DiffAttention):
                m.lambda_init = float(meta["lambda_init"])
    return meta


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
