"""Triton backend: fused differential flash attention, forward and backward.

Differential attention (Ye et al., "Differential Transformer", ICLR 2025, arXiv 2410.05258) computes
``O = softmax(q1 k1^T s + M) V - lam * softmax(q2 k2^T s + M) V`` per differential head. The kernels
follow FlashAttention-2 (Dao, arXiv 2307.08691) with both branches fused:

* **Forward** (one program per block of query rows and differential head): one pass over the key
  tiles with two online softmaxes (two running max / sum / accumulator triples). Each K1, K2, V tile
  is loaded once and serves both branches; ``O = O1 - lam * O2`` is written once; both log-sum-exps
  are saved. With gradients needed, the normalised branch outputs ``O1`` and ``O2`` are saved too.
* **Backward preprocessing**: ``D1 = rowsum(dO * O1)``, ``D2 = rowsum(dO * O2)`` (which equal
  ``rowsum(P1 * dP)`` and ``rowsum(P2 * dP)``) from the saved ``O1, O2``; ``dlam = -sum(D2)``.
* **Backward dK/dV** (one program per key tile and key/value group, looping over the group's query
  heads, so grouped-query heads need no atomics for dK/dV): recomputes ``P1, P2`` from the saved
  log-sum-exps, ``dV = (P1 - lam P2)^T dO`` once, ``dP = dO V^T`` once for both branches,
  ``dS1 = P1 (dP - D1)``, ``dS2 = -lam P2 (dP - D2)``, ``dK1 = s dS1^T Q1``, ``dK2 = s dS2^T Q2``.
  ``dQ`` is accumulated from the same program with fp32 atomic adds (no recomputation), or, when
  ``torch.are_deterministic_algorithms_enabled()``, by a separate deterministic dQ kernel that
  recomputes ``P1, P2, dP`` per query tile.

Masks: causal (bottom-right aligned) and key padding are applied in the kernels from indices and a
per-key bias vector, so lengths may differ within a batch; an ``attn_mask`` is loaded as an fp32 bias
tile (broadcast dimensions have stride 0). Rows with no allowed key output exactly 0 and get zero
gradients (their log-sum-exp is stored as ``+inf``, which makes every recomputed probability 0).

The per-head RMSNorm of the differential layer is not fused: it normalises over the full value width
``2d`` of ``O1 - lam O2``, which the forward has only after its last key tile, and the gradient that
enters this kernel's backward is the output of the norm's backward. Fusing it would save one read and
one write of ``(B, H, N, 2d)`` (O(N d), negligible next to the O(N^2 d) core) at the cost of a kernel
variant per norm configuration. The layer applies it after this kernel.

The kernels are wrapped as ``torch.library`` custom ops with a registered autograd formula, so
``torch.compile`` traces through them without a graph break.

On a machine without CUDA the kernels run in Triton's CPU interpreter (slow; used for tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from ._masks import check_attention_inputs
from .registry import Call

__all__ = ["diff_attention_triton", "unsupported"]

# The interpreter is chosen by TRITON_INTERPRET=1, which triton reads when it is first imported (its
# own library functions are decorated then) and when these kernels are decorated.
INTERPRET = bool(triton.knobs.runtime.interpret)
_INTERPRETER_BROKEN = INTERPRET and type(tl.zeros).__name__ != "InterpretedFunction"
MAX_HEAD_DIM = 128
MAX_VALUE_DIM = 256
_LOG2E = 1.4426950408889634
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Test hooks: fill every output buffer with NaN before the kernels write (catches unwritten
# elements), and force block sizes (to put block boundaries inside small test shapes).
_poison = False
_forced_blocks: tuple[int, int] | None = None


# --------------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------------


@triton.jit
def _query_tile_bounds(start_m, Nq, Nk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key range of a query tile: ``[0, full_end)`` needs no mask, ``[full_end, hi)`` does."""
    if CAUSAL:
        diag = Nk - Nq
        hi = tl.minimum(Nk, start_m + BLOCK_M + diag)  # keys seen by the tile's last row
        full = tl.minimum(start_m + 1 + diag, Nk)  # keys seen by the tile's first row
        full_end = tl.maximum(full, 0) // BLOCK_N * BLOCK_N
    else:
        hi = Nk
        full_end = Nk // BLOCK_N * BLOCK_N
    return full_end, hi


