"""Blockwise backend: exact differential attention over blocks of query rows, in plain PyTorch.

For a block of query rows it forms both softmax maps over *all* keys (exact, not online), combines
them into ``P = P1 - lam * P2`` and multiplies by ``V`` once, so the forward costs the FLOPs of one
standard attention (SPEC section 3) while memory stays ``O(block * N)``. The backward recomputes the
maps of each block with the same fused softmax (nothing of size ``N^2`` is stored), computes
``dV = P^T dO`` once, shares ``dP = dO V^T`` between both branches and returns the gradient of lambda.

Grouped-query heads are folded into the row dimension (the ``G`` query heads of one key/value group
become ``G * rows`` rows against the same keys), so keys and values are never copied per head.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ._masks import causal_allowed, check_attention_inputs, prepare_mask

# Target number of fp32 score elements per block and branch (B * H * rows * Nk); about 4 MiB.
_BLOCK_ELEMENTS = 1 << 20
# Tests set this to fill outputs with NaN before they are written, so an unwritten element shows.
_POISON = False


def _alloc(like: Tensor, *shape: int, dtype: Optional[torch.dtype] = None) -> Tensor:
    if _POISON:
        return like.new_full(shape, float("nan"), dtype=dtype or like.dtype)
    return like.new_empty(shape, dtype=dtype or like.dtype)


def _block_rows(B: int, H: int, Nq: int, Nk: int) -> int:
    rows = max(1, _BLOCK_ELEMENTS // max(1, B * H * Nk))
    if rows >= Nq:
        return Nq
    return max(16, 1 << int(math.log2(rows))) if rows >= 16 else rows


def _block_bias(bias: Optional[Tensor], causal: bool, r0: int, r1: int, Nq: int, Nk: int, device) -> Optional[Tensor]:
    """Additive bias for query rows ``r0:r1`` as ``(B|1, H|1, rows, Nk)`` fp32, or None."""
    out = None
    if bias is not None:
        out = bias[:, :, r0:r1] if bias.shape[2] != 1 else bias
    if causal:
        allowed = causal_allowed(Nq, Nk, device, row_offset=r0, rows=r1 - r0)
        c = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, float("-inf"))
        out = c[None, None] if out is None else out + c
    return out


def _block_maps(
    q1b: Tensor, q2b: Tensor, k1: Tensor, k2: Tensor, bias: Optional[Tensor], B: int, H: int, rows: int
) -> tuple[Tensor, Tensor]:
    """Both softmax maps of one block, fp32 ``(B, H, rows, Nk)``; the queries are pre-scaled."""
    maps = []
    for qb, kb in ((q1b, k1), (q2b, k2)):
        s = torch.matmul(qb, kb.transpose(-1, -2)).float()  # (B, Hkv, G*rows, Nk)
        s = s.view(B, H, rows, s.shape[-1])
        if bias is not None:
            s = s.add_(bias)
        maps.append(torch.softmax(s, dim=-1))
    return maps[0], maps[1]


def _split_block(q5: Tensor, r0: int, r1: int) -> tuple[Tensor, Tensor]:
    """Rows ``r0:r1`` of ``q5 (B, Hkv, G, 2, Nq, d)`` as two ``(B, Hkv, G * rows, d)`` tensors."""
    B, Hkv, G, _, _, d = q5.shape
    return (
        q5[:, :, :, 0, r0:r1].reshape(B, Hkv, G * (r1 - r0), d),
        q5[:, :, :, 1, r0:r1].reshape(B, Hkv, G * (r1 - r0), d),
    )


class _BlockwiseDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lam, bias, causal, scale):
        B, H2, Nq, d = q.shape
        H, Hkv, Nk, dv = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
        G = H // Hkv
        qs = q * scale  # fold the logit scale into the queries once
        q5 = qs.view(B, Hkv, G, 2, Nq, d)
        k1, k2 = k.view(B, Hkv, 2, Nk, d).unbind(2)
        lam_v = float(lam)
        out = _alloc(q, B, H, Nq, dv)
        rows = _block_rows(B, H, Nq, Nk)
        for r0 in range(0, Nq, rows):
            r1 = min(Nq, r0 + rows)
            n = r1 - r0
            q1b, q2b = _split_block(q5, r0, r1)
            p1, p2 = _block_maps(q1b, q2b, k1, k2, _block_bias(bias, causal, r0, r1, Nq, Nk, q.device), B, H, n)
            p = p1.add_(p2, alpha=-lam_v).to(v.dtype).view(B, Hkv, G * n, Nk)  # P1 - lam P2
            out[:, :, r0:r1] = torch.matmul(p, v).view(B, H, n, dv)
        ctx.save_for_backward(q, k, v, lam, bias)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lam, bias = ctx.saved_tensors
        causal, scale = ctx.causal, ctx.scale
        B, H2, Nq, d = q.shape
        H, Hkv, Nk, dv = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
        G = H // Hkv
        q5 = (q * scale).view(B, Hkv, G, 2, Nq, d)
        k1, k2 = k.view(B, Hkv, 2, Nk, d).unbind(2)
        lam_v = float(lam)
        dout = dout.contiguous()
        dq = _alloc(q, *q.shape)
        dq5 = dq.view(B, Hkv, G, 2, Nq, d)
        f32 = torch.float32
        dk1 = torch.zeros(B, Hkv, Nk, d, dtype=f32, device=q.device)
        dk2 = torch.zeros_like(dk1)
        dv_acc = torch.zeros(B, Hkv, Nk, dv, dtype=f32, device=q.device)
        dlam = torch.zeros((), dtype=f32, device=q.device)
        softmax_backward = torch.ops.aten._softmax_backward_data
        rows = _block_rows(B, H, Nq, Nk)
        for r0 in range(0, Nq, rows):
            r1 = min(Nq, r0 + rows)
            n = r1 - r0
            q1b, q2b = _split_block(q5, r0, r1)
            # Recompute both maps exactly (whole rows), instead of storing them.
            p1, p2 = _block_maps(q1b, q2b, k1, k2, _block_bias(bias, causal, r0, r1, Nq, Nk, q.device), B, H, n)
            do = dout[:, :, r0:r1].reshape(B, Hkv, G * n, dv)
            p = torch.add(p1, p2, alpha=-lam_v).to(v.dtype).view(B, Hkv, G * n, Nk)
            dv_acc += torch.matmul(p.transpose(-1, -2), do).float()  # dV = (P1 - lam P2)^T dO, once
            dp = torch.matmul(do, v.transpose(-1, -2)).float().view(B, H, n, Nk)  # shared by both branches
            dlam -= torch.dot(p2.reshape(-1), dp.reshape(-1))
            # dS = P * (dP - rowsum(P * dP)) per branch; branch 2 carries the factor -lam
            ds1 = softmax_backward(dp, p1, -1, f32).to(q.dtype).view(B, Hkv, G * n, Nk)
            ds2 = softmax_backward(dp, p2, -1, f32).mul_(-lam_v).to(q.dtype).view(B, Hkv, G * n, Nk)
            dq5[:, :, :, 0, r0:r1] = torch.matmul(ds1, k1).view(B, Hkv, G, n, d)
            dq5[:, :, :, 1, r0:r1] = torch.matmul(ds2, k2).view(B, Hkv, G, n, d)
            dk1 += torch.matmul(ds1.transpose(-1, -2), q1b).float()
            dk2 += torch.matmul(ds2.transpose(-1, -2), q2b).float()
        dq.mul_(scale)  # the gradient flowed to the scaled queries
        dk = torch.stack((dk1, dk2), dim=2).view(B, 2 * Hkv, Nk, d).to(k.dtype)
        return dq, dk, dv_acc.to(v.dtype), dlam.to(lam.dtype).reshape(lam.shape), None, None, None


def diff_attention_blockwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lam: Tensor,
    *,
    attn_mask: Optional[Tensor] = None,
    key_padding_mask: Optional[Tensor] = None,
    causal: bool = False,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Exact blockwise differential attention; same signature and result as the reference backend."""
    if dropout_p > 0.0:
        raise ValueError("the blockwise backend has no attention dropout; use backend='sdpa' or 'reference'")
    B, H, Hkv, Nq, Nk = check_attention_inputs(
        q, k, v, differential=True, attn_mask=attn_mask, key_padding_mask=key_padding_mask
    )
    if lam.numel() != 1:
        raise ValueError(f"lam must be a scalar tensor, got shape {tuple(lam.shape)}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    m = prepare_mask(attn_mask, key_padding_mask, causal, Nq, Nk, q.device, keep_causal_separate=True)
    out = _BlockwiseDiffAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), lam, m.bias, m.causal, scale)
    if m.row_valid is not None:
        out = out * m.row_valid
    return out
