"""Differential Vision Transformers and their matched softmax baselines, registered with timm.

Every model is timm's own :class:`timm.models.vision_transformer.VisionTransformer` (Dosovitskiy et al.,
arXiv 2010.11929; Touvron et al., arXiv 2012.12877). The differential models pass diffzoo's attention
into it through timm's ``attn_layer=`` argument: :class:`TimmDiffAttention` is
:class:`diffzoo.layers.DiffAttention` (Ye et al., "Differential Transformer", ICLR 2025, arXiv
2410.05258) behind timm's attention constructor and ``forward``, and :class:`TimmDiffAttentionV2` does
the same for :class:`diffzoo.layers.DiffAttentionV2`. The softmax baselines are timm's ViT with timm's
own ``Attention``, i.e. timm's ``vit_*`` at the same size. So timm's whole ViT API applies to both:
``forward_features`` / ``forward_head``, ``forward_intermediates``, ``features_only=True``,
``prune_intermediate_layers``, ``dynamic_img_size``, ``global_pool`` (``token``, ``avg``, ``map``, ...),
``set_grad_checkpointing``, FX feature extraction, TorchScript and timm's checkpoint key names.

After ``import diffzoo`` the models are in timm's registry::

    import diffzoo, timm
    model = timm.create_model("diffvit_small_patch16_224", num_classes=100, drop_path_rate=0.1)
    baseline = timm.create_model("softvit_small_patch16_224", num_classes=100, drop_path_rate=0.1)

Names: ``diffvit_*`` (differential) and ``softvit_*`` (softmax baseline with identical dimensions;
parameter counts agree within 0.5 %). ``diffvit_*`` avoids timm's existing ``vit_d*`` names. Extra
keyword arguments of the registered builders: ``attn`` (``"diff"``, ``"diff_v2"`` or ``"softmax"``),
``lambda_init`` (a constant instead of the depth schedule) and ``backend`` (diffzoo kernel backend);
every other keyword goes to timm's ``VisionTransformer``.

Head layout: ``num_heads`` is always the *softmax baseline's* head count. Differential V1 turns an even
count ``2H`` into ``H`` differential heads of the same width (``dim / 2H`` per query/key branch, value
width ``dim / H``), so every projection has the baseline's shape; an odd count keeps its heads and halves
their width (timm's ``DiffAttention`` convention), see :func:`diffzoo.layers.diff_heads_for_baseline`.

Weights saved as safetensors (or a Lightning checkpoint) reload through timm, also those written by
earlier diffzoo versions whose softmax layers had separate q/k/v projections (:func:`checkpoint_filter_fn`)::

    timm.create_model("diffvit_nano_patch7_28", pretrained=True, num_classes=10,
                      pretrained_cfg_overlay=dict(file="outputs/.../model.safetensors", num_classes=10))
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.layers import Attention as TimmAttention
from timm.layers import LayerNorm, register_notrace_module, trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer
from timm.models.vision_transformer import checkpoint_filter_fn as _timm_checkpoint_filter_fn
from torch import Tensor, nn

from ..layers import DiffAttention, DiffAttentionV2, diff_heads_for_baseline, lambda_init_schedule
from ..layers.attention import AttentionBase

__all__ = [
    "TimmDiffAttention",
    "TimmDiffAttentionV2",
    "VIT_CONFIGS",
    "VisionTransformer",
    "attention_layer",
    "checkpoint_filter_fn",
    "diff_head_layout",
    "set_lambda_init",
    "vision_transformer",
]

AttnKind = Literal["diff", "diff_v2", "softmax"]


def vit_init_(model: nn.Module, pos_embed: nn.Parameter | None, cls_token: nn.Parameter | None) -> None:
    """timm's ViT init in place: truncated normal (std 0.02) for every linear and the position
    embedding, zero biases, a near-zero class token. Other parameters keep their own init."""
    if pos_embed is not None:
        trunc_normal_(pos_embed, std=0.02)
    if cls_token is not None:
        nn.init.normal_(cls_token, std=1e-6)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _refuse_timm_only_options(qk_norm: bool, scale_norm: bool) -> None:
    if qk_norm or scale_norm:
        name = "qk_norm" if qk_norm else "scale_attn_norm"
        raise ValueError(
            f"{name}=True is a timm Attention option that diffzoo's differential attention does not implement; "
            "leave it False (differential V1 already normalises each head's output)"
        )


def diff_head_layout(dim: int, num_heads: int) -> tuple[int, int, int]:
    """Differential V1 ``(heads, kv_heads, head_dim)`` for a softmax baseline of ``num_heads`` heads.

    An even count ``2H`` gives ``H`` heads of the baseline's width; an odd count keeps its heads at half
    width (``dim // (2 * num_heads)``). Either way the projections have the baseline's shapes.
    """
    return diff_heads_for_baseline(dim, num_heads, head_dim=None if num_heads % 2 == 0 else dim // (2 * num_heads))


class _TimmForward:
    """timm's attention ``forward(x, attn_mask=None, is_causal=False)`` over a diffzoo attention layer.

    Eager calls, ``torch.compile``, ``torch.export`` and ``torch.fx.symbolic_trace`` go through
    :meth:`diffzoo.layers.AttentionBase.forward`, i.e. diffzoo's kernel backends (recorded as single calls
    in a traced graph) and the ``_attend`` seam of :mod:`diffzoo.analysis`. TorchScript cannot follow the
    backend selection (Python control flow at call time), so a scripted ViT runs :meth:`_forward_graph`:
    the same math from ``F.scaled_dot_product_attention`` calls, equal to the eager result up to
    floating-point rounding. (diffzoo's own layers refuse ``torch.jit.script``; these timm adapters
    script because timm's ViT API promises it.)

    ``attn_mask`` follows timm: bool (True = attend) or additive float, broadcastable to
    ``(B, heads, N, N)``; give masks a head dimension of 1, since the differential layer has fewer
    heads than the baseline's ``num_heads``.
    """

    __jit_unused_properties__ = ["proj"]

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        depth: int = 0,
        lambda_init: float | None = None,
        backend: str | None = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        _refuse_timm_only_options(qk_norm, scale_norm)
        self._init_layer(
            dim, num_heads, depth, lambda_init, qkv_bias=qkv_bias, proj_bias=proj_bias, attn_drop=attn_drop,
            proj_drop=proj_drop, backend=backend,
        )
        self.baseline_heads = num_heads
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    @property
    def proj(self) -> nn.Linear:
        """timm's name of the output projection (``VisionTransformer(fix_init=True)`` rescales it)."""
        return self.out_proj

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """``x (B, N, dim)`` -> ``(B, N, dim)``."""
        if torch.jit.is_scripting():
            return self._forward_graph(x, attn_mask, is_causal)
        return self._forward_kernels(x, attn_mask, is_causal)

    @torch.jit.unused
    def __prepare_scriptable__(self) -> nn.Module:
        return self  # scripted through _forward_graph (see the class docstring)

    @torch.jit.unused
    def _forward_kernels(self, x: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        return AttentionBase.forward(self, x, attn_mask=attn_mask, causal=is_causal)

    def reset_parameters(self) -> None:
        """Re-draw the parameters that are not in a child ``nn.Linear`` (timm's ``init_weights`` calls
        this after it initialised the projections)."""
        self._reset_extra()


class TimmDiffAttention(_TimmForward, DiffAttention):
    """:class:`diffzoo.layers.DiffAttention` (V1) with timm's attention constructor, for ``attn_layer=``.

    Args:
        dim: model width.
        num_heads: heads of the softmax baseline (converted as described in the module docstring).
        qkv_bias, proj_bias, attn_drop, proj_drop: as timm's ``Attention``.
        qk_norm, scale_norm: must be False (timm options diffzoo's attention does not have).
        norm_layer: accepted for timm's signature; unused.
        depth: 0-based block index; sets ``lambda_init`` by the paper's schedule unless
            ``lambda_init`` is given. timm's ``Block`` does not pass it to non-timm layers, so
            :func:`vision_transformer` sets it afterwards with :func:`set_lambda_init`.
        lambda_init: constant ``lambda_init`` (DiffCLIP: 0.8).
        backend: diffzoo kernel backend of this layer (None follows :mod:`diffzoo.kernels`).
    """

    def _init_layer(self, dim: int, num_heads: int, depth: int, lambda_init: float | None, **kwargs: Any) -> None:
        heads, kv_heads, head_dim = diff_head_layout(dim, num_heads)
        DiffAttention.__init__(self, dim, heads, kv_heads, head_dim, lambda_init=lambda_init, depth=depth, **kwargs)

    def _reset_extra(self) -> None:
        self.reset_lambda()
        nn.init.ones_(self.sub_norm.weight)

    def _forward_graph(self, x: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        B, N, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(B, N, 2 * H, d).transpose(1, 2)  # heads (2i, 2i+1) = (q1, q2) of head i
        k = self.k_proj(x).view(B, N, 2 * H, d).transpose(1, 2)
        v = self.v_proj(x).view(B, N, H, 2 * d).transpose(1, 2).repeat_interleave(2, dim=1)  # (B, 2H, N, 2d)
        p = self.attn_drop if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
        lam = self.lambda_full().to(a.dtype)
        o = a[:, 0::2] - lam * a[:, 1::2]  # (B, H, N, 2d)
        o = self.sub_norm(o) * (1.0 - self.lambda_init)
        return self.proj_drop(self.out_proj(o.transpose(1, 2).reshape(B, N, H * 2 * d)))


class TimmDiffAttentionV2(_TimmForward, DiffAttentionV2):
    """:class:`diffzoo.layers.DiffAttentionV2` with timm's attention constructor, for ``attn_layer=``.

    ``num_heads`` (the baseline's) is V2's output head count; ``2 * num_heads`` query heads are
    computed. Arguments as :class:`TimmDiffAttention`; ``depth`` is unused and ``lambda_init`` must
    stay None (V2 predicts lambda per token).
    """

    def _init_layer(self, dim: int, num_heads: int, depth: int, lambda_init: float | None, **kwargs: Any) -> None:
        if lambda_init is not None:
            raise ValueError("lambda_init does not apply to attn='diff_v2' (V2 predicts lambda per token)")
        DiffAttentionV2.__init__(self, dim, num_heads, **kwargs)

    def _reset_extra(self) -> None:
        pass  # lambda_proj is an nn.Linear: timm's init covers it

    def _forward_graph(self, x: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        B, N, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(B, N, 2 * H, d).transpose(1, 2)  # query pairs (2i, 2i+1) share kv head i
        k = self.k_proj(x).view(B, N, H, d).transpose(1, 2).repeat_interleave(2, dim=1)
        v = self.v_proj(x).view(B, N, H, d).transpose(1, 2).repeat_interleave(2, dim=1)
        p = self.attn_drop if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
        lam = torch.sigmoid(self.lambda_proj(x).float()).transpose(1, 2).unsqueeze(-1)  # (B, H, N, 1)
        o = (a[:, 0::2].float() - lam * a[:, 1::2].float()).to(a.dtype)  # (B, H, N, d)
        return self.proj_drop(self.out_proj(o.transpose(1, 2).reshape(B, N, H * d)))


# timm's FX tools keep these layers whole, so traced models call the eager kernels (identical outputs).
register_notrace_module(TimmDiffAttention)
register_notrace_module(TimmDiffAttentionV2)

_ATTN_LAYERS: dict[str, type[nn.Module]] = {
    "diff": TimmDiffAttention, "diff_v2": TimmDiffAttentionV2, "softmax": TimmAttention,
}


def attention_layer(attn: AttnKind) -> type[nn.Module]:
    """The ``attn_layer`` class for timm's ViT: ``"diff"``, ``"diff_v2"`` or ``"softmax"`` (timm's own)."""
    if attn not in _ATTN_LAYERS:
        raise ValueError(f"attn={attn!r}; expected one of {sorted(_ATTN_LAYERS)}")
    return _ATTN_LAYERS[attn]


_BLOCK_ATTN = re.compile(r"(?:^|\.)blocks\.(\d+)\.attn$")


def set_lambda_init(model: nn.Module, lambda_init: float | None = None) -> int:
    """Set every differential V1 layer's ``lambda_init``: the constant, or the depth schedule by block index.

    The block index comes from the module name (``blocks.<i>.attn``, also inside timm's feature
    wrappers); layers elsewhere count in model order. Returns the number of layers set.
    """
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, TimmDiffAttention)]
    for order, (name, m) in enumerate(layers):
        match = _BLOCK_ATTN.search(name)
        m.depth = int(match.group(1)) if match else order
        m.lambda_init = lambda_init_schedule(m.depth) if lambda_init is None else float(lambda_init)
    return len(layers)


def vision_transformer(
    attn: AttnKind = "diff", *, lambda_init: float | None = None, backend: str | None = None, **kwargs: Any
) -> VisionTransformer:
    """timm's ``VisionTransformer`` with diffzoo attention (``attn="diff"``/``"diff_v2"``) or timm's own.

    Args:
        attn: ``"diff"`` (V1), ``"diff_v2"`` or ``"softmax"`` (timm's ``Attention``: timm's ViT as is).
        lambda_init: constant ``lambda_init`` of V1 layers; None uses the depth schedule.
        backend: diffzoo kernel backend of the differential layers.
        kwargs: timm ``VisionTransformer`` arguments (``num_heads`` is the baseline's head count).
    """
    layer = attention_layer(attn)
    if attn == "softmax" and (lambda_init is not None or backend is not None):
        raise ValueError(
            "lambda_init and backend configure differential attention; the softmax baseline is timm's own "
            "Attention (drop them, or use attn='diff')"
        )
    if attn == "diff_v2" and lambda_init is not None:
        raise ValueError("lambda_init does not apply to attn='diff_v2' (V2 predicts lambda per token)")
    model = VisionTransformer(attn_layer=layer, **kwargs)
    if attn != "softmax":
        set_lambda_init(model, lambda_init)
        for m in model.modules():
            if isinstance(m, _TimmForward):
                m.backend = backend
    return model


# -- checkpoints ----------------------------------------------------------------------------------
_OLD_SOFTMAX = re.compile(r"^(.*\.attn)\.(q_proj|k_proj|v_proj|out_proj)\.(weight|bias)$")


def _fuse_old_softmax_attention(state_dict: dict[str, Tensor], own: set[str]) -> dict[str, Tensor]:
    """Earlier diffzoo softmax layers kept q/k/v/out projections apart; timm fuses q/k/v into ``qkv``."""
    out: dict[str, Tensor] = {}
    parts: dict[tuple[str, str], dict[str, Tensor]] = {}
    for key, value in state_dict.items():
        m = _OLD_SOFTMAX.match(key)
        if m is None or f"{m.group(1)}.qkv.weight" not in own:
            out[key] = value
            continue
        prefix, proj, kind = m.groups()
        if proj == "out_proj":
            out[f"{prefix}.proj.{kind}"] = value
        else:
            parts.setdefault((prefix, kind), {})[proj] = value
    for (prefix, kind), qkv in parts.items():
        missing = {"q_proj", "k_proj", "v_proj"} - set(qkv)
        if missing:
            raise ValueError(f"the checkpoint has {sorted(qkv)} of {prefix} but not {sorted(missing)}")
        out[f"{prefix}.qkv.{kind}"] = torch.cat([qkv["q_proj"], qkv["k_proj"], qkv["v_proj"]], dim=0)
    return out


def checkpoint_filter_fn(state_dict: dict[str, Any], model: VisionTransformer) -> dict[str, Tensor]:
    """Adapt a saved state dict to ``model``.

    Accepts a plain ``state_dict`` (safetensors or ``torch.save``), a dict with ``"state_dict"`` /
    ``"model"``, or a Lightning checkpoint of :class:`diffzoo.tasks.ImageClassificationTask` (keys under
    ``model.``; the ``ema.`` copy is dropped). Softmax layers saved by earlier diffzoo versions
    (``attn.{q,k,v,out}_proj``) become timm's ``attn.qkv`` / ``attn.proj``; then timm's own filter
    resamples position and patch embeddings and converts timm-known foreign layouts.
    """
    state_dict = state_dict.get("state_dict", state_dict.get("model", state_dict))
    if any(k.startswith("model.") for k in state_dict):
        state_dict = {k[len("model."):]: v for k, v in state_dict.items() if k.startswith("model.")}
    state_dict = _fuse_old_softmax_attention(dict(state_dict), set(model.state_dict()))
    return _timm_checkpoint_filter_fn(state_dict, model)


# -- registry ---------------------------------------------------------------------------------------
def _cfg(**kwargs: Any) -> dict[str, Any]:
    """timm pretrained config: preprocessing of ImageNet-1k models (DeiT's mean/std, bicubic)."""
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "fixed_input_size": True,
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        **kwargs,
    }


_MNIST = dict(num_classes=10, input_size=(1, 28, 28), crop_pct=1.0, interpolation="bilinear", mean=(0.1307,), std=(0.3081,))
_CIFAR = dict(num_classes=10, input_size=(3, 32, 32), crop_pct=1.0, interpolation="bilinear",
              mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616))

