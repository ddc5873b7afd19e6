"""Blockwise backend: exact differential attention over blocks of query rows, in plain PyTorch.

For a block of query rows it forms both softmax maps over *all* keys (exact, not online), combines
them into ``P = P1 - lam * P2`` and multiplies by ``V`` once, so the forward costs the FLOPs of one
standard attention (docs/design.md, "Kernel cost model") while memory stays ``O(block * N)``. The
backward recomputes the maps of each block with the same fused softmax (nothing of size ``N^2`` is stored), computes
``dV = P^T dO`` once, shares ``dP = dO V^T`` between both branches and returns the gradient of lambda.

Grouped-query heads are folded into the row dimension (the ``G`` query heads of one key/value group
become ``G * rows`` rows against the same keys), so keys and values are never copied per head.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._masks import as_lambda, causal_allowed, check_attention_inputs, prepare_mask

# Target number of fp32 score elements per block and branch (B * H * rows * Nk): 32 MiB per map.
# Larger blocks keep the batched matmuls efficient; blocks of a few rows were much slower on CPU.
_BLOCK_ELEMENTS = 1 << 23
# Tests set this to fill outputs with NaN before they are written, so an unwritten element shows.
_POISON = False
_softmax_out = torch.ops.aten._softmax.out
_softmax_backward_out = torch.ops.aten._softmax_backward_data.out


def _alloc(like: Tensor, *shape: int, dtype: torch.dtype | None = None) -> Tensor:
    if _POISON:
        return like.new_full(shape, float("nan"), dtype=dtype or like.dtype)
    return like.new_empty(shape, dtype=dtype or like.dtype)


def _block_rows(B: int, H: int, Nq: int, Nk: int, causal: bool = False) -> int:
    rows = max(1, _BLOCK_ELEMENTS // max(1, B * H * Nk))
    if causal and Nq >= 128:  # at least 4 blocks, so the keys past each block's last row can be skipped
        rows = min(rows, max(64, Nq // 4))
    if rows >= Nq:
        return max(Nq, 1)  # one block; at least one row so that an empty query range is an empty loop
    return max(16, 1 << int(math.log2(rows))) if rows >= 16 else rows


def _key_end(causal: bool, r1: int, Nq: int, Nk: int) -> int:
    """Keys ``0:end`` that rows ``< r1`` may see: under the (bottom-right) causal mask the rest is masked."""
    return max(1, min(Nk, r1 + Nk - Nq)) if causal else Nk


def _buffer(buf: Tensor | None, *shape: int) -> Tensor | None:
    """A contiguous ``shape`` view on the start of ``buf`` when it fits, else None (a new tensor is made)."""
    if buf is None or math.prod(shape) > buf.numel():
        return None
    return buf.view(-1)[: math.prod(shape)].view(shape)


def _block_bias(
    bias: Tensor | None, causal: bool, r0: int, r1: int, Nq: int, Nk: int, device, kend: int
) -> Tensor | None:
    """Additive bias for query rows ``r0:r1`` and keys ``0:kend`` as ``(B|1, H|1, rows, kend)`` fp32, or None."""
    out = None
    if bias is not None:
        out = (bias[:, :, r0:r1] if bias.shape[2] != 1 else bias)[..., :kend]
    if causal:
        allowed = causal_allowed(Nq, Nk, device, row_offset=r0, rows=r1 - r0)[:, :kend]
        c = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, float("-inf"))
        out = c[None, None] if out is None else out + c
    return out


def _block_maps(qb: Tensor, k5: Tensor, bias: Tensor | None, G: int, out: Tensor | None = None) -> Tensor:
    """Both softmax maps of one block in one buffer, fp32 ``(2, B, Hkv, G * rows, Nk)``.

    ``qb`` is ``(2, B, Hkv, G * rows, d)`` (queries scaled, branch first) and ``k5`` the keys as a
    ``(B, Hkv, 2, Nk, d)`` view (no copy); each branch's map is a contiguous slice of the buffer and
    the softmax runs in place.
    """
    _, B, Hkv, Gn, _ = qb.shape
    Nk = k5.shape[-2]
    if out is None:
        out = qb.new_empty(2, B, Hkv, Gn, Nk)
    for i in (0, 1):
        torch.matmul(qb[i], k5[:, :, i].transpose(-1, -2), out=out[i])
    s = out if out.dtype == torch.float32 else out.float()
    if bias is not None:  # (B|1, H|1, rows, Nk) -> broadcast over (2, B, Hkv, G, rows, Nk)
        Bb, Hb, Rb, Nb = bias.shape
        b = bias.view(1, Bb, 1, 1, Rb, Nb) if Hb == 1 else bias.view(1, Bb, Hkv, G, Rb, Nb)
        s.view(2, B, Hkv, G, Gn // G, s.shape[-1]).add_(b)
    return _softmax_out(s, -1, False, out=s)


def _dropout_scale(shape: tuple[int, ...], p: float, seed: int, r0: int, device: torch.device) -> Tensor:
    """Inverted-dropout factors ``keep / (1 - p)`` (fp32) of the block starting at query row ``r0``.

    Drawn from a generator seeded by ``seed`` and ``r0``, so the backward draws the same mask again
    instead of storing it.
    """
    g = torch.Generator(device=device)
    g.manual_seed((seed + 1_000_003 * r0) % (1 << 63))
    keep = torch.rand(shape, generator=g, device=device) >= p
    return keep.to(torch.float32).mul_(1.0 / (1.0 - p))


def _block_queries(q6: Tensor, r0: int, r1: int, scale: float) -> Tensor:
    """Rows ``r0:r1`` of ``q6 (B, Hkv, G, 2, Nq, d)``, times ``scale``, as ``(2, B, Hkv, G * rows, d)``."""
    B, Hkv, G, _, _, d = q6.shape
    qb = q6.new_empty(2, B, Hkv, G, r1 - r0, d)
    torch.mul(q6[:, :, :, :, r0:r1].permute(3, 0, 1, 2, 4, 5), scale, out=qb)
    return qb.view(2, B, Hkv, G * (r1 - r0), d)


def _seed(seed: Tensor | None) -> int:
    if seed is None:
        raise ValueError("the blockwise kernel needs a seed tensor when dropout_p > 0")
    return int(seed)


@torch.library.custom_op("diffzoo::blockwise_diff_attention", mutates_args=())
def blockwise_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lam: Tensor,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    dropout_p: float,
    seed: Tensor | None,
) -> Tensor:
    """Forward of the kernel as one operator, ``torch.ops.diffzoo.blockwise_diff_attention``.

    ``q``, ``k``, ``v`` are contiguous, ``bias`` is the prepared additive mask (or None) and ``seed``
    an int64 scalar tensor fixing the dropout mask (None without dropout). As an operator the kernel
    is one opaque node for ``torch.compile`` and ``torch.export``: its loop over row blocks runs at
    call time with the real sizes, and ``lam`` is read as a number only there.
    """
    B, H2, Nq, d = q.shape
    H, Hkv, Nk, dv = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    q6 = q.view(B, Hkv, G, 2, Nq, d)
    k5 = k.view(B, Hkv, 2, Nk, d)
    lam_v = float(lam)
    out = _alloc(q, B, H, Nq, dv)
    rows = _block_rows(B, H, Nq, Nk, causal)
    buf = q.new_empty(2, B, Hkv, G * rows, Nk) if q.dtype == torch.float32 else None
    for r0 in range(0, Nq, rows):
        r1 = min(Nq, r0 + rows)
        n, kend = r1 - r0, _key_end(causal, r1, Nq, Nk)
        bias_b = _block_bias(bias, causal, r0, r1, Nq, Nk, q.device, kend)
        s = _block_maps(
            _block_queries(q6, r0, r1, scale), k5[:, :, :, :kend], bias_b, G, out=_buffer(buf, 2, B, Hkv, G * n, kend)
        )
        p = s[0].add_(s[1], alpha=-lam_v)  # P1 - lam P2 in place, (B, Hkv, G*n, kend)
        if dropout_p > 0.0:  # one mask on the combined map, shared by every value channel
            p.mul_(_dropout_scale(p.shape, dropout_p, _seed(seed), r0, q.device))
        out[:, :, r0:r1] = torch.matmul(p.to(v.dtype), v[:, :, :kend]).view(B, H, n, dv)
    return out


@blockwise_forward.register_fake
def _(q, k, v, lam, bias, causal, scale, dropout_p, seed):
    return q.new_empty(q.shape[0], q.shape[1] // 2, q.shape[2], v.shape[-1])


@torch.library.custom_op("diffzoo::blockwise_diff_attention_backward", mutates_args=())
def blockwise_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lam: Tensor,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    dropout_p: float,
    seed: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv, dlam)`` of :func:`blockwise_forward`, recomputing the maps block by block."""
    B, H2, Nq, d = q.shape
    H, Hkv, Nk, dv = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    q6 = q.view(B, Hkv, G, 2, Nq, d)
    k5 = k.view(B, Hkv, 2, Nk, d)
    lam_v = float(lam)
    dout = dout.contiguous()
    dq = _alloc(q, *q.shape)
    dq6 = dq.view(B, Hkv, G, 2, Nq, d)
    f32 = torch.float32
    dk = torch.zeros(B, Hkv, 2, Nk, d, dtype=f32, device=q.device)
    dv_acc = torch.zeros(B, Hkv, Nk, dv, dtype=f32, device=q.device)
    dlam = torch.zeros((), dtype=f32, device=q.device)
    rows = _block_rows(B, H, Nq, Nk, causal)
    buf = q.new_empty(2, B, Hkv, G * rows, Nk) if q.dtype == torch.float32 else None
    pbuf = buf[0].clone() if buf is not None else None
    for r0 in range(0, Nq, rows):
        r1 = min(Nq, r0 + rows)
        n, kend = r1 - r0, _key_end(causal, r1, Nq, Nk)
        qb = _block_queries(q6, r0, r1, scale)
        kb, vb = k5[:, :, :, :kend], v[:, :, :kend]
        # Recompute both maps exactly (whole rows up to the causal limit), instead of storing them.
        bias_b = _block_bias(bias, causal, r0, r1, Nq, Nk, q.device, kend)
        s = _block_maps(qb, kb, bias_b, G, out=_buffer(buf, 2, B, Hkv, G * n, kend))
        do = dout[:, :, r0:r1].reshape(B, Hkv, G * n, dv)
        p_out = _buffer(pbuf, B, Hkv, G * n, kend)
        if p_out is not None:
            p = torch.sub(s[0], s[1], alpha=lam_v, out=p_out)
        else:
            p = torch.sub(s[0], s[1], alpha=lam_v)
        drop = _dropout_scale(p.shape, dropout_p, _seed(seed), r0, q.device) if dropout_p > 0.0 else None
        if drop is not None:
            p.mul_(drop)
        # dV = drop(P1 - lam P2)^T dO, once
        dv_acc[:, :, :kend] += torch.matmul(p.to(v.dtype).transpose(-1, -2), do).float()
        dp = torch.matmul(do, vb.transpose(-1, -2)).float()  # (B, Hkv, G*n, kend), shared by both branches
        if drop is not None:
            dp.mul_(drop)  # the gradient reaches P1 - lam P2 through the same mask
        dlam -= torch.dot(s[1].reshape(-1), dp.reshape(-1))
        # dS = P * (dP - rowsum(P * dP)) per branch, written over the maps; branch 2 carries -lam
        for i in (0, 1):
            _softmax_backward_out(dp, s[i], -1, f32, grad_input=s[i])
        s[1].mul_(-lam_v)
        ds = s.to(q.dtype)
        for i in (0, 1):
            dq6[:, :, :, i, r0:r1] = torch.matmul(ds[i], kb[:, :, i]).view(B, Hkv, G, n, d)
            dk[:, :, i, :kend] += torch.matmul(ds[i].transpose(-1, -2), qb[i]).float()
    dq.mul_(scale)  # the gradient flowed to the scaled queries
    dk = dk.view(B, 2 * Hkv, Nk, d).to(k.dtype)
    return dq, dk, dv_acc.to(v.dtype), dlam.to(lam.dtype).reshape(lam.shape)


