"""Differential attention, V1 (the paper) and V2 (the follow-up).

V1: Ye et al., "Differential Transformer", ICLR 2025, arXiv 2410.05258::

    [q1; q2] = x Wq,  [k1; k2] = x Wk,  v = x Wv                       (per differential head)
    lam      = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init           (fp32, one per layer)
    o        = (softmax(q1 k1^T s) - lam softmax(q2 k2^T s)) v         (width 2d)
    o        = (1 - lambda_init) * RMSNorm(o)                          (per head)
    y        = concat(o) Wo

V2 (Microsoft's follow-up): 2H query heads share the H_kv key/value heads of width ``d``; one
ordinary attention call; ``o = a[:, 0::2] - sigmoid(x W_lam) * a[:, 1::2]`` with a lambda per token
and head; no per-head norm.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..kernels import attention, attention_maps, diff_attention, diff_attention_maps
from .attention import AttentionBase, RopeArg
from .heads import resolve_heads
from .norm import RMSNorm
from .spec import lambda_init_schedule

# torch.fx records the kernels as single calls (their input checks and backend choice need real tensors).
torch.fx.wrap("attention")
torch.fx.wrap("attention_maps")
torch.fx.wrap("diff_attention")
torch.fx.wrap("diff_attention_maps")


def combine_v1(a: Tensor, lam: Tensor) -> Tensor:
    """V1's differential heads from the attention of interleaved query pairs ``a (B, 2H, N, w)``:
    ``a[:, 0::2] - lam * a[:, 1::2]`` (the TorchScript graph of the timm adapter; the kernels of
    :mod:`diffzoo.kernels` compute the same inside ``diff_attention``)."""
    return a[:, 0::2] - lam * a[:, 1::2]


def combine_v2(a: Tensor, lam: Tensor) -> Tensor:
    """V2's output from the ``2H`` query heads' attention ``a (B, 2H, N, d)``: ``a[:, 0::2] - lam * a[:, 1::2]``
    in fp32, returned in ``a``'s dtype (``lam`` broadcasts to ``(B, H, N, 1)``). Used by the layer and by
    the TorchScript graph of the timm adapter alike."""
    return (a[:, 0::2].float() - lam * a[:, 1::2].float()).to(a.dtype)


class DiffAttention(AttentionBase):
    """Differential attention V1 with grouped-query heads, RoPE, masks and a kv-cache.

    Args:
        dim: model width ``D``.
        num_heads: differential heads ``H`` (each holds two query/key pairs and a value of width ``2d``).
        num_kv_heads: key/value groups ``H_kv`` (default ``H``; ``1`` = multi-query).
        head_dim: query/key width ``d``, default ``D // (2H)`` (projections then match a
            ``2H``-head softmax attention).
        lambda_init: a constant (DiffCLIP uses 0.8), or None for :func:`lambda_init_schedule` at ``depth``.
        depth: 0-based index of the block holding this layer.
        kv_dim: width of ``context`` for cross-attention (default ``dim``).
        qkv_bias, proj_bias: biases of the q/k/v and output projections.
        causal: default causal flag of ``forward``.
        rope: a :class:`RotaryEmbedding` of width ``d``, True to build one, or None.
        attn_drop, proj_drop: dropout on the attention map / after the output projection.
        norm_eps: epsilon of the per-head RMSNorm.
        backend: default kernel backend (``None`` follows the global selection).
        sub_norm: apply the per-head RMSNorm and the ``(1 - lambda_init)`` scale (the paper); False
            leaves the differential output as it is (an ablation; the layer then has no
            ``sub_norm.weight``). Fixed at construction, as ``lambda_init`` is.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        lambda_init: float | None = None,
        depth: int = 0,
        kv_dim: int | None = None,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        causal: bool = False,
        rope: RopeArg = None,
        rope_base: float = 10000.0,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_eps: float = 1e-5,
        backend: str | None = None,
        sub_norm: bool = True,
    ) -> None:
        num_kv_heads, head_dim = resolve_heads(dim, num_heads, num_kv_heads, head_dim, widths_per_head=2)
        super().__init__(
            dim, q_heads=2 * num_heads, k_heads=2 * num_kv_heads, v_heads=num_kv_heads, head_dim=head_dim,
            v_dim=2 * head_dim, out_in=num_heads * 2 * head_dim, kv_dim=kv_dim, qkv_bias=qkv_bias,
            proj_bias=proj_bias, causal=causal, rope=rope, rope_base=rope_base, attn_drop=attn_drop,
            proj_drop=proj_drop, backend=backend,
        )
        self.num_heads, self.num_kv_heads, self.depth = num_heads, num_kv_heads, depth
        if lambda_init is not None and not math.isfinite(float(lambda_init)):
            raise ValueError(f"lambda_init={lambda_init!r} must be a finite number (the paper uses 0.2 to 0.8)")
        self.lambda_init = lambda_init_schedule(depth) if lambda_init is None else float(lambda_init)
        self.lambda_q1 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_k1 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_q2 = nn.Parameter(torch.zeros(head_dim))
        self.lambda_k2 = nn.Parameter(torch.zeros(head_dim))
        self.use_sub_norm = bool(sub_norm)
        self.sub_norm: nn.Module = RMSNorm(2 * head_dim, eps=norm_eps) if sub_norm else nn.Identity()
        self.reset_lambda()

    def reset_lambda(self) -> None:
        """Re-draw the lambda vectors from N(0, 0.1) (the paper's initialisation)."""
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, mean=0.0, std=0.1)

    def lambda_full(self) -> Tensor:
        """The layer's scalar lambda, fp32."""
        l1 = torch.exp(torch.sum(self.lambda_q1.float() * self.lambda_k1.float()))
        l2 = torch.exp(torch.sum(self.lambda_q2.float() * self.lambda_k2.float()))
        return l1 - l2 + self.lambda_init

    def head_norm(self, out: Tensor) -> Tensor:
        """The per-head RMSNorm and ``(1 - lambda_init)`` scale of the combined heads ``(B, H, N, 2d)``, or
        ``out`` unchanged for a layer built with ``sub_norm=False``. Every path that computes V1 (the
        kernels, the TorchScript graph of the timm adapter) ends here."""
        if self.use_sub_norm:
            return self.sub_norm(out).mul_(1.0 - self.lambda_init)  # in place: one (B, H, N, 2d) buffer less
        return out

    def _attend(self, x, q, k, v, masks, return_attn, backend):
        lam = self.lambda_full()
        out = self.head_norm(diff_attention(q, k, v, lam, dropout_p=self._dropout_p(), backend=backend, **masks))
        maps = None
        if return_attn:
            a1, a2 = diff_attention_maps(q, k, lam, **masks)
            maps = {"attn1": a1, "attn2": a2, "lambda": lam.detach()}
        return out, maps

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"lambda_init={self.lambda_init:.4f}" + ("" if self.use_sub_norm else ", sub_norm=False")
        )


