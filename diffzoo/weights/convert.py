"""Convert pretrained softmax-attention models to differential attention.

Differential attention V2 (:class:`diffzoo.layers.DiffAttentionV2`) runs one attention over ``2H``
query heads and returns, per output head ``i``, ``a_{2i} - sigmoid(x W_lam)_i * a_{2i+1}``. A softmax
attention with ``H`` heads is reproduced *exactly* by

* query heads ``2i`` and ``2i+1`` both equal to the source head ``i`` (keys and values unchanged, so a
  grouped-query layout is kept: query pair ``(2i, 2i+1)`` falls into key/value group ``i // G`` exactly
  as source head ``i`` does),
* ``W_lam = 0``, so ``lambda = sigmoid(0) = 1/2`` for every token and head, hence
  ``a_{2i} - a_{2i+1} / 2 = a_i / 2``,
* the output projection's weight doubled (bias unchanged).

Scaling by 2 and 1/2 is exact in binary floating point and both query copies go through the same
kernel, so the converted layer computes the source function up to the rounding of the attention
kernels themselves.

Differential attention V1 (:class:`diffzoo.layers.DiffAttention`) cannot be exact: each head sums
``softmax(q1 k1) - lambda softmax(q2 k2)`` over one value of width ``2d`` and normalises the result
per head (RMSNorm). :func:`softmax_to_v1_state` starts from the closest layout there is: every
projection keeps the source weights (the first branch of each differential head is a source head; its
value is the two source value heads of that pair), ``lambda`` is fixed at ``lambda_init`` (0 by default)
with four equal lambda vectors (so ``exp(q1.k1) - exp(q2.k2) = 0`` while their gradients are not
zero), and :func:`calibrate_sub_norms` sets the per-head RMSNorm weight to the least-squares scale that
maps the normalised output back onto the un-normalised one on calibration inputs.

Also here: loading weights written by Microsoft's reference code (unilm ``Diff-Transformer``),
whose rotary embedding rotates interleaved channel pairs ``(2j, 2j+1)`` where diffzoo rotates
``(j, j + d/2)`` (:func:`unilm_state_dict_to_diffzoo`).

A conversion is saved as a folder (:func:`save_converted`: ``model.safetensors`` and ``convert.json``, how
to rebuild); :func:`read_converted` is the one reader of that folder, behind :func:`load_converted` (rebuild
the converted model) and :func:`load_init_from` (load the weights into a model a task built).

Only torch and :mod:`diffzoo.layers` are imported with this module; timm, open_clip and transformers
are imported inside the functions that need them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..hosts.open_clip import OpenClipDiffAttention, OpenClipDiffAttentionV2
from ..layers.attention import Attention
from ..layers.diff_attention import DiffAttention, DiffAttentionV2
from ..layers.spec import VARIANTS, AttnSpec, get_spec

__all__ = [
    "ATTN_KINDS",
    "OpenClipDiffAttention",
    "OpenClipDiffAttentionV2",
    "SoftmaxWeights",
    "build_converted",
    "calibrate_sub_norms",
    "conversion_spec",
    "converted_lambda_init",
    "convert_lm",
    "convert_open_clip",
    "convert_timm_vit",
    "from_hf_llama",
    "interleaved_to_rotate_half",
    "load_converted",
    "load_init_from",
    "load_v1",
    "load_v2",
    "read_converted",
    "save_converted",
    "softmax_to_v1_state",
    "softmax_to_v2_state",
    "unilm_state_dict_to_diffzoo",
    "weights_from_diffzoo",
    "weights_from_mha",
    "weights_from_timm",
]

# the attention specs a softmax model converts to: the differential ones that keep the source's shape
ATTN_KINDS = tuple(n for n, s in VARIANTS.items() if s.differential and s.head_scale == 1.0 and not s.match_params)


def conversion_spec(attn: str | AttnSpec, lambda_init: float | None = None) -> AttnSpec:
    """The attention spec ``attn`` a conversion builds: a differential spec that keeps the source's head layout
    and feed-forward (one of :data:`ATTN_KINDS`). V1 gets a constant ``lambda_init``: the one given, else the
    spec's own constant (``diff_const``: 0.8), else 0.0; V2 has none."""
    name = attn.name if isinstance(attn, AttnSpec) else attn
    if name not in ATTN_KINDS:
        raise ValueError(f"attn={name!r}; a softmax model converts to one of {list(ATTN_KINDS)} "
                         "(a conversion keeps the source's heads and feed-forward)")
    spec = get_spec(attn)
    if spec.kind != "diff":
        return spec
    if lambda_init is None:
        lambda_init = 0.0 if spec.lambda_init is None else spec.lambda_init
    return spec.with_lambda_init(lambda_init)


