"""Load DiffCLIP checkpoints published with the paper into diffzoo's CLIP.

DiffCLIP (Hammoud & Ghanem, arXiv 2503.06626) was released as the module ``diff_clip.py`` of the
repository hammoudhasan/DiffCLIP: a ``DiffCLIP`` whose ``visual`` is a timm ViT with differential
blocks (``diff_attention.py``) and whose text transformer is OpenAI CLIP's with differential attention.
Its state_dict is laid out as::

    visual.cls_token, visual.pos_embed, visual.patch_embed.proj.{weight,bias}
    visual.blocks.<i>.{norm1,norm2}.{weight,bias}
    visual.blocks.<i>.attn.{q,k,v,out}_proj.{weight,bias}, attn.lambda_{q1,k1,q2,k2}, attn.diff_norm.weight
    visual.blocks.<i>.mlp.{fc1,fc2}.{weight,bias}   [visual.blocks.<i>.ls{1,2}.gamma with LayerScale]
    visual.norm.{weight,bias}
    image_projection                        (vision_width, embed_dim), used as x @ P
    token_embedding.weight, positional_embedding (context_length, width)
    transformer.resblocks.<i>.{ln_1,ln_2}.{weight,bias}
    transformer.resblocks.<i>.attn.{q,k,v,out}_proj.{weight,bias}, attn.lambda_*, attn.diff_norm.weight
    transformer.resblocks.<i>.mlp.{c_fc,c_proj}.{weight,bias}   (QuickGELU between them)
    ln_final.{weight,bias}, text_projection (width, embed_dim), logit_scale

q, k and v are separate projections there; a fused ``attn.in_proj_weight`` / ``in_proj_bias`` (the
layout of OpenAI / open_clip CLIP blocks) is also accepted and split into equal thirds (q, k, v).

Head layout: the published attention views q and k as ``(B, N, 2h, d)``, forms the maps of all ``2h``
heads and pairs maps ``(2i, 2i+1)`` as (A1, A2) of differential head ``i``; v is viewed as
``(B, N, h, 2d)``. diffzoo's :class:`~diffzoo.layers.DiffAttention` uses the same adjacent pairing and
the same value layout, so projection rows are copied unpermuted. Its per-head RMSNorm (eps 1e-5) is
diffzoo's ``sub_norm``; its LayerNorms use eps 1e-5, as diffzoo's CLIP configs.

    from diffzoo.weights import load_diffclip_checkpoint
    model = load_diffclip_checkpoint("diffclip_cc12m.pt")          # DiffCLIP-ViT-B-16
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .io import compare_state, read_weights, unwrap_state_dict

__all__ = ["convert_diffclip_state_dict", "load_diffclip_checkpoint", "load_diffclip_state"]

log = logging.getLogger(__name__)

_ATTN = r"attn\.(q_proj|k_proj|v_proj|out_proj)\.(weight|bias)|attn\.(lambda_q1|lambda_k1|lambda_q2|lambda_k2)"

# (published pattern, diffzoo replacement); the first match wins.
_RULES: list[tuple[re.Pattern, str]] = [
    (re.compile(p), r) for p, r in [
        # joint
        (r"^logit_scale$", "logit_scale"),
        (r"^logit_bias$", "logit_bias"),
        # image tower: the timm ViT goes under visual.trunk, the projection becomes visual.proj
        (r"^image_projection$", "visual.proj"),
        (r"^visual\.(cls_token|pos_embed)$", r"visual.trunk.\1"),
        (r"^visual\.patch_embed\.proj\.(weight|bias)$", r"visual.trunk.patch_embed.proj.\1"),
        (r"^visual\.norm\.(weight|bias)$", r"visual.trunk.norm.\1"),
        (r"^visual\.blocks\.(\d+)\.(norm1|norm2)\.(weight|bias)$", r"visual.trunk.blocks.\1.\2.\3"),
        (r"^visual\.blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)$", r"visual.trunk.blocks.\1.mlp.\2.\3"),
        (r"^visual\.blocks\.(\d+)\.(ls1|ls2)\.gamma$", r"visual.trunk.blocks.\1.\2.gamma"),
        (r"^visual\.blocks\.(\d+)\.attn\.diff_norm\.weight$", r"visual.trunk.blocks.\1.attn.sub_norm.weight"),
        (rf"^visual\.blocks\.(\d+)\.({_ATTN})$", r"visual.trunk.blocks.\1.\2"),
        # text tower
        (r"^token_embedding\.weight$", "text.token_embedding.weight"),
        (r"^positional_embedding$", "text.positional_embedding"),
        (r"^text_projection$", "text.text_projection"),
        (r"^ln_final\.(weight|bias)$", r"text.ln_final.\1"),
        (r"^transformer\.resblocks\.(\d+)\.ln_1\.(weight|bias)$", r"text.blocks.\1.norm1.\2"),
        (r"^transformer\.resblocks\.(\d+)\.ln_2\.(weight|bias)$", r"text.blocks.\1.norm2.\2"),
        (r"^transformer\.resblocks\.(\d+)\.mlp\.c_fc\.(weight|bias)$", r"text.blocks.\1.mlp.fc1.\2"),
        (r"^transformer\.resblocks\.(\d+)\.mlp\.c_proj\.(weight|bias)$", r"text.blocks.\1.mlp.fc2.\2"),
        (r"^transformer\.resblocks\.(\d+)\.attn\.diff_norm\.weight$", r"text.blocks.\1.attn.sub_norm.weight"),
        (rf"^transformer\.resblocks\.(\d+)\.({_ATTN})$", r"text.blocks.\1.\2"),
    ]
]
_FUSED = re.compile(r"^(visual\.blocks|transformer\.resblocks)\.(\d+)\.attn\.in_proj_(weight|bias)$")


def convert_diffclip_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename a published DiffCLIP state_dict to diffzoo's CLIP (``create_clip("DiffCLIP-ViT-B-16")``).

    Keys are mapped one to one (layout in the module docstring); fused ``attn.in_proj_*`` tensors are
    split into the q, k and v projections. Keys no rule knows are returned under their own names, so a
    strict ``load_state_dict`` reports them as unexpected.

    Args:
        state_dict: the published model's state_dict (wrappers removed, see :func:`unwrap_state_dict`).

    Returns:
        A new dict; the tensors are the input tensors (or row slices of the fused ones), not copies.
    """
    out: dict[str, Tensor] = {}

    def put(key: str, value: Tensor, source: str) -> None:
        if key in out:
            raise ValueError(f"two checkpoint entries map to {key!r} (the second is {source!r})")
        out[key] = value

    for key, value in unwrap_state_dict(state_dict).items():
        fused = _FUSED.match(key)
        if fused:
            tower, idx, kind = fused.groups()
            if value.shape[0] % 3:
                raise ValueError(f"{key} has {value.shape[0]} rows; a fused q/k/v projection needs a multiple of 3")
            prefix = f"visual.trunk.blocks.{idx}" if tower == "visual.blocks" else f"text.blocks.{idx}"
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                put(f"{prefix}.attn.{name}.{kind}", part, key)
            continue
        for pattern, replacement in _RULES:
            if pattern.match(key):
                put(pattern.sub(replacement, key), value, key)
                break
        else:
            put(key, value, key)
    return out