class DiffAttentionV2(AttentionBase):
    """Differential attention V2: one attention call over ``2H`` query heads, lambda per token and head.

    Args:
        dim: model width ``D``.
        num_heads: output heads ``H`` (``2H`` query heads are computed).
        num_kv_heads: key/value heads ``H_kv`` of width ``d`` (default ``H``).
        head_dim: head width ``d``, default ``D // H``.
        lambda_bias: give ``lambda_proj`` a bias (the reference V2 has none, so its checkpoints
            load strictly only with the default ``False``).
        Other arguments as :class:`DiffAttention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        kv_dim: int | None = None,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        causal: bool = False,
        rope: RopeArg = None,
        rope_base: float = 10000.0,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        lambda_bias: bool = False,
        backend: str | None = None,
    ) -> None:
        num_kv_heads, head_dim = resolve_heads(dim, num_heads, num_kv_heads, head_dim)
        super().__init__(
            dim, q_heads=2 * num_heads, k_heads=num_kv_heads, v_heads=num_kv_heads, head_dim=head_dim,
            v_dim=head_dim, out_in=num_heads * head_dim, kv_dim=kv_dim, qkv_bias=qkv_bias, proj_bias=proj_bias,
            causal=causal, rope=rope, rope_base=rope_base, attn_drop=attn_drop, proj_drop=proj_drop,
            backend=backend,
        )
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.lambda_proj = nn.Linear(dim, num_heads, bias=lambda_bias)

    def token_lambda(self, x: Tensor) -> Tensor:
        """V2's lambda per token and head, ``sigmoid(x W_lam)`` as fp32 ``(B, H, N, 1)``."""
        return torch.sigmoid(self.lambda_proj(x).float()).transpose(1, 2).unsqueeze(-1)

    def _attend(self, x, q, k, v, masks, return_attn, backend):
        lam = self.token_lambda(x)  # (B, H, N, 1)
        # The 2H query heads are ordered so that pairs (2i, 2i+1) fall inside one key/value group.
        a = attention(q, k, v, dropout_p=self._dropout_p(), backend=backend, **masks)  # (B, 2H, N, d)
        out = combine_v2(a, lam)  # (B, H, N, d)
        maps = None
        if return_attn:
            m = attention_maps(q, k, **masks)
            maps = {"attn1": m[:, 0::2], "attn2": m[:, 1::2], "lambda": lam.squeeze(-1).detach()}
        return out, maps

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