# -- one attention layer ---------------------------------------------------------------------------
@dataclass
class SoftmaxWeights:
    """The weights of one softmax attention: ``H`` query heads over ``H_kv`` key/value heads of width ``d``.

    Row ``h * d + c`` of ``q_weight`` is channel ``c`` of query head ``h`` (likewise keys and values);
    column ``h * d + c`` of ``o_weight`` reads channel ``c`` of head ``h``'s output.
    """

    q_weight: Tensor
    k_weight: Tensor
    v_weight: Tensor
    o_weight: Tensor
    q_bias: Tensor | None
    k_bias: Tensor | None
    v_bias: Tensor | None
    o_bias: Tensor | None
    num_heads: int
    num_kv_heads: int

    def __post_init__(self) -> None:
        H, Hkv = self.num_heads, self.num_kv_heads
        if H < 1 or Hkv < 1 or H % Hkv:
            raise ValueError(f"num_heads={H} must be a positive multiple of num_kv_heads={Hkv}")
        if self.q_weight.shape[0] % H:
            raise ValueError(f"q_weight has {self.q_weight.shape[0]} rows, not a multiple of num_heads={H}")
        d = self.head_dim
        for name, rows in (("k_weight", Hkv * d), ("v_weight", Hkv * d)):
            if getattr(self, name).shape[0] != rows:
                raise ValueError(f"{name} has {getattr(self, name).shape[0]} rows; expected num_kv_heads * head_dim = {rows}")
        if self.o_weight.shape[1] != H * d:
            raise ValueError(f"o_weight has {self.o_weight.shape[1]} columns; expected num_heads * head_dim = {H * d}")

    @property
    def head_dim(self) -> int:
        """Width ``d`` of one head."""
        return self.q_weight.shape[0] // self.num_heads