# Architecture of every registered size (timm ``VisionTransformer`` arguments); ``diffvit_`` and
# ``softvit_`` differ only in the attention layer.
VIT_CONFIGS: dict[str, dict[str, Any]] = {
    # The embedded default (28x28 grey digits): 16 patches + class token, about 0.3 M parameters,
    # small enough to train in a few minutes on 2 CPU cores.
    "nano_patch7_28": dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=96, depth=4,
                           num_heads=4, mlp_ratio=2.0),
    # CIFAR-sized inputs with ViT-Ti dimensions (3 baseline heads -> 3 half-width differential heads).
    "tiny_patch4_32": dict(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=12, num_heads=3),
    "tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
}

_PRETRAINED = {
    "nano_patch7_28": _cfg(**_MNIST),
    "tiny_patch4_32": _cfg(**_CIFAR),
    "tiny_patch16_224": _cfg(),
    "small_patch16_224": _cfg(),
    "base_patch16_224": _cfg(),
}

default_cfgs = generate_default_cfgs(
    {f"{prefix}_{size}": cfg for size, cfg in _PRETRAINED.items() for prefix in ("diffvit", "softvit")}
)

# Argument names of earlier diffzoo ViTs, mapped onto timm's.
_RENAMED = {"layer_scale_init": "init_values"}


