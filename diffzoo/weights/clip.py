"""Load open_clip models (diffzoo's DiffCLIP configs or any open_clip config) and their weights.

:func:`load_clip` builds a model by name and loads a checkpoint into it; :func:`load_clip_weights` reads
every checkpoint format diffzoo writes or meets (a diffzoo Lightning checkpoint, an open_clip training
checkpoint, a plain state dict, safetensors) through :func:`diffzoo.weights.io.read_state_dict`.
Importing this module registers diffzoo's CLIP configs with open_clip.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models import clip as _clip_family  # noqa: F401  (registers diffzoo's CLIP configs with open_clip)
from .export import safetensors_metadata
from .io import compare_state, read_state_dict, read_weights

PathLike = str | os.PathLike

__all__ = ["check_model_name", "checkpoint_model_name", "load_clip", "load_clip_weights"]


def check_model_name(name: str) -> None:
    """Raise ``ValueError`` (with close matches) unless ``name`` is a registered open_clip model config."""
    import open_clip

    if name.startswith(("hf-hub:", "local-dir:")) or open_clip.get_model_config(name) is not None:
        return
    close = difflib.get_close_matches(name, open_clip.list_models(), n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see open_clip.list_models()"
    raise ValueError(f"unknown open_clip model {name!r}{hint}")


def load_clip(
    model: str,
    pretrained: str | None = None,
    checkpoint: PathLike | None = None,
    device: str | torch.device = "cpu",
    **model_kwargs: Any,
) -> tuple[nn.Module, Callable, Callable]:
    """Build an open_clip model by name: ``(model, preprocess, tokenizer)`` with ``preprocess`` for evaluation.

    Args:
        model: open_clip model name (``DiffCLIP-ViT-B-16``, ``ViT-B-16``, ...).
        pretrained: open_clip pretrained tag or weight file, passed to open_clip.
        checkpoint: a diffzoo Lightning checkpoint, open_clip checkpoint, state dict or safetensors file
            loaded after creation (:func:`load_clip_weights`).
        device: where the model goes.
        model_kwargs: more ``open_clip.create_model_and_transforms`` arguments (default: those stored in an
            exported ``checkpoint``'s metadata).
    """
    import open_clip

    check_model_name(model)
    if checkpoint is not None and not model_kwargs and str(checkpoint).endswith(".safetensors"):
        if "model_args" in safetensors_metadata(checkpoint):  # an export: built as it was trained (e.g. its attn)
            from .export import read_metadata

            model_kwargs = read_metadata(checkpoint)[1]
    net, _, preprocess = open_clip.create_model_and_transforms(model, pretrained=pretrained, **model_kwargs)
    if checkpoint is not None:
        load_clip_weights(net, checkpoint)
    return net.to(device).eval(), preprocess, open_clip.get_tokenizer(model)


def checkpoint_model_name(path: PathLike) -> str | None:
    """The open_clip model name stored in a diffzoo checkpoint (Lightning hparams or safetensors metadata)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return safetensors_metadata(path).get("model")  # None without diffzoo metadata; raises for other files
    ckpt = read_weights(path, what="checkpoint")  # tensors and plain values only; never runs code from the file
    return (ckpt.get("hyper_parameters") or {}).get("model") if isinstance(ckpt, dict) else None


def load_clip_weights(model: nn.Module, path: PathLike, strict: bool = True) -> None:
    """Load weights into an open_clip ``model`` from a diffzoo Lightning checkpoint (``model.*`` keys of
    :class:`~diffzoo.tasks.contrastive.ContrastiveTask`), an open_clip training checkpoint (``state_dict``,
    ``module.`` prefixes), a plain state dict or a ``.safetensors`` file.

    Raises ``ValueError`` naming the file and the first missing / unexpected keys on a mismatch.
    """
    path = Path(path)
    state = read_state_dict(path, what="checkpoint")
    wrong = compare_state(model, state)[2]
    if wrong:
        raise ValueError(f"{path} does not fit the model: {wrong[0]} has shape {tuple(state[wrong[0]].shape)}, the "
                         f"model's is {tuple(model.state_dict()[wrong[0]].shape)} ({len(wrong)} shape mismatch(es))")
    result = model.load_state_dict(state, strict=False)
    if strict and (result.missing_keys or result.unexpected_keys):
        raise ValueError(
            f"{path} does not fit the model: {len(result.missing_keys)} missing key(s) "
            f"{result.missing_keys[:3]}, {len(result.unexpected_keys)} unexpected key(s) {result.unexpected_keys[:3]}"
        )