def _per_head(t: Tensor, heads: int) -> Tensor:
    """Rows of ``t`` grouped by head: ``(heads, d, *rest)``."""
    return t.reshape(heads, t.shape[0] // heads, *t.shape[1:])


def softmax_to_v2_state(w: SoftmaxWeights, lambda_bias: bool = False) -> dict[str, Tensor]:
    """State dict of a :class:`DiffAttentionV2` that computes exactly the softmax attention ``w``.

    Query heads ``2i`` and ``2i+1`` are copies of source head ``i``; ``lambda_proj`` is zero, so
    ``lambda = sigmoid(0) = 1/2`` and the layer returns half of each source head's output, which the
    doubled output projection restores.
    """
    H = w.num_heads
    dim_in = w.q_weight.shape[1]

    def twice(t: Tensor) -> Tensor:
        return _per_head(t, H).repeat_interleave(2, dim=0).reshape(2 * t.shape[0], *t.shape[1:])

    state = {
        "q_proj.weight": twice(w.q_weight),
        "k_proj.weight": w.k_weight.clone(),
        "v_proj.weight": w.v_weight.clone(),
        "out_proj.weight": w.o_weight * 2,
        "lambda_proj.weight": w.q_weight.new_zeros(H, dim_in),
    }
    for name, b in (("q_proj", w.q_bias), ("k_proj", w.k_bias), ("v_proj", w.v_bias), ("out_proj", w.o_bias)):
        if b is not None:
            state[f"{name}.bias"] = twice(b) if name == "q_proj" else b.clone()
    if lambda_bias:
        state["lambda_proj.bias"] = w.q_weight.new_zeros(H)
    return state


def _v1_head_order(num_heads: int, num_kv_heads: int) -> list[int]:
    """Source head feeding query head ``2i + b`` of a V1 layer with ``H/2`` heads over ``H_kv/2`` groups.

    V1 head ``i = g G + j`` (``G = H / H_kv``) reads key head ``2g + b`` in branch ``b``; the source
    heads that read source key head ``2g + b`` are ``(2g + b) G + j``.
    """
    G = num_heads // num_kv_heads
    order = []
    for i in range(num_heads // 2):
        g, j = divmod(i, G)
        order += [(2 * g) * G + j, (2 * g + 1) * G + j]
    return order


def softmax_to_v1_state(
    w: SoftmaxWeights, layer: DiffAttention, lambda_std: float = 0.1, generator: torch.Generator | None = None
) -> dict[str, Tensor]:
    """State dict of the V1 ``layer`` initialised from the softmax attention ``w`` (not exact).

    With the paper's head layout (``H/2`` differential heads of the source width ``d``) branch ``b`` of
    head ``i`` is a source head that reads the same key head, the value of group ``g`` is source
    value heads ``(2g, 2g+1)`` and the output projection's columns follow the query heads. With the
    half-width layout (odd source head counts: ``H`` heads of width ``d/2``) the projections are copied
    as they are. The four lambda vectors are one random draw (std ``lambda_std``), so
    ``lambda = lambda_init`` exactly; the sub-norm weight is 1 (see :func:`calibrate_sub_norms`).
    """
    H, Hkv, d = w.num_heads, w.num_kv_heads, w.head_dim
    if layer.head_dim == d and layer.num_heads * 2 == H and layer.num_kv_heads * 2 == Hkv:
        order = torch.tensor(_v1_head_order(H, Hkv))
        q = _per_head(w.q_weight, H)[order].reshape(w.q_weight.shape)
        qb = None if w.q_bias is None else _per_head(w.q_bias, H)[order].reshape(-1)
        o = w.o_weight.reshape(w.o_weight.shape[0], H, d)[:, order].reshape(w.o_weight.shape)
    elif layer.head_dim * 2 == d and layer.num_heads == H and layer.num_kv_heads == Hkv:
        q, qb, o = w.q_weight.clone(), None if w.q_bias is None else w.q_bias.clone(), w.o_weight.clone()
    else:
        raise ValueError(
            f"a V1 layer with {layer.num_heads} heads of width {layer.head_dim} over {layer.num_kv_heads} groups "
            f"does not match a softmax attention with {H} heads of width {d} over {Hkv} key/value heads"
        )
    lam = torch.randn(layer.head_dim, generator=generator) * lambda_std
    state = {
        "q_proj.weight": q, "k_proj.weight": w.k_weight.clone(), "v_proj.weight": w.v_weight.clone(),
        "out_proj.weight": o, "sub_norm.weight": torch.ones(2 * layer.head_dim),
        **{name: lam.clone() for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")},
    }
    for name, b in (("q_proj", qb), ("k_proj", w.k_bias), ("v_proj", w.v_bias), ("out_proj", w.o_bias)):
        if b is not None:
            state[f"{name}.bias"] = b.clone()
    if isinstance(layer.sub_norm, nn.Identity):
        state.pop("sub_norm.weight")
    dtype = w.q_weight.dtype
    return {k: v.to(dtype) for k, v in state.items()}


def load_v2(layer: DiffAttentionV2, w: SoftmaxWeights) -> DiffAttentionV2:
    """Load the exact conversion of ``w`` into ``layer`` (shapes checked strictly); returns ``layer``."""
    layer.load_state_dict(softmax_to_v2_state(w, lambda_bias=layer.lambda_proj.bias is not None), strict=True)
    return layer


def load_v1(layer: DiffAttention, w: SoftmaxWeights, generator: torch.Generator | None = None) -> DiffAttention:
    """Load :func:`softmax_to_v1_state` into ``layer`` (strictly); returns ``layer``."""
    layer.load_state_dict(softmax_to_v1_state(w, layer, generator=generator), strict=True)
    return layer


def weights_from_diffzoo(attn: Attention) -> SoftmaxWeights:
    """The weights of a diffzoo softmax :class:`~diffzoo.layers.Attention`."""
    return SoftmaxWeights(
        attn.q_proj.weight.detach(), attn.k_proj.weight.detach(), attn.v_proj.weight.detach(),
        attn.out_proj.weight.detach(), *(_bias(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj)),
        num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads,
    )


def _bias(linear: nn.Linear) -> Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def weights_from_timm(attn: nn.Module) -> SoftmaxWeights:
    """The weights of timm's ``Attention`` (fused ``qkv``, ``proj``); refuses options V2 cannot express."""
    for name in ("q_norm", "k_norm", "norm"):
        if not isinstance(getattr(attn, name, nn.Identity()), nn.Identity):
            raise ValueError(f"timm Attention with {name} (qk_norm/scale_norm) cannot be converted; only plain attention can")
    if getattr(attn, "gate", None) is not None:
        raise ValueError("timm Attention with gated=True cannot be converted; only plain attention can")
    dim = attn.qkv.weight.shape[1]
    if attn.proj.weight.shape[0] != dim or attn.head_dim * attn.num_heads != dim:
        raise ValueError(
            f"timm Attention with attn_head_dim={attn.head_dim} or dim_out={attn.proj.weight.shape[0]} other than "
            f"dim={dim}: only the default head layout can be converted"
        )
    q, k, v = attn.qkv.weight.detach().chunk(3, dim=0)
    qb, kb, vb = (None, None, None) if attn.qkv.bias is None else attn.qkv.bias.detach().chunk(3)
    return SoftmaxWeights(q, k, v, attn.proj.weight.detach(), qb, kb, vb, _bias(attn.proj), attn.num_heads, attn.num_heads)


def weights_from_mha(mha: nn.MultiheadAttention) -> SoftmaxWeights:
    """The weights of ``nn.MultiheadAttention`` (self-attention with a joint ``in_proj``)."""
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError(
            "nn.MultiheadAttention with kdim/vdim, add_bias_kv or add_zero_attn cannot be converted; "
            "only self-attention with a joint in_proj can"
        )
    q, k, v = mha.in_proj_weight.detach().chunk(3, dim=0)
    qb, kb, vb = (None, None, None) if mha.in_proj_bias is None else mha.in_proj_bias.detach().chunk(3)
    H = mha.num_heads
    return SoftmaxWeights(q, k, v, mha.out_proj.weight.detach(), qb, kb, vb, _bias(mha.out_proj), H, H)


def _layer_kwargs(w: SoftmaxWeights) -> dict[str, Any]:
    return dict(qkv_bias=w.q_bias is not None, proj_bias=w.o_bias is not None)


# -- V1 calibration --------------------------------------------------------------------------------
@torch.no_grad()
def calibrate_sub_norms(model: nn.Module, run: Callable[[nn.Module], Any]) -> int:
    """Set each V1 layer's sub-norm weight to the scale that undoes the norm on calibration inputs.

    ``run(model)`` feeds calibration inputs through ``model``. Layers are calibrated in forward
    order within that one pass (a layer sees the outputs of the already-calibrated ones). For the
    pre-norm output ``o`` (tokens ``t``, channels ``c``) with ``r_t = sqrt(mean_c o_tc^2 + eps)``, the
    weight ``w_c = sum_t o_tc^2 / r_t / sum_t (o_tc / r_t)^2`` minimises
    ``sum_t (w_c o_tc / r_t - o_tc)^2``; it is divided by ``1 - lambda_init`` (the layer's output scale).
    Returns the number of layers calibrated.
    """
    hooks = []
    layers = [m for m in model.modules() if isinstance(m, DiffAttention) and not isinstance(m.sub_norm, nn.Identity)]

    def make_hook(layer: DiffAttention) -> Callable:
        def hook(norm: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            o = inputs[0].float()
            o = o.reshape(-1, o.shape[-1])
            r = (o.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
            num, den = (o.pow(2) / r).sum(0), (o / r).pow(2).sum(0)
            scale = torch.where(den > 0, num / den.clamp_min(1e-30), torch.ones_like(num))
            norm.weight.copy_((scale / (1.0 - layer.lambda_init)).to(norm.weight.dtype))

        return hook

    for layer in layers:
        hooks.append(layer.sub_norm.register_forward_pre_hook(make_hook(layer)))
    was_training = model.training
    model.eval()
    try:
        run(model)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return len(layers)


# -- timm ViT --------------------------------------------------------------------------------------
def convert_timm_vit(
    model: nn.Module,
    attn: str | AttnSpec = "diff_v2",
    *,
    lambda_init: float | None = None,
    calibration: Tensor | None = None,
    seed: int = 0,
    inplace: bool = False,
) -> nn.Module:
    """timm's ``VisionTransformer`` with every timm ``Attention`` replaced by diffzoo's adapter.

    ``attn="diff_v2"`` gives :class:`diffzoo.hosts.timm.TimmDiffAttentionV2` layers computing the same
    function; ``attn="diff"`` (or ``diff_nonorm`` / ``diff_const``) gives :class:`diffzoo.hosts.timm.TimmDiffAttention`
    layers initialised by :func:`softmax_to_v1_state` with a constant ``lambda_init`` (see
    :func:`conversion_spec`), their sub-norms calibrated on the image batch ``calibration`` when given.
    Works for any timm ``vit_*`` and diffzoo's ``softvit_*``.
    """
    from timm.layers import Attention as TimmAttention

    from ..hosts.timm import TimmDiffAttention, TimmDiffAttentionV2

    spec = conversion_spec(attn, lambda_init)
    model = model if inplace else copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    found = 0
    for name, block in list(model.named_modules()):
        src = getattr(block, "attn", None)
        if not isinstance(src, TimmAttention):
            continue
        w = weights_from_timm(src)
        dim = w.q_weight.shape[1]
        kwargs = dict(_layer_kwargs(w), attn_drop=src.attn_drop.p, proj_drop=src.proj_drop.p)
        if spec.kind == "diff_v2":
            new = load_v2(TimmDiffAttentionV2(dim, w.num_heads, **kwargs), w)
        else:
            depth = int(name.rsplit(".", 1)[-1]) if name.rsplit(".", 1)[-1].isdigit() else found
            new = load_v1(TimmDiffAttention(dim, w.num_heads, depth=depth, lambda_init=spec.lambda_init_at(depth),
                                            sub_norm=spec.sub_norm, **kwargs), w, gen)
        block.attn = new.to(device=w.q_weight.device, dtype=w.q_weight.dtype)
        found += 1
    if not found:
        raise ValueError(f"{type(model).__name__} holds no timm Attention layer to convert")
    if spec.kind == "diff" and spec.sub_norm and calibration is not None:
        calibrate_sub_norms(model, lambda m: m(calibration))
    return model


# -- open_clip -------------------------------------------------------------------------------------
def convert_open_clip(
    model: nn.Module,
    attn: str | AttnSpec = "diff_v2",
    *,
    lambda_init: float | None = None,
    calibration: Callable[[nn.Module], Any] | None = None,
    seed: int = 0,
    inplace: bool = False,
) -> nn.Module:
    """An open_clip model (both towers) with each ``ResidualAttentionBlock``'s ``nn.MultiheadAttention``
    replaced by :class:`OpenClipDiffAttentionV2` (exact) or :class:`OpenClipDiffAttention` (V1).

    The model keeps its class and the rest of its modules, so open_clip's ``encode_image``,
    ``encode_text`` and ``forward`` work as before. ``calibration(model)`` runs V1 calibration inputs.
    """
    from open_clip.transformer import ResidualAttentionBlock

    spec = conversion_spec(attn, lambda_init)
    model = model if inplace else copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    found = 0
    for name, block in list(model.named_modules()):
        if not isinstance(block, ResidualAttentionBlock) or not isinstance(block.attn, nn.MultiheadAttention):
            continue
        if hasattr(block, "ln_1_kv"):
            raise ValueError(f"{name} is a cross-attention block; only self-attention blocks can be converted")
        src = block.attn
        w = weights_from_mha(src)
        dim = w.q_weight.shape[1]
        kwargs = dict(_layer_kwargs(w), attn_drop=src.dropout, batch_first=src.batch_first)
        if spec.kind == "diff_v2":
            new = load_v2(OpenClipDiffAttentionV2(dim, w.num_heads, **kwargs), w)
        else:
            new = load_v1(OpenClipDiffAttention(dim, w.num_heads, lambda_init=spec.lambda_init,
                                                sub_norm=spec.sub_norm, **kwargs), w, gen)
        block.attn = new.to(device=w.q_weight.device, dtype=w.q_weight.dtype)
        found += 1
    if not found:
        raise ValueError(f"{type(model).__name__} holds no open_clip ResidualAttentionBlock to convert")
    if spec.kind == "diff" and spec.sub_norm and calibration is not None:
        calibrate_sub_norms(model, calibration)
    return model


# -- causal LM -------------------------------------------------------------------------------------
def convert_lm(
    model: nn.Module,
    attn: str | AttnSpec = "diff_v2",
    *,
    lambda_init: float | None = None,
    calibration: Tensor | None = None,
    seed: int = 0,
) -> nn.Module:
    """A new :class:`diffzoo.models.lm.CausalLM` with ``attn`` from a softmax one (same config otherwise).

    ``"diff_v2"`` computes the same logits (grouped-query heads kept); ``"diff"`` needs even head and
    key/value head counts, fixes ``lambda_init`` and calibrates on the token batch ``calibration``.
    """
    from ..models.lm import CausalLM

    spec = conversion_spec(attn, lambda_init)
    if not isinstance(model, CausalLM) or model.config.attn != "softmax":
        raise ValueError("convert_lm expects a diffzoo CausalLM with attn='softmax'")
    changes: dict[str, Any] = {"attn": spec.name, "lambda_init": spec.lambda_init}
    target = CausalLM(model.config.replace(**changes))
    ref = next(model.parameters())
    target.to(device=ref.device, dtype=ref.dtype)
    state = {k: v for k, v in model.state_dict().items() if ".attn." not in k}
    gen = torch.Generator().manual_seed(seed)
    for i, (src, dst) in enumerate(zip(model.blocks, target.blocks)):
        w = weights_from_diffzoo(src.attn)
        layer_state = (
            softmax_to_v2_state(w) if spec.kind == "diff_v2" else softmax_to_v1_state(w, dst.attn, generator=gen)
        )
        state.update({f"blocks.{i}.attn.{k}": v for k, v in layer_state.items()})
    target.load_state_dict(state, strict=True)
    if spec.kind == "diff" and spec.sub_norm and calibration is not None:
        calibrate_sub_norms(target, lambda m: m(calibration))
    return target


def from_hf_llama(hf_model: nn.Module) -> nn.Module:
    """A softmax :class:`diffzoo.models.lm.CausalLM` with the weights of a transformers
    ``LlamaForCausalLM`` (same logits: rotate-half RoPE, SwiGLU, RMSNorms and GQA map one to one).

    Convert the result with :func:`convert_lm`.
    """
    from ..models.lm import CausalLM
    from .hf_difflama import config_from_hf

    if getattr(hf_model.config, "mlp_bias", False):
        raise ValueError("mlp_bias=True: diffzoo's SwiGLU has no biases")
    config = config_from_hf(hf_model.config, attn="softmax")
    sd = hf_model.state_dict()
    out = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    out["output.weight"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    names = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "out_proj"}
    for i in range(config.depth):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        for hf_name, name in names.items():
            for kind in ("weight", "bias") if config.bias else ("weight",):
                out[f"{dst}attn.{name}.{kind}"] = sd[f"{src}self_attn.{hf_name}.{kind}"]
        out[dst + "norm1.weight"] = sd[src + "input_layernorm.weight"]
        out[dst + "norm2.weight"] = sd[src + "post_attention_layernorm.weight"]
        out[dst + "mlp.w1.weight"] = sd[src + "mlp.gate_proj.weight"]
        out[dst + "mlp.w3.weight"] = sd[src + "mlp.up_proj.weight"]
        out[dst + "mlp.w2.weight"] = sd[src + "mlp.down_proj.weight"]
    model = CausalLM(config)
    model.load_state_dict(out, strict=True)
    return model.to(hf_model.dtype)


# -- published differential checkpoints ------------------------------------------------------------
def interleaved_to_rotate_half(weight: Tensor, head_dim: int) -> Tensor:
    """Reorder q or k projection rows from interleaved RoPE pairs ``(2j, 2j+1)`` to rotate-half pairs
    ``(j, j + d/2)``: within each head of width ``head_dim``, the even rows first, then the odd rows.

    Pair ``j`` rotates by the same angle ``base^(-2j/d)`` in both layouts, and queries and keys are
    reordered alike, so every query-key dot product, hence the attention, is unchanged.
    """
    if head_dim % 2 or weight.shape[0] % head_dim:
        raise ValueError(f"{weight.shape[0]} rows do not split into heads of even width head_dim={head_dim}")
    perm = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    heads = weight.shape[0] // head_dim
    return weight.reshape(heads, head_dim, *weight.shape[1:])[:, perm].reshape(weight.shape)


def unilm_state_dict_to_diffzoo(state_dict: dict[str, Tensor], head_dim: int) -> dict[str, Tensor]:
    """Turn the attention weights of Microsoft's reference ``MultiheadDiffAttn`` (unilm) into diffzoo's.

    Every ``*.q_proj.*`` / ``*.k_proj.*`` tensor is reordered by :func:`interleaved_to_rotate_half`
    (``head_dim`` = the differential layer's query/key width ``d``) and ``*.subln.weight`` becomes
    ``*.sub_norm.weight``; other keys pass unchanged (rename the surrounding modules to diffzoo's
    as for any checkpoint). Head pairing (``2i``, ``2i+1``), the value layout, the lambda vectors and
    ``lambda_init`` already match :class:`diffzoo.layers.DiffAttention`.
    """
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if len(parts) >= 2 and parts[-2] in ("q_proj", "k_proj") and parts[-1] in ("weight", "bias"):
            value = interleaved_to_rotate_half(value, head_dim)
        if key.endswith("subln.weight"):
            key = key[: -len("subln.weight")] + "sub_norm.weight"
        out[key] = value
    return out


# -- saved conversions -----------------------------------------------------------------------------
def save_converted(model: nn.Module, folder: str | Any, meta: dict[str, Any]) -> None:
    """Write ``model.safetensors`` (the state dict) and ``convert.json`` (``meta``: how to rebuild) to ``folder``."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"))
    (out / "convert.json").write_text(json.dumps(meta, indent=2) + "\n")


def read_converted(folder: str | Path, what: str = "") -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(convert.json's content, the weights)`` of a folder written by :func:`save_converted`.

    ``what``: how the error messages name the folder (e.g. ``"--model.init_from"``).

    Raises:
        FileNotFoundError / ValueError: one line naming the folder and what to change.
    """
    from .io import read_weights

    folder = Path(folder)
    label = f"{what} {folder}" if what else str(folder)
    meta_path, weights_path = folder / "convert.json", folder / "model.safetensors"
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise FileNotFoundError(f"{label}: {p.name} is missing; write the folder with python -m recipes.convert --out")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{label}: convert.json is not valid JSON ({e.msg})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{label}: convert.json is not a JSON object; write the folder with python -m recipes.convert")
    return meta, read_weights(weights_path, what=what or str(folder))


def build_converted(meta: dict[str, Any], folder: str | Path = "") -> nn.Module:
    """The architecture ``convert.json``'s content ``meta`` describes, with fresh weights (see
    :func:`load_converted`)."""
    build, attn = meta["build"], meta["attn"]
    # lambda_init is not a weight: the layers are built with the one the conversion fixed
    lambda_init = meta.get("lambda_init")
    if meta["family"] == "timm":
        import timm

        from .. import models  # noqa: F401  (registers diffzoo's softvit_* with timm)

        model = timm.create_model(build["model"], **build["kwargs"])
        if attn != "softmax":  # "softmax": the source written unchanged
            model = convert_timm_vit(model, attn, lambda_init=lambda_init, inplace=True)
    elif meta["family"] == "open_clip":
        import open_clip

        from ..models import clip  # noqa: F401  (registers diffzoo's CLIP configs with open_clip)

        model = open_clip.create_model(build["model"], pretrained=None, **build["kwargs"])
        if attn != "softmax":
            model = convert_open_clip(model, attn, lambda_init=lambda_init, inplace=True)
    elif meta["family"] == "lm":
        from ..models.lm import CausalLM, LMConfig

        model = CausalLM(LMConfig(**build["config"]))
    else:
        raise ValueError(f"{folder}/convert.json: unknown family {meta['family']!r}")
    return model


def load_converted(folder: str | Any, what: str = "", family: str | None = None, name: str | None = None) -> nn.Module:
    """Rebuild a model written by :func:`save_converted` (``python -m recipes.convert``) and load its weights
    (``attn`` ``"softmax"``: the source model, written unchanged by ``--attn softmax``).

    ``family`` / ``name``: refuse (one line, naming ``what``) a folder converted from another model family
    (``"timm"``, ``"open_clip"``, ``"lm"``) or another source model name.
    """
    folder = Path(folder)
    meta, state = read_converted(folder, what)
    label = f"{what} {folder}" if what else str(folder)
    if family is not None and meta.get("family") != family:
        raise ValueError(f"{label} holds a converted {meta.get('family')} model; convert a {family} model "
                         f"(python -m recipes.convert --from {family}:NAME)")
    source = (meta.get("build") or {}).get("model")
    if name is not None and source != name:
        raise ValueError(f"{label} was converted from {source!r}, not {name!r}: name the source model ({source})")
    model = build_converted(meta, folder)
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_init_from(model: nn.Module, path: str | Path) -> dict[str, Any]:
    """Load the converted weights in the folder ``path`` into ``model``; returns ``convert.json``'s content.

    A task builds its model as usual and starts it from the converted weights (``--model.init_from``), so
    the model must have the converted architecture (e.g. ``diffvit_nano_patch7_28`` with ``attn: diff_v2``
    for weights converted from ``softvit_nano_patch7_28``); the weights are loaded strictly.
    ``lambda_init`` is not a weight: the model must have been built with the one the conversion fixed
    (:func:`converted_lambda_init`); a model with another one is refused.

    Raises:
        FileNotFoundError / ValueError: one line naming the folder and what to change.
    """
    from .io import compare_state

    folder = Path(path)
    meta, state = read_converted(folder, what="--model.init_from")
    missing, unexpected, bad = compare_state(model, state)
    hint = meta.get("rebuild_hint", "the architecture the weights were converted to")
    if missing or unexpected:
        raise ValueError(
            f"--model.init_from {folder}: the weights do not fit this model ({len(missing)} missing, e.g. "
            f"{missing[:2]}; {len(unexpected)} unexpected, e.g. {unexpected[:2]}); build {hint}"
        )
    if bad:
        raise ValueError(f"--model.init_from {folder}: {bad[0]} has shape {tuple(state[bad[0]].shape)}, "
                         f"the model's is {tuple(model.state_dict()[bad[0]].shape)}; build {hint}")
    if meta.get("lambda_init") is not None:
        wrong = [m.lambda_init for m in model.modules()
                 if isinstance(m, DiffAttention) and m.lambda_init != float(meta["lambda_init"])]
        if wrong:
            raise ValueError(f"--model.init_from {folder}: the weights were converted with lambda_init="
                             f"{meta['lambda_init']}, the model was built with {wrong[0]:.4g}; build it with "
                             f"lambda_init={meta['lambda_init']}")
    model.load_state_dict(state, strict=True)
    return meta


def converted_lambda_init(path: str | Path | None, attn: Any = "diff") -> float | None:
    """The constant ``lambda_init`` the conversion in the folder ``path`` fixed, for a model of the attention
    spec ``attn`` (None: no folder, none fixed, or ``attn`` is not differential V1, whose weights then do
    not fit anyway). A task passes it to its model's constructor, so the model is built as the converted one."""
    if path is None or get_spec(attn).kind != "diff":
        return None
    value = read_converted(Path(path), what="--model.init_from")[0].get("lambda_init")
    return None if value is None else float(value)