def _create(variant: str, pretrained: bool, **kwargs: Any) -> VisionTransformer:
    prefix, size = variant.split("_", 1)
    kwargs.setdefault("attn", "diff" if prefix == "diffvit" else "softmax")
    if "head_dim" in kwargs:
        raise ValueError(
            "head_dim is derived from num_heads (the softmax baseline's heads); pass num_heads and embed_dim instead"
        )
    for old, new in _RENAMED.items():
        if old in kwargs:
            kwargs[new] = kwargs.pop(old)
    if "norm_eps" in kwargs:
        kwargs["norm_layer"] = partial(LayerNorm, eps=kwargs.pop("norm_eps"))
    out_indices = kwargs.pop("out_indices", 3)
    arch = {**VIT_CONFIGS[size], **kwargs}
    # features_only=True wraps the model as timm's vit_* are wrapped: FeatureGetterNet over forward_intermediates
    return build_model_with_cfg(
        vision_transformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **arch,
    )


# -- differential ---------------------------------------------------------------------------------
@register_model
def diffvit_nano_patch7_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT for 28x28 single-channel digits (D=96, 4 blocks, 2 differential heads of width 24)."""
    return _create("diffvit_nano_patch7_28", pretrained, **kwargs)


@register_model
def diffvit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-Ti for 32x32 images (D=192, 12 blocks, 3 differential heads of width 32)."""
    return _create("diffvit_tiny_patch4_32", pretrained, **kwargs)