def _load_file(path: Path, map_location: Any) -> Mapping[str, Any]:
    return read_weights(path, map_location=map_location)  # tensors and plain values only; anything else refused


def load_diffclip_state(model: nn.Module, converted: Mapping[str, Tensor], strict: bool = True) -> tuple[list[str], list[str]]:
    """Copy converted tensors into ``model``; raise a ``ValueError`` naming every problem.

    Shape mismatches always raise; missing and unexpected keys raise when ``strict`` (else they are
    logged and returned as ``(missing, unexpected)``).
    """
    own = model.state_dict()
    missing, unexpected, wrong = compare_state(model, converted)
    mismatched = [f"{k}: checkpoint {tuple(converted[k].shape)} vs model {tuple(own[k].shape)}" for k in wrong]
    missing, unexpected = sorted(missing), sorted(unexpected)
    problems = []
    if mismatched:
        problems.append(f"shape mismatches ({len(mismatched)}): {mismatched}")
    if strict and missing:
        problems.append(f"missing keys ({len(missing)}): {missing}")
    if strict and unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {unexpected}")
    if problems:
        raise ValueError(
            "the DiffCLIP checkpoint does not fit the model; " + "; ".join(problems)
            + " (check the model name / config overrides, or pass strict=False to load what matches)"
        )
    if missing or unexpected:
        log.warning("loaded with strict=False: missing %s, unexpected %s", missing, unexpected)
    model.load_state_dict({k: v for k, v in converted.items() if k in own}, strict=False)
    return missing, unexpected


def load_diffclip_checkpoint(
    path: str | Path,
    model_name: str = "DiffCLIP-ViT-B-16",
    *,
    model: nn.Module | None = None,
    strict: bool = True,
    map_location: str | torch.device = "cpu",
    **overrides: Any,
):
    """Load a published DiffCLIP checkpoint into a diffzoo CLIP.

    Args:
        path: ``.pt`` / ``.pth`` (``torch.save``) or ``.safetensors`` file; training wrappers
            (``state_dict``, ``model``, ``module.`` prefixes) are removed.
        model_name: the diffzoo CLIP config to build (ignored when ``model`` is given).
        model: load into this model instead of building one.
        strict: raise on missing or unexpected keys (shape mismatches always raise).
        map_location: where ``torch.load`` puts the tensors.
        overrides: config overrides for :func:`diffzoo.models.clip.create_clip`.

    Returns:
        The model (open_clip ``CustomTextCLIP``) with the checkpoint's weights, in eval mode.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    converted = convert_diffclip_state_dict(_load_file(path, map_location))
    if model is None:
        from ..models.clip import create_clip

        model = create_clip(model_name, **overrides)
    load_diffclip_state(model, converted, strict=strict)
    return model.eval()
