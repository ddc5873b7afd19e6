"""A pre-norm transformer block that takes softmax or differential attention by one field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from ..kernels._masks import check_dropout_p
from .attention import Attention, AttentionBase, RopeArg
from .diff_attention import DiffAttention, DiffAttentionV2
from .heads import check_positive_int, resolve_heads
from .kv_cache import KVCache
from .mlp import Mlp, SwiGLU
from .norm import build_norm
from .spec import AttnKind, AttnSpec, get_spec


def diff_heads_for_baseline(
    dim: int, num_heads: int, num_kv_heads: int | None = None, head_dim: int | None = None
) -> tuple[int, int, int]:
    """Differential ``(num_heads, num_kv_heads, head_dim)`` matching a softmax baseline's projections.

    The paper's convention turns ``2H`` baseline heads of width ``d`` into ``H`` differential heads of
    width ``d``. An odd baseline count has no such split: pass ``head_dim`` to keep the head count and
    use narrower heads instead (timm's convention, ``head_dim = dim // (2 * num_heads)``).
    """
    num_kv_heads, _ = resolve_heads(dim, num_heads, num_kv_heads)
    if head_dim is None:
        if num_heads % 2 or num_kv_heads % 2:
            odd = "num_heads" if num_heads % 2 else "num_kv_heads"
            value = num_heads if num_heads % 2 else num_kv_heads
            raise ValueError(
                f"{odd}={value} is odd; pass head_dim={dim // (2 * num_heads)} (same head count, half width) "
                "or an even count"
            )
        return num_heads // 2, num_kv_heads // 2, dim // num_heads
    check_positive_int("head_dim", head_dim)
    if dim % (2 * head_dim):
        raise ValueError(f"dim={dim} is not divisible by 2 * head_dim = {2 * head_dim}")
    heads = dim // (2 * head_dim)
    if (num_kv_heads * heads) % num_heads:
        raise ValueError(f"num_kv_heads={num_kv_heads} cannot be scaled to {heads} differential heads")
    return heads, num_kv_heads * heads // num_heads, head_dim


def build_attention(
    kind: AttnKind | str | AttnSpec,
    dim: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    *,
    depth: int = 0,
    lambda_init: float | None = None,
    sub_norm_eps: float | None = None,
    **kwargs,
) -> AttentionBase:
    """Build one attention layer from the *baseline's* head counts and an attention spec.

    Args:
        kind: an :class:`~diffzoo.layers.AttnSpec` or its name (``"softmax"``, ``"softmax_wide"``,
            ``"diff"``, ``"diff_nonorm"``, ``"diff_const"``, ``"diff_v2"``, ``"diff_v2_matched"``; see
            :mod:`diffzoo.layers.spec`). The attention spec's kind picks the layer, its ``head_scale`` scales the
            head counts, its lambda rule and ``sub_norm`` configure V1. (``match_params`` concerns the
            feed-forward: the model families apply it.)
        num_heads, num_kv_heads: head counts of the softmax baseline. V1 converts them with
            :func:`diff_heads_for_baseline`; V2 uses them as its output heads.
        head_dim: differential q/k width (only for V1; required when ``num_heads`` is odd).
        depth: 0-based block index (V1's ``lambda_init`` by the attention spec's rule).
        lambda_init: a constant ``lambda_init`` replacing the attention spec's rule (V1 only).
        sub_norm_eps: epsilon of the per-head RMSNorm of ``"diff"`` (default: :class:`DiffAttention`'s
            1e-5); the other kinds have no per-head norm and ignore it.
        kwargs: the remaining :class:`Attention` arguments (biases, causal, rope, dropout, backend).
    """
    spec = get_spec(kind, lambda_init)
    if spec.head_scale != 1.0:
        num_kv_heads = spec.scale_heads(num_heads if num_kv_heads is None else num_kv_heads, "num_kv_heads")
        num_heads = spec.scale_heads(num_heads)
    if spec.kind == "softmax":
        return Attention(dim, num_heads, num_kv_heads, **kwargs)
    if spec.kind == "diff":
        h, hkv, d = diff_heads_for_baseline(dim, num_heads, num_kv_heads, head_dim)
        if sub_norm_eps is not None:
            kwargs["norm_eps"] = sub_norm_eps
        return DiffAttention(dim, h, hkv, d, depth=depth, lambda_init=spec.lambda_init_at(depth),
                             sub_norm=spec.sub_norm, **kwargs)
    return DiffAttentionV2(dim, num_heads, num_kv_heads, **kwargs)


class DropPath(nn.Module):
    """Drops the whole residual branch per sample with probability ``p`` (stochastic depth)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        check_dropout_p(p, "drop_path")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Per-channel learnable scale ``gamma * x`` (CaiT), ``gamma`` initialised to ``init_value``."""

    def __init__(self, dim: int, init_value: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Block(nn.Module):
    """``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``, with optional layer-scale and drop-path.

    Args:
        dim: model width.
        num_heads: heads of the softmax baseline (see :func:`build_attention`).
        attn: an attention spec or its name (``"softmax"``, ``"diff"``, ``"diff_v2"``, ... see
            :mod:`diffzoo.layers.spec`).
        num_kv_heads: baseline key/value heads (grouped-query attention).
        head_dim: differential q/k width (needed when ``num_heads`` is odd).
        mlp_ratio: hidden width of the feed-forward relative to ``dim`` (``int(dim * mlp_ratio)``).
        mlp_hidden_dim: hidden width of the feed-forward; overrides ``mlp_ratio`` when given.
        mlp: ``"mlp"`` (GELU by default) or ``"swiglu"``.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        depth: 0-based index of this block; differential attention derives ``lambda_init`` from it.
        lambda_init: constant lambda_init instead of the depth schedule.
        qkv_bias, proj_bias, mlp_bias: biases.
        causal, rope, rope_base, attn_drop, proj_drop, backend: passed to the attention.
        drop_path: stochastic-depth probability of both residual branches.
        layer_scale_init: initial layer-scale value, or None for no layer-scale.
        act_layer: activation of the ``"mlp"`` feed-forward.
        norm_eps: epsilon of both norms (default 1e-6).
        sub_norm_eps: epsilon of the per-head RMSNorm of ``attn="diff"`` (default 1e-5).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        attn: AttnKind | str | AttnSpec = "diff",
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        mlp_ratio: float = 4.0,
        mlp_hidden_dim: int | None = None,
        mlp: Literal["mlp", "swiglu"] = "mlp",
        norm: Literal["layernorm", "rmsnorm"] = "layernorm",
        depth: int = 0,
        lambda_init: float | None = None,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        mlp_bias: bool = True,
        causal: bool = False,
        rope: RopeArg = None,
        rope_base: float = 10000.0,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        layer_scale_init: float | None = None,
        act_layer: Callable[[], nn.Module] = nn.GELU,
        norm_eps: float | None = None,
        sub_norm_eps: float | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        self.depth = depth
        self.norm1 = build_norm(norm, dim, norm_eps)
        self.attn = build_attention(
            attn, dim, num_heads, num_kv_heads, head_dim, depth=depth, lambda_init=lambda_init,
            sub_norm_eps=sub_norm_eps, qkv_bias=qkv_bias, proj_bias=proj_bias, causal=causal, rope=rope,
            rope_base=rope_base, attn_drop=attn_drop, proj_drop=proj_drop, backend=backend,
        )
        self.ls1 = LayerScale(dim, layer_scale_init) if layer_scale_init is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = build_norm(norm, dim, norm_eps)
        hidden = int(dim * mlp_ratio) if mlp_hidden_dim is None else mlp_hidden_dim
        check_positive_int("mlp_hidden_dim" if mlp_hidden_dim is not None else "int(dim * mlp_ratio)", hidden)
        if mlp == "mlp":
            self.mlp: nn.Module = Mlp(dim, hidden, act_layer=act_layer, bias=mlp_bias, drop=proj_drop)
        elif mlp == "swiglu":
            self.mlp = SwiGLU(dim, hidden, bias=mlp_bias, drop=proj_drop)
        else:
            raise ValueError(f"unknown mlp {mlp!r}; expected 'mlp' or 'swiglu'")
        self.ls2 = LayerScale(dim, layer_scale_init) if layer_scale_init is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool | None = None,
        positions: Tensor | None = None,
        kv_cache: KVCache | None = None,
        backend: str | None = None,
    ) -> Tensor:
        """``x (B, N, dim)``; the keyword arguments go to the attention's ``forward`` (see :class:`AttentionBase`)."""
        a = self.attn(
            self.norm1(x), key_padding_mask=key_padding_mask, attn_mask=attn_mask, causal=causal,
            positions=positions, kv_cache=kv_cache, backend=backend,
        )
        x = x + self.drop_path1(self.ls1(a))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