@register_model
def diffvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-Ti/16 (D=192, 12 blocks, 3 differential heads of width 32)."""
    return _create("diffvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def diffvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-S/16 (D=384, 12 blocks, 3 differential heads of width 64)."""
    return _create("diffvit_small_patch16_224", pretrained, **kwargs)


@register_model
def diffvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Differential ViT-B/16 (D=768, 12 blocks, 6 differential heads of width 64)."""
    return _create("diffvit_base_patch16_224", pretrained, **kwargs)


# -- softmax baselines ----------------------------------------------------------------------------
@register_model
def softvit_nano_patch7_28(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax baseline of :func:`diffvit_nano_patch7_28` (4 heads of width 24)."""
    return _create("softvit_nano_patch7_28", pretrained, **kwargs)


@register_model
def softvit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax baseline of :func:`diffvit_tiny_patch4_32` (3 heads of width 64)."""
    return _create("softvit_tiny_patch4_32", pretrained, **kwargs)


@register_model
def softvit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-Ti/16 (timm's ``vit_tiny_patch16_224``), baseline of :func:`diffvit_tiny_patch16_224`."""
    return _create("softvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def softvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-S/16 (timm's ``vit_small_patch16_224``), baseline of :func:`diffvit_small_patch16_224`."""
    return _create("softvit_small_patch16_224", pretrained, **kwargs)


@register_model
def softvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """Softmax ViT-B/16 (timm's ``vit_base_patch16_224``), baseline of :func:`diffvit_base_patch16_224`."""
    return _create("softvit_base_patch16_224", pretrained, **kwargs)


def model_names(prefix: str | None = None) -> list[str]:
    """Registered diffzoo ViT names, optionally only ``"diffvit"`` or ``"softvit"``."""
    prefixes = (prefix,) if prefix else ("diffvit", "softvit")
    return [f"{p}_{size}" for p in prefixes for size in VIT_CONFIGS]


def matched_name(name: str) -> str:
    """The matched partner of a registered name: ``diffvit_x`` <-> ``softvit_x``."""
    prefix, size = name.split("_", 1)
    if size not in VIT_CONFIGS or prefix not in ("diffvit", "softvit"):
        raise ValueError(f"{name!r} is not a diffzoo ViT; expected one of {model_names()}")
    return f"{'softvit' if prefix == 'diffvit' else 'diffvit'}_{size}"