@triton.jit
def _fwd_loop(
    acc1, acc2, l1, l2, m1, m2, q1, q2,
    k1_base, k2_base, v_base, kpb_base, bias_base,
    offs_m, offs_d, offs_dv, skn, svn, sbm, sbn, Nq, Nk, qk_scale, lo, hi,
    BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr,
    HAS_BIAS: tl.constexpr, MM: tl.constexpr, ELT: tl.constexpr, PREC: tl.constexpr,
):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < Nk
        kt_off = offs_n[None, :] * skn + offs_d[:, None]  # (D, BLOCK_N): K^T
        v_off = offs_n[:, None] * svn + offs_dv[None, :]  # (BLOCK_N, DV)
        if MASK:
            k1t = tl.load(k1_base + kt_off, mask=n_ok[None, :], other=0.0).to(MM)
            k2t = tl.load(k2_base + kt_off, mask=n_ok[None, :], other=0.0).to(MM)
            v = tl.load(v_base + v_off, mask=n_ok[:, None], other=0.0).to(MM)
        else:
            k1t = tl.load(k1_base + kt_off).to(MM)
            k2t = tl.load(k2_base + kt_off).to(MM)
            v = tl.load(v_base + v_off).to(MM)
        s1 = tl.dot(q1, k1t, input_precision=PREC) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        s2 = tl.dot(q2, k2t, input_precision=PREC) * qk_scale
        if HAS_KPB:
            kb = tl.load(kpb_base + offs_n, mask=n_ok, other=float("-inf")) * 1.4426950408889634
            s1 += kb[None, :]
            s2 += kb[None, :]
        if HAS_BIAS:
            b_ptrs = bias_base + offs_m[:, None] * sbm + offs_n[None, :] * sbn
            bt = tl.load(b_ptrs, mask=(offs_m[:, None] < Nq) & n_ok[None, :], other=0.0) * 1.4426950408889634
            s1 += bt
            s2 += bt
        if MASK:
            allowed = n_ok[None, :]
            if CAUSAL:
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + (Nk - Nq))
            s1 = tl.where(allowed, s1, float("-inf"))
            s2 = tl.where(allowed, s2, float("-inf"))
        m1_new = tl.maximum(m1, tl.max(s1, 1))
        m2_new = tl.maximum(m2, tl.max(s2, 1))
        if MASK or HAS_KPB or HAS_BIAS:
            # a row may have seen no allowed key yet: subtract 0 instead of -inf (no NaN)
            m1_new = tl.where(m1_new == float("-inf"), 0.0, m1_new)
            m2_new = tl.where(m2_new == float("-inf"), 0.0, m2_new)
        p1 = tl.math.exp2(s1 - m1_new[:, None])
        p2 = tl.math.exp2(s2 - m2_new[:, None])
        alpha1 = tl.math.exp2(m1 - m1_new)
        alpha2 = tl.math.exp2(m2 - m2_new)
        l1 = l1 * alpha1 + tl.sum(p1, 1)
        l2 = l2 * alpha2 + tl.sum(p2, 1)
        acc1 = acc1 * alpha1[:, None] + tl.dot(p1.to(ELT).to(MM), v, input_precision=PREC)
        acc2 = acc2 * alpha2[:, None] + tl.dot(p2.to(ELT).to(MM), v, input_precision=PREC)
        m1 = m1_new
        m2 = m2_new
    return acc1, acc2, l1, l2, m1, m2