@blockwise_backward.register_fake
def _(dout, q, k, v, lam, bias, causal, scale, dropout_p, seed):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lam)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, lam, bias, causal, scale, dropout_p, seed = inputs
    ctx.save_for_backward(q, k, v, lam, bias, seed)
    ctx.causal, ctx.scale, ctx.dropout_p = causal, scale, dropout_p


def _backward(ctx, dout):
    q, k, v, lam, bias, seed = ctx.saved_tensors
    dq, dk, dv, dlam = blockwise_backward(dout, q, k, v, lam, bias, ctx.causal, ctx.scale, ctx.dropout_p, seed)
    return dq, dk, dv, dlam, None, None, None, None, None


blockwise_forward.register_autograd(_backward, setup_context=_setup_context)


def diff_attention_blockwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lam: Tensor,
    *,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Exact blockwise differential attention; same signature and result as the reference backend.

    With ``dropout_p > 0`` the combined map ``P1 - lam P2`` is dropped once (as the reference does);
    the mask comes from a seed drawn from torch's default generator, so ``torch.manual_seed`` fixes it.
    """
    B, H, Hkv, Nq, Nk = check_attention_inputs(
        q, k, v, differential=True, attn_mask=attn_mask, key_padding_mask=key_padding_mask
    )
    lam = as_lambda(lam, q)
    if lam.numel() != 1:
        raise ValueError(f"lam must be a scalar tensor, got shape {tuple(lam.shape)}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    m = prepare_mask(attn_mask, key_padding_mask, causal, Nq, Nk, q.device, keep_causal_separate=True)
    seed = torch.randint(0, 1 << 62, ()) if dropout_p > 0.0 else None  # a tensor: no sync, traceable
    out = blockwise_forward(
        q.contiguous(), k.contiguous(), v.contiguous(), lam, m.bias, m.causal, scale, float(dropout_p), seed
    )
    if m.row_valid is not None:
        out = out * m.row_valid
    return out