# --------------------------------------------------------------------------------------------------
# Forward kernel
# --------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_kernel(
    Q, K, V, LAM, KPB, BIAS, OUT, PARTS, LSE,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, skpb, sbb, sbh, sbm, sbn,
    H, G, Nq, Nk, qk_scale,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr, HAS_BIAS: tl.constexpr, SAVE_PARTS: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    ELT: tl.constexpr = Q.dtype.element_ty
    # operand type of the products: fp32 in the interpreter, whose bf16 product is wrong
    if UPCAST:
        MM: tl.constexpr = tl.float32
    else:
        MM: tl.constexpr = ELT  # type: ignore[no-redef]
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    g = h // G
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < Nq

    q_off = offs_m[:, None] * sqn + offs_d[None, :]
    q1_base = Q + b * sqb + (2 * h) * sqh
    q1 = tl.load(q1_base + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    q2 = tl.load(q1_base + sqh + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    k1_base = K + b * skb + (2 * g) * skh
    k2_base = k1_base + skh
    v_base = V + b * svb + g * svh
    kpb_base = KPB + b * skpb
    bias_base = BIAS + b * sbb + h * sbh

    acc1 = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    m1 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    full_end, hi = _query_tile_bounds(start_m, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    acc1, acc2, l1, l2, m1, m2 = _fwd_loop(
        acc1, acc2, l1, l2, m1, m2, q1, q2, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, skn, svn, sbm, sbn, Nq, Nk, qk_scale, 0, full_end,
        BLOCK_N, False, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )
    acc1, acc2, l1, l2, m1, m2 = _fwd_loop(
        acc1, acc2, l1, l2, m1, m2, q1, q2, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, skn, svn, sbm, sbn, Nq, Nk, qk_scale, full_end, hi,
        BLOCK_N, True, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )

    # rows with no allowed key: l == 0, acc == 0 -> output 0, log-sum-exp +inf
    l1_safe = tl.where(l1 > 0.0, l1, 1.0)
    l2_safe = tl.where(l2 > 0.0, l2, 1.0)
    o1 = acc1 / l1_safe[:, None]
    o2 = acc2 / l2_safe[:, None]
    lam = tl.load(LAM)
    out = o1 - lam * o2
    tl.store(OUT + b * sob + h * soh + offs_m[:, None] * son + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=m_ok[:, None])
    lse_base = LSE + pid_bh * 2 * Nq
    tl.store(lse_base + offs_m, tl.where(l1 > 0.0, m1 + tl.math.log2(l1_safe), float("inf")), mask=m_ok)
    tl.store(lse_base + Nq + offs_m, tl.where(l2 > 0.0, m2 + tl.math.log2(l2_safe), float("inf")), mask=m_ok)
    if SAVE_PARTS:
        p_base = PARTS + pid_bh * 2 * Nq * DV
        p_off = offs_m[:, None] * DV + offs_dv[None, :]
        tl.store(p_base + p_off, o1.to(PARTS.dtype.element_ty), mask=m_ok[:, None])
        tl.store(p_base + Nq * DV + p_off, o2.to(PARTS.dtype.element_ty), mask=m_ok[:, None])


# --------------------------------------------------------------------------------------------------
# Backward kernels
# --------------------------------------------------------------------------------------------------


@triton.jit
def _bwd_delta_kernel(
    DO, PARTS, DELTA, sdob, sdoh, sdon, H, Nq,
    DV: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """``D1 = rowsum(dO * O1)``, ``D2 = rowsum(dO * O2)`` in fp32, stored as ``(B, H, 2, Nq)``."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < Nq
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdon + offs_dv[None, :], mask=m_ok[:, None],
                 other=0.0).to(tl.float32)
    p_base = PARTS + pid_bh * 2 * Nq * DV
    p_off = offs_m[:, None] * DV + offs_dv[None, :]
    o1 = tl.load(p_base + p_off, mask=m_ok[:, None], other=0.0).to(tl.float32)
    o2 = tl.load(p_base + Nq * DV + p_off, mask=m_ok[:, None], other=0.0).to(tl.float32)
    d_base = DELTA + pid_bh * 2 * Nq
    tl.store(d_base + offs_m, tl.sum(do * o1, 1), mask=m_ok)
    tl.store(d_base + Nq + offs_m, tl.sum(do * o2, 1), mask=m_ok)


@triton.jit
def _bwd_kv_loop(
    dk1, dk2, dv, k1, k2, v, kb, lam,
    q1_base, q2_base, do_base, lse_base, delta_base, bias_base, dq1_base, dq2_base,
    offs_n, offs_d, offs_dv, sqn, sdon, sdqn, sbm, sbn, Nq, Nk, qk_scale, scale, lo, hi,
    BLOCK_M: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr,
    HAS_BIAS: tl.constexpr, DQ_ATOMIC: tl.constexpr, MM: tl.constexpr, ELT: tl.constexpr, PREC: tl.constexpr,
):
    offs_m0 = tl.arange(0, BLOCK_M)
    n_ok = offs_n < Nk
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        m_ok = offs_m < Nq
        q_off = offs_m[:, None] * sqn + offs_d[None, :]
        q1 = tl.load(q1_base + q_off, mask=m_ok[:, None], other=0.0).to(MM)
        q2 = tl.load(q2_base + q_off, mask=m_ok[:, None], other=0.0).to(MM)
        do = tl.load(do_base + offs_m[:, None] * sdon + offs_dv[None, :], mask=m_ok[:, None], other=0.0).to(MM)
        # rows outside Nq get lse = +inf, so their recomputed probabilities are 0
        lse1 = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))
        lse2 = tl.load(lse_base + Nq + offs_m, mask=m_ok, other=float("inf"))
        dl1 = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        dl2 = tl.load(delta_base + Nq + offs_m, mask=m_ok, other=0.0)
        # transposed tiles: (BLOCK_N keys, BLOCK_M queries)
        s1 = tl.dot(k1, tl.trans(q1), input_precision=PREC) * qk_scale
        s2 = tl.dot(k2, tl.trans(q2), input_precision=PREC) * qk_scale
        if HAS_KPB:
            s1 += kb[:, None]
            s2 += kb[:, None]
        if HAS_BIAS:
            b_ptrs = bias_base + offs_m[None, :] * sbm + offs_n[:, None] * sbn
            bt = tl.load(b_ptrs, mask=m_ok[None, :] & n_ok[:, None], other=0.0) * 1.4426950408889634
            s1 += bt
            s2 += bt
        if MASK:
            allowed = n_ok[:, None]
            if CAUSAL:
                allowed = allowed & (offs_n[:, None] <= offs_m[None, :] + (Nk - Nq))
            s1 = tl.where(allowed, s1, float("-inf"))
            s2 = tl.where(allowed, s2, float("-inf"))
        p1 = tl.math.exp2(s1 - lse1[None, :])
        p2 = tl.math.exp2(s2 - lse2[None, :])
        dv += tl.dot((p1 - lam * p2).to(ELT).to(MM), do, input_precision=PREC)
        dp = tl.dot(v, tl.trans(do), input_precision=PREC)  # dP^T = V dO^T, shared by both branches
        ds1 = p1 * (dp - dl1[None, :])
        ds2 = p2 * (dp - dl2[None, :]) * (-lam)
        dk1 += tl.dot(ds1.to(ELT).to(MM), q1, input_precision=PREC)
        dk2 += tl.dot(ds2.to(ELT).to(MM), q2, input_precision=PREC)
        if DQ_ATOMIC:
            dq_off = offs_m[:, None] * sdqn + offs_d[None, :]
            dq1 = tl.dot(tl.trans(ds1.to(ELT).to(MM)), k1, input_precision=PREC) * scale
            dq2 = tl.dot(tl.trans(ds2.to(ELT).to(MM)), k2, input_precision=PREC) * scale
            tl.atomic_add(dq1_base + dq_off, dq1, mask=m_ok[:, None])
            tl.atomic_add(dq2_base + dq_off, dq2, mask=m_ok[:, None])
    return dk1, dk2, dv


@triton.jit
def _bwd_kv_kernel(
    Q, K, V, LAM, KPB, BIAS, DO, LSE, DELTA, DQ, DK, DV,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdon, skpb, sbb, sbh, sbm, sbn,
    H, Hkv, G, Nq, Nk, qk_scale, scale,
    D: tl.constexpr, DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr, HAS_BIAS: tl.constexpr, DQ_ATOMIC: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """dK1, dK2, dV of one key tile of one key/value group (and dQ by atomics if DQ_ATOMIC).

    ``DK`` is ``(B, 2Hkv, Nk, D)``, ``DV`` ``(B, Hkv, Nk, DV)``, ``DQ`` fp32 ``(B, 2H, Nq, D)``, contiguous.
    """
    ELT: tl.constexpr = Q.dtype.element_ty
    # operand type of the products: fp32 in the interpreter, whose bf16 product is wrong
    if UPCAST:
        MM: tl.constexpr = tl.float32
    else:
        MM: tl.constexpr = ELT  # type: ignore[no-redef]
    pid_n = tl.program_id(0)
    pid_bg = tl.program_id(1).to(tl.int64)
    b = pid_bg // Hkv
    g = pid_bg % Hkv
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV_)
    n_ok = offs_n < Nk

    k_off = offs_n[:, None] * skn + offs_d[None, :]
    k1_base = K + b * skb + (2 * g) * skh
    k1 = tl.load(k1_base + k_off, mask=n_ok[:, None], other=0.0).to(MM)
    k2 = tl.load(k1_base + skh + k_off, mask=n_ok[:, None], other=0.0).to(MM)
    v_ptrs = V + b * svb + g * svh + offs_n[:, None] * svn + offs_dv[None, :]
    v = tl.load(v_ptrs, mask=n_ok[:, None], other=0.0).to(MM)
    if HAS_KPB:
        kb = tl.load(KPB + b * skpb + offs_n, mask=n_ok, other=float("-inf")) * 1.4426950408889634
    else:
        kb = tl.zeros([BLOCK_N], dtype=tl.float32)
    lam = tl.load(LAM)

    dk1 = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dk2 = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, DV_], dtype=tl.float32)

    # query tiles [m_lo, m_mid) need the causal / key-bounds mask, [m_mid, Nq) do not
    if CAUSAL:
        diag = Nk - Nq
        m_lo = tl.maximum(start_n - diag, 0) // BLOCK_M * BLOCK_M
        m_full = tl.maximum(start_n + BLOCK_N - 1 - diag, 0)  # first row that sees every key of the tile
        m_mid = tl.maximum((m_full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, m_lo)
    else:
        m_lo = 0
        m_mid = 0
    nq_pad = (Nq + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    # a ragged last key tile needs the key-bounds mask for every query tile
    m_mid_c = tl.where(start_n + BLOCK_N > Nk, nq_pad, tl.minimum(m_mid, nq_pad))

    for hh in range(0, G):
        h = g * G + hh
        bh = b * H + h
        q1_base = Q + b * sqb + (2 * h) * sqh
        q2_base = q1_base + sqh
        do_base = DO + b * sdob + h * sdoh
        lse_base = LSE + bh * 2 * Nq
        delta_base = DELTA + bh * 2 * Nq
        bias_base = BIAS + b * sbb + h * sbh
        dq1_base = DQ + (b * 2 * H + 2 * h) * Nq * D
        dq2_base = dq1_base + Nq * D
        dk1, dk2, dv = _bwd_kv_loop(
            dk1, dk2, dv, k1, k2, v, kb, lam,
            q1_base, q2_base, do_base, lse_base, delta_base, bias_base, dq1_base, dq2_base,
            offs_n, offs_d, offs_dv, sqn, sdon, D, sbm, sbn, Nq, Nk, qk_scale, scale, m_lo, m_mid_c,
            BLOCK_M, True, CAUSAL, HAS_KPB, HAS_BIAS, DQ_ATOMIC, MM, ELT, PREC,
        )
        dk1, dk2, dv = _bwd_kv_loop(
            dk1, dk2, dv, k1, k2, v, kb, lam,
            q1_base, q2_base, do_base, lse_base, delta_base, bias_base, dq1_base, dq2_base,
            offs_n, offs_d, offs_dv, sqn, sdon, D, sbm, sbn, Nq, Nk, qk_scale, scale, m_mid_c, Nq,
            BLOCK_M, False, CAUSAL, HAS_KPB, HAS_BIAS, DQ_ATOMIC, MM, ELT, PREC,
        )

    dk_off = offs_n[:, None] * D + offs_d[None, :]
    dk1_base = DK + (b * 2 * Hkv + 2 * g) * Nk * D
    tl.store(dk1_base + dk_off, (dk1 * scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    tl.store(dk1_base + Nk * D + dk_off, (dk2 * scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    dv_ptrs = DV + (b * Hkv + g) * Nk * DV_ + offs_n[:, None] * DV_ + offs_dv[None, :]
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=n_ok[:, None])


@triton.jit
def _bwd_q_loop(
    dq1, dq2, q1, q2, do, lse1, lse2, dl1, dl2, lam,
    k1_base, k2_base, v_base, kpb_base, bias_base,
    offs_m, offs_d, offs_dv, skn, svn, sbm, sbn, Nq, Nk, qk_scale, lo, hi,
    BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr,
    HAS_BIAS: tl.constexpr, MM: tl.constexpr, ELT: tl.constexpr, PREC: tl.constexpr,
):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < Nk
        k_off = offs_n[:, None] * skn + offs_d[None, :]
        v_off = offs_n[:, None] * svn + offs_dv[None, :]
        if MASK:
            k1 = tl.load(k1_base + k_off, mask=n_ok[:, None], other=0.0).to(MM)
            k2 = tl.load(k2_base + k_off, mask=n_ok[:, None], other=0.0).to(MM)
            v = tl.load(v_base + v_off, mask=n_ok[:, None], other=0.0).to(MM)
        else:
            k1 = tl.load(k1_base + k_off).to(MM)
            k2 = tl.load(k2_base + k_off).to(MM)
            v = tl.load(v_base + v_off).to(MM)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
        if HAS_KPB:
            kb = tl.load(kpb_base + offs_n, mask=n_ok, other=float("-inf")) * 1.4426950408889634
            s1 += kb[None, :]
            s2 += kb[None, :]
        if HAS_BIAS:
            b_ptrs = bias_base + offs_m[:, None] * sbm + offs_n[None, :] * sbn
            bt = tl.load(b_ptrs, mask=(offs_m[:, None] < Nq) & n_ok[None, :], other=0.0) * 1.4426950408889634
            s1 += bt
            s2 += bt
        if MASK:
            allowed = n_ok[None, :]
            if CAUSAL:
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + (Nk - Nq))
            s1 = tl.where(allowed, s1, float("-inf"))
            s2 = tl.where(allowed, s2, float("-inf"))
        p1 = tl.math.exp2(s1 - lse1[:, None])
        p2 = tl.math.exp2(s2 - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds1 = p1 * (dp - dl1[:, None])
        ds2 = p2 * (dp - dl2[:, None]) * (-lam)
        dq1 += tl.dot(ds1.to(ELT).to(MM), k1, input_precision=PREC)
        dq2 += tl.dot(ds2.to(ELT).to(MM), k2, input_precision=PREC)
    return dq1, dq2


@triton.jit
def _bwd_q_kernel(
    Q, K, V, LAM, KPB, BIAS, DO, LSE, DELTA, DQ,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdon, skpb, sbb, sbh, sbm, sbn,
    H, G, Nq, Nk, qk_scale, scale,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr, HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """Deterministic dQ1, dQ2 of one query tile of one differential head; ``DQ`` is contiguous."""
    ELT: tl.constexpr = Q.dtype.element_ty
    # operand type of the products: fp32 in the interpreter, whose bf16 product is wrong
    if UPCAST:
        MM: tl.constexpr = tl.float32
    else:
        MM: tl.constexpr = ELT  # type: ignore[no-redef]
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    g = h // G
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < Nq

    q_off = offs_m[:, None] * sqn + offs_d[None, :]
    q1_base = Q + b * sqb + (2 * h) * sqh
    q1 = tl.load(q1_base + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    q2 = tl.load(q1_base + sqh + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    do_ptrs = DO + b * sdob + h * sdoh + offs_m[:, None] * sdon + offs_dv[None, :]
    do = tl.load(do_ptrs, mask=m_ok[:, None], other=0.0).to(MM)
    lse_base = LSE + pid_bh * 2 * Nq
    lse1 = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))
    lse2 = tl.load(lse_base + Nq + offs_m, mask=m_ok, other=float("inf"))
    delta_base = DELTA + pid_bh * 2 * Nq
    dl1 = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
    dl2 = tl.load(delta_base + Nq + offs_m, mask=m_ok, other=0.0)
    lam = tl.load(LAM)
    k1_base = K + b * skb + (2 * g) * skh
    k2_base = k1_base + skh
    v_base = V + b * svb + g * svh
    kpb_base = KPB + b * skpb
    bias_base = BIAS + b * sbb + h * sbh

    dq1 = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    dq2 = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    full_end, hi = _query_tile_bounds(start_m, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    dq1, dq2 = _bwd_q_loop(
        dq1, dq2, q1, q2, do, lse1, lse2, dl1, dl2, lam, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, skn, svn, sbm, sbn, Nq, Nk, qk_scale, 0, full_end,
        BLOCK_N, False, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )
    dq1, dq2 = _bwd_q_loop(
        dq1, dq2, q1, q2, do, lse1, lse2, dl1, dl2, lam, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, skn, svn, sbm, sbn, Nq, Nk, qk_scale, full_end, hi,
        BLOCK_N, True, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )
    dq_off = offs_m[:, None] * D + offs_d[None, :]
    dq1_base = DQ + (b * 2 * H + 2 * h) * Nq * D
    tl.store(dq1_base + dq_off, (dq1 * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None])
    tl.store(dq1_base + Nq * D + dq_off, (dq2 * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None])


# --------------------------------------------------------------------------------------------------
# Launch configurations. On CUDA the block sizes are autotuned over short lists per head width. The
# candidates were chosen from ptxas register / spill reports of sm_90a builds made without a GPU (the
# forward holds two accumulators of width 2d, the register state of standard attention at width 4d);
# they have not been timed. Each list ends with a small configuration that fits any supported width.
# In the interpreter the block sizes are fixed.
# --------------------------------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, num_warps, num_stages) for head widths d <= 64 and 64 < d <= 128
_FWD_CONFIGS = {
    64: [(64, 64, 8, 3), (128, 32, 8, 2), (128, 64, 8, 3), (64, 32, 4, 2), (32, 32, 4, 1)],
    128: [(64, 64, 8, 2), (64, 32, 8, 2), (64, 64, 8, 3), (32, 32, 4, 1)],
}
_BWD_KV_CONFIGS = {
    64: [(16, 64, 8, 1), (32, 32, 8, 1), (32, 64, 8, 1), (32, 64, 8, 2), (16, 32, 4, 1)],
    128: [(16, 32, 8, 1), (32, 32, 8, 1), (16, 64, 8, 1), (16, 32, 4, 1)],
}
_BWD_Q_CONFIGS = {
    64: [(64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2), (32, 32, 4, 1)],
    128: [(32, 64, 8, 2), (64, 32, 8, 2), (32, 32, 4, 1)],
}
_TUNE_KEY = ["D", "CAUSAL", "HAS_KPB", "HAS_BIAS"]


def _autotune(table: dict, key: list, **kwargs):
    union = sorted({c for cs in table.values() for c in cs})
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st) for m, n, w, st in union]

    def prune(configs, named_args, **kw):
        d = kw.get("D", named_args.get("D"))
        allowed = set(table[64 if d <= 64 else 128])
        kept = [
            c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in allowed
        ]
        return kept or configs

    return triton.autotune(configs, key=key, prune_configs_by={"early_config_prune": prune}, **kwargs)


if INTERPRET:
    _fwd = _fwd_kernel
    _bwd_kv = _bwd_kv_kernel
    _bwd_q = _bwd_q_kernel
else:  # pragma: no cover - needs a CUDA device
    _fwd = _autotune(_FWD_CONFIGS, _TUNE_KEY + ["DV"])(_fwd_kernel)
    _bwd_kv = _autotune(_BWD_KV_CONFIGS, _TUNE_KEY + ["DV_"], reset_to_zero=["DQ"])(_bwd_kv_kernel)
    _bwd_q = _autotune(_BWD_Q_CONFIGS, _TUNE_KEY + ["DV"])(_bwd_q_kernel)


def _interp_blocks() -> tuple[int, int]:
    return _forced_blocks or (64, 64)


def _block_kwargs() -> dict:
    if not INTERPRET:
        return {}
    bm, bn = _interp_blocks()
    return {"BLOCK_M": bm, "BLOCK_N": bn}


@contextlib.contextmanager
def _test_blocks(block_m: int, block_n: int) -> Iterator[None]:
    """Test hook: force interpreter block sizes (powers of two >= 16)."""
    global _forced_blocks
    old, _forced_blocks = _forced_blocks, (block_m, block_n)
    try:
        yield
    finally:
        _forced_blocks = old


def _alloc(shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    if _poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _mask_args(kpb: Tensor | None, bias: Tensor | None, dummy: Tensor) -> tuple:
    kpb_t, skpb = (dummy, 0) if kpb is None else (kpb, kpb.stride(0))
    if bias is None:
        return kpb_t, skpb, dummy, (0, 0, 0, 0)
    return kpb_t, skpb, bias, tuple(bias.stride())


def _forward_impl(
    q: Tensor, k: Tensor, v: Tensor, lam: Tensor, kpb: Tensor | None, bias: Tensor | None,
    causal: bool, scale: float, save_parts: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    B, H2, Nq, D = q.shape
    H, Hkv, Nk, DV = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
    out = _alloc((B, H, Nq, DV), q.dtype, q.device)
    parts = _alloc((B, H, 2, Nq, DV), q.dtype, q.device) if save_parts else q.new_empty(0)
    lse = _alloc((B, H, 2, Nq), torch.float32, q.device)
    if out.numel() == 0:
        return out, parts, lse
    kpb_t, skpb, bias_t, sb = _mask_args(kpb, bias, lse)
    grid = lambda meta: (triton.cdiv(Nq, meta["BLOCK_M"]), B * H)  # noqa: E731
    _fwd[grid](
        q, k, v, lam, kpb_t, bias_t, out, parts, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), skpb, *sb,
        H, H // Hkv, Nq, Nk, scale * _LOG2E,
        D=D, DV=DV, CAUSAL=causal, HAS_KPB=kpb is not None, HAS_BIAS=bias is not None, SAVE_PARTS=save_parts,
        UPCAST=INTERPRET, PREC=_precision(q.dtype), **_block_kwargs(),
    )
    return out, parts, lse


def _backward_impl(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lam: Tensor, kpb: Tensor | None, bias: Tensor | None,
    parts: Tensor, lse: Tensor, causal: bool, scale: float, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    B, H2, Nq, D = q.shape
    H, Hkv, Nk, DV = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dk = _alloc((B, 2 * Hkv, Nk, D), k.dtype, k.device)
    dv = _alloc((B, Hkv, Nk, DV), v.dtype, v.device)
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(lam)
    delta = _alloc((B, H, 2, Nq), torch.float32, q.device)
    # about 4K elements per tile and operand keeps the three fp32 tiles in registers
    bm_delta = _interp_blocks()[0] if INTERPRET else max(16, 4096 // DV)
    _bwd_delta_kernel[(triton.cdiv(Nq, bm_delta), B * H)](
        dout, parts, delta, dout.stride(0), dout.stride(1), dout.stride(2), H, Nq, DV=DV, BLOCK_M=bm_delta,
    )
    dlam = -delta[:, :, 1].sum()
    kpb_t, skpb, bias_t, sb = _mask_args(kpb, bias, delta)
    strides = (
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), dout.stride(0), dout.stride(1), dout.stride(2), skpb, *sb,
    )
    flags = dict(
        CAUSAL=causal, HAS_KPB=kpb is not None, HAS_BIAS=bias is not None, UPCAST=INTERPRET,
        PREC=_precision(q.dtype), **_block_kwargs(),
    )
    if deterministic:
        dq = _alloc(q.shape, q.dtype, q.device)
        dq_acc = torch.zeros(1, dtype=torch.float32, device=q.device)  # unused (the autotuner zeroes it)
    else:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    grid_kv = lambda meta: (triton.cdiv(Nk, meta["BLOCK_N"]), B * Hkv)  # noqa: E731
    _bwd_kv[grid_kv](
        q, k, v, lam, kpb_t, bias_t, dout, lse, delta, dq_acc, dk, dv, *strides,
        H, Hkv, G, Nq, Nk, scale * _LOG2E, scale, D=D, DV_=DV, DQ_ATOMIC=not deterministic, **flags,
    )
    if deterministic:
        grid_q = lambda meta: (triton.cdiv(Nq, meta["BLOCK_M"]), B * H)  # noqa: E731
        _bwd_q[grid_q](
            q, k, v, lam, kpb_t, bias_t, dout, lse, delta, dq, *strides,
            H, G, Nq, Nk, scale * _LOG2E, scale, D=D, DV=DV, **flags,
        )
    else:
        dq = dq_acc.to(q.dtype)
    return dq, dk, dv, dlam.reshape(lam.shape)


# --------------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, no graph break) with their autograd formula
# --------------------------------------------------------------------------------------------------


@torch.library.custom_op("diffzoo::triton_diff_attention_fwd", mutates_args=())
def _fwd_op(
    q: Tensor, k: Tensor, v: Tensor, lam: Tensor, kpb: Tensor | None, bias: Tensor | None,
    causal: bool, scale: float, save_parts: bool, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return _forward_impl(q, k, v, lam, kpb, bias, causal, scale, save_parts)


@_fwd_op.register_fake
def _(q, k, v, lam, kpb, bias, causal, scale, save_parts, deterministic):
    B, H2, Nq, _ = q.shape
    DV = v.shape[-1]
    parts = q.new_empty((B, H2 // 2, 2, Nq, DV)) if save_parts else q.new_empty(0)
    return q.new_empty((B, H2 // 2, Nq, DV)), parts, q.new_empty((B, H2 // 2, 2, Nq), dtype=torch.float32)


@torch.library.custom_op("diffzoo::triton_diff_attention_bwd", mutates_args=())
def _bwd_op(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lam: Tensor, kpb: Tensor | None, bias: Tensor | None,
    parts: Tensor, lse: Tensor, causal: bool, scale: float, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _backward_impl(dout, q, k, v, lam, kpb, bias, parts, lse, causal, scale, deterministic)


@_bwd_op.register_fake
def _(dout, q, k, v, lam, kpb, bias, parts, lse, causal, scale, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lam)


def _setup_context(ctx, inputs, output):
    q, k, v, lam, kpb, bias, causal, scale, save_parts, deterministic = inputs
    _, parts, lse = output
    ctx.save_for_backward(q, k, v, lam, kpb, bias, parts, lse)
    ctx.causal, ctx.scale, ctx.save_parts, ctx.deterministic = causal, scale, save_parts, deterministic


def _backward(ctx, dout, _dparts, _dlse):
    q, k, v, lam, kpb, bias, parts, lse = ctx.saved_tensors
    if not ctx.save_parts:
        raise RuntimeError("the triton differential attention forward ran without saving for backward")
    dq, dk, dv, dlam = _bwd_op(dout, q, k, v, lam, kpb, bias, parts, lse, ctx.causal, ctx.scale, ctx.deterministic)
    return dq, dk, dv, dlam, None, None, None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------


def _pad_width(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _check_tensors(q: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float) -> str | None:
    if dropout_p > 0.0:
        return "attention dropout is not implemented in the fused kernel"
    if q.dtype not in _DTYPES:
        return f"dtype {q.dtype} is not supported (float16, bfloat16 or float32)"
    if _INTERPRETER_BROKEN:
        return (
            "TRITON_INTERPRET=1 was set after triton had been imported (torch.compile imports it); "
            "set it before the process first imports triton"
        )
    if q.device.type != "cuda" and not INTERPRET:
        return (
            f"tensors on {q.device.type} need Triton's interpreter: set TRITON_INTERPRET=1 before "
            "the process first imports triton"
        )
    if q.dim() == 4 and q.shape[-1] > MAX_HEAD_DIM:
        return f"head width {q.shape[-1]} exceeds {MAX_HEAD_DIM}"
    if v.dim() == 4 and v.shape[-1] > MAX_VALUE_DIM:
        return f"value width {v.shape[-1]} exceeds {MAX_VALUE_DIM}"
    if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.requires_grad:
        return "no gradient with respect to a float attn_mask"
    return None


def unsupported(call: Call) -> str | None:
    """``None`` if the fused kernel can run ``call``, else the reason it cannot."""
    return _check_tensors(call.q, call.v, call.attn_mask, call.dropout_p)


def _attn_bias(attn_mask: Tensor | None, B: int, H: int, Nq: int, Nk: int) -> Tensor | None:
    """fp32 additive bias viewed as ``(B, H, Nq, Nk)`` with stride 0 on broadcast dimensions."""
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=torch.float32, device=attn_mask.device)
        bias.masked_fill_(~attn_mask, float("-inf"))
    else:
        bias = attn_mask.float()
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    return bias.expand(B, H, Nq, Nk)


def diff_attention_triton(
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
    """Fused differential flash attention; same signature and result as the reference backend.

    Args:
        q: ``(B, 2H, Nq, d)``, adjacent pairs of heads are ``(q1, q2)``; fp16, bf16 or fp32, ``d <= 128``.
        k: ``(B, 2H_kv, Nk, d)``, adjacent pairs are ``(k1, k2)`` of one key/value group.
        v: ``(B, H_kv, Nk, dv)``, ``dv <= 256``; differential head ``i`` uses group ``i // (H / H_kv)``.
        lam: scalar tensor (used in fp32; gets a gradient).
        attn_mask, key_padding_mask, causal: see :mod:`diffzoo.kernels._masks`.
        scale: logit scale, default ``d ** -0.5``.
        dropout_p: must be 0.

    Returns:
        ``(B, H, Nq, dv)`` in ``q.dtype``; rows with no allowed key are zero.
    """
    B, H, Hkv, Nq, Nk = check_attention_inputs(
        q, k, v, differential=True, attn_mask=attn_mask, key_padding_mask=key_padding_mask
    )
    reason = _check_tensors(q, v, attn_mask, dropout_p)
    if reason is not None:
        raise ValueError(f"the triton backend cannot run this call: {reason}")
    if lam.numel() != 1:
        raise ValueError(f"lam must be a scalar tensor, got shape {tuple(lam.shape)}")
    d, dv = q.shape[-1], v.shape[-1]
    scale = d**-0.5 if scale is None else float(scale)
    kpb = None
    if key_padding_mask is not None:
        kpb = torch.zeros((B, Nk), dtype=torch.float32, device=q.device).masked_fill_(key_padding_mask, float("-inf"))
    bias = _attn_bias(attn_mask, B, H, Nq, Nk)
    # zero-padding the widths to a power of two changes neither logits nor the kept output columns
    if _pad_width(d) != d:
        q = F.pad(q, (0, _pad_width(d) - d))
        k = F.pad(k, (0, _pad_width(d) - d))
    if _pad_width(dv) != dv:
        v = F.pad(v, (0, _pad_width(dv) - dv))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    lam32 = lam.reshape(()).to(device=q.device, dtype=torch.float32)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, lam32))
    deterministic = torch.are_deterministic_algorithms_enabled()
    out, _, _ = _fwd_op(q, k, v, lam32, kpb, bias, causal, scale, needs_grad, deterministic)
    return out[..., :dv] if out.shape[-1] != dv else out
