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
* **Backward dQ**, one of two paths: ``"atomic"``, the dK/dV program adds each key tile's share of dQ
  into an fp32 buffer with relaxed atomic adds (no recomputation); or ``"split"``, a separate
  atomic-free kernel (one program per query tile) recomputes ``P1, P2, dP`` and writes dQ once (no fp32
  buffer; 16 instead of 14 N^2 D FLOPs). ``DQ_DEFAULT`` picks the path per GPU family from timings on a
  GPU (docs/kernels.md); ``torch.are_deterministic_algorithms_enabled()`` always takes ``"split"`` and
  runs every kernel on its pinned configuration (no autotuning), so the result is bit-identical from one
  process to the next on the same GPU.

Launch geometry: one flat grid axis of ``row tiles x batch x heads`` programs (axis 0, not capped at
65,535), batch/head/row-block offsets in 64-bit arithmetic. A running maximum stays ``-inf`` while a
row has seen no allowed key (fully masked tiles: left padding, block-diagonal or sliding-window masks);
only the value subtracted from the logits is replaced by 0 then.

The backend is opt-in (``backend="triton"``): ``auto`` prefers SDPA on CUDA until these kernels have been
timed on a GPU (docs/kernels.md). It refuses, so that ``auto`` falls back, calls it would get wrong or run
slowly: dropout, a lambda per head or token, GPUs older than compute capability 8.0, fp32 without TF32.

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

from ._masks import check_attention_inputs, scalar_lambda_refusal
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


# --------------------------------------------------------------------------------------------------
# Device helpers
#
# Addressing: everything that can exceed 2**31 elements (batch, head and row-block offsets) is computed
# as a 64-bit scalar once per program or per tile; the offsets inside one tile stay 32-bit, which is
# safe because the wrapper refuses strides for which ``MAX_TILE * stride`` would not fit in int32.
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
def _program_tile(num_rows, BLOCK: tl.constexpr):
    """``(tile, row block start, batch*head index as int64)`` of this program in the flat 1-D grid.

    The grid is ``num_tiles * batch_heads`` programs on axis 0 (the axis CUDA does not cap at 65535).
    Consecutive programs share a head, so they read the same K/V (or Q) tiles from L2; tiles run in
    reverse order so that the longest causal tiles start first.
    """
    pid = tl.program_id(0)
    num_tiles = tl.cdiv(num_rows, BLOCK)
    tile = num_tiles - 1 - pid % num_tiles
    bh = (pid // num_tiles).to(tl.int64)
    return tile, tile * BLOCK, bh


@triton.jit
def _fwd_loop(
    acc1, acc2, l1, l2, m1, m2, q1, q2,
    k1_base, k2_base, v_base, kpb_base, bias_base,
    offs_m, offs_d, offs_dv, b_off, skn, svn, sbn, Nq, Nk, qk_scale, lo, hi,
    BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr,
    HAS_BIAS: tl.constexpr, MM: tl.constexpr, ELT: tl.constexpr, PREC: tl.constexpr,
):
    offs_n0 = tl.arange(0, BLOCK_N)
    kt_off = offs_n0[None, :] * skn + offs_d[:, None]  # (D, BLOCK_N): K^T, offsets inside one tile
    v_off = offs_n0[:, None] * svn + offs_dv[None, :]  # (BLOCK_N, DV)
    for start_n in range(lo, hi, BLOCK_N):
        n64 = tl.cast(start_n, tl.int64)
        offs_n = start_n + offs_n0
        n_ok = offs_n < Nk
        if MASK:
            k1t = tl.load(k1_base + n64 * skn + kt_off, mask=n_ok[None, :], other=0.0).to(MM)
            k2t = tl.load(k2_base + n64 * skn + kt_off, mask=n_ok[None, :], other=0.0).to(MM)
            v = tl.load(v_base + n64 * svn + v_off, mask=n_ok[:, None], other=0.0).to(MM)
        else:
            k1t = tl.load(k1_base + n64 * skn + kt_off).to(MM)
            k2t = tl.load(k2_base + n64 * skn + kt_off).to(MM)
            v = tl.load(v_base + n64 * svn + v_off).to(MM)
        s1 = tl.dot(q1, k1t, input_precision=PREC) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        s2 = tl.dot(q2, k2t, input_precision=PREC) * qk_scale
        if HAS_KPB:
            kb = tl.load(kpb_base + offs_n, mask=n_ok, other=float("-inf")) * 1.4426950408889634
            s1 += kb[None, :]
            s2 += kb[None, :]
        if HAS_BIAS:
            b_mask = (offs_m[:, None] < Nq) & n_ok[None, :]
            bt = tl.load(bias_base + n64 * sbn + b_off, mask=b_mask, other=0.0) * 1.4426950408889634
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
        # The running maxima keep -inf while a row has seen no allowed key; only the value subtracted
        # is replaced by 0 then, so that -inf - -inf never makes a NaN. (Storing the 0 as the running
        # maximum would make every later tile exponentiate against 0 instead of its own maximum.)
        if MASK or HAS_KPB or HAS_BIAS:
            m1_sub = tl.where(m1_new == float("-inf"), 0.0, m1_new)
            m2_sub = tl.where(m2_new == float("-inf"), 0.0, m2_new)
        else:
            m1_sub = m1_new
            m2_sub = m2_new
        p1 = tl.math.exp2(s1 - m1_sub[:, None])
        p2 = tl.math.exp2(s2 - m2_sub[:, None])
        alpha1 = tl.math.exp2(m1 - m1_sub)
        alpha2 = tl.math.exp2(m2 - m2_sub)
        l1 = l1 * alpha1 + tl.sum(p1, 1)
        l2 = l2 * alpha2 + tl.sum(p2, 1)
        pv1 = tl.dot(p1.to(ELT).to(MM), v, input_precision=PREC)
        pv2 = tl.dot(p2.to(ELT).to(MM), v, input_precision=PREC)
        acc1 = acc1 * alpha1[:, None] + pv1
        acc2 = acc2 * alpha2[:, None] + pv2
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
    H, G, Nq, Nk, qk_scale, NQ_BUCKET, NK_BUCKET,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr, HAS_BIAS: tl.constexpr, SAVE_PARTS: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """One block of ``BLOCK_M`` query rows of one differential head. ``N*_BUCKET`` only key the autotuner."""
    ELT: tl.constexpr = Q.dtype.element_ty
    # operand type of the products: fp32 in the interpreter, whose bf16 product is wrong
    if UPCAST:
        MM: tl.constexpr = tl.float32
    else:
        MM: tl.constexpr = ELT  # type: ignore[no-redef]
    _, start_m, pid_bh = _program_tile(Nq, BLOCK_M)
    b = pid_bh // H
    h = pid_bh % H
    g = h // G
    m64 = tl.cast(start_m, tl.int64)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < Nq

    q_off = offs_m0[:, None] * sqn + offs_d[None, :]
    q1_base = Q + b * sqb + (2 * h) * sqh + m64 * sqn
    q1 = tl.load(q1_base + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    q2 = tl.load(q1_base + sqh + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    k1_base = K + b * skb + (2 * g) * skh
    k2_base = k1_base + skh
    v_base = V + b * svb + g * svh
    kpb_base = KPB + b * skpb
    bias_base = BIAS + b * sbb + h * sbh + m64 * sbm

    b_off = offs_m0[:, None] * sbm + tl.arange(0, BLOCK_N)[None, :] * sbn  # bias tile, inside one tile
    acc1 = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    m1 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    full_end, hi = _query_tile_bounds(start_m, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    acc1, acc2, l1, l2, m1, m2 = _fwd_loop(
        acc1, acc2, l1, l2, m1, m2, q1, q2, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, b_off, skn, svn, sbn, Nq, Nk, qk_scale, 0, full_end,
        BLOCK_N, False, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )
    acc1, acc2, l1, l2, m1, m2 = _fwd_loop(
        acc1, acc2, l1, l2, m1, m2, q1, q2, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, b_off, skn, svn, sbn, Nq, Nk, qk_scale, full_end, hi,
        BLOCK_N, True, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )

    # rows with no allowed key: l == 0, acc == 0 -> output 0, log-sum-exp +inf
    l1_safe = tl.where(l1 > 0.0, l1, 1.0)
    l2_safe = tl.where(l2 > 0.0, l2, 1.0)
    o1 = acc1 / l1_safe[:, None]
    o2 = acc2 / l2_safe[:, None]
    lam = tl.load(LAM)
    out = o1 - lam * o2
    o_ptrs = OUT + b * sob + h * soh + m64 * son + (offs_m0[:, None] * son + offs_dv[None, :])
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=m_ok[:, None])
    lse_base = LSE + pid_bh * 2 * Nq
    tl.store(lse_base + offs_m, tl.where(l1 > 0.0, m1 + tl.math.log2(l1_safe), float("inf")), mask=m_ok)
    tl.store(lse_base + Nq + offs_m, tl.where(l2 > 0.0, m2 + tl.math.log2(l2_safe), float("inf")), mask=m_ok)
    if SAVE_PARTS:
        p_off = offs_m0[:, None] * DV + offs_dv[None, :]
        p1_base = PARTS + (pid_bh * 2) * Nq * DV + m64 * DV
        p2_base = PARTS + (pid_bh * 2 + 1) * Nq * DV + m64 * DV
        tl.store(p1_base + p_off, o1.to(PARTS.dtype.element_ty), mask=m_ok[:, None])
        tl.store(p2_base + p_off, o2.to(PARTS.dtype.element_ty), mask=m_ok[:, None])


# --------------------------------------------------------------------------------------------------
# Backward kernels
# --------------------------------------------------------------------------------------------------


@triton.jit
def _bwd_delta_kernel(
    DO, PARTS, DELTA, sdob, sdoh, sdon, H, Nq,
    DV: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """``D1 = rowsum(dO * O1)``, ``D2 = rowsum(dO * O2)`` in fp32, stored as ``(B, H, 2, Nq)``."""
    _, start_m, pid_bh = _program_tile(Nq, BLOCK_M)
    b = pid_bh // H
    h = pid_bh % H
    m64 = tl.cast(start_m, tl.int64)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < Nq
    do_ptrs = DO + b * sdob + h * sdoh + m64 * sdon + (offs_m0[:, None] * sdon + offs_dv[None, :])
    do = tl.load(do_ptrs, mask=m_ok[:, None], other=0.0).to(tl.float32)
    p_off = offs_m0[:, None] * DV + offs_dv[None, :]
    p1_base = PARTS + (pid_bh * 2) * Nq * DV + m64 * DV
    p2_base = PARTS + (pid_bh * 2 + 1) * Nq * DV + m64 * DV
    o1 = tl.load(p1_base + p_off, mask=m_ok[:, None], other=0.0).to(tl.float32)
    o2 = tl.load(p2_base + p_off, mask=m_ok[:, None], other=0.0).to(tl.float32)
    d_base = DELTA + pid_bh * 2 * Nq
    tl.store(d_base + offs_m, tl.sum(do * o1, 1), mask=m_ok)
    tl.store(d_base + Nq + offs_m, tl.sum(do * o2, 1), mask=m_ok)


@triton.jit
def _bwd_kv_loop(
    dk1, dk2, dv, k1, k2, v, kb, lam,
    q1_base, q2_base, do_base, lse_base, delta_base, bias_base, dq1_base, dq2_base,
    offs_n, offs_n0, offs_d, offs_dv, sqn, sdon, sbm, sbn, Nq, Nk, qk_scale, scale, lo, hi,
    BLOCK_M: tl.constexpr, D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr,
    HAS_BIAS: tl.constexpr, DQ_ATOMIC: tl.constexpr, MM: tl.constexpr, ELT: tl.constexpr, PREC: tl.constexpr,
):
    offs_m0 = tl.arange(0, BLOCK_M)
    n_ok = offs_n < Nk
    q_off = offs_m0[:, None] * sqn + offs_d[None, :]
    do_off = offs_m0[:, None] * sdon + offs_dv[None, :]
    dq_off = offs_m0[:, None] * D + offs_d[None, :]
    b_off = offs_m0[None, :] * sbm + offs_n0[:, None] * sbn
    for start_m in range(lo, hi, BLOCK_M):
        m64 = tl.cast(start_m, tl.int64)
        offs_m = start_m + offs_m0
        m_ok = offs_m < Nq
        q1 = tl.load(q1_base + m64 * sqn + q_off, mask=m_ok[:, None], other=0.0).to(MM)
        q2 = tl.load(q2_base + m64 * sqn + q_off, mask=m_ok[:, None], other=0.0).to(MM)
        do = tl.load(do_base + m64 * sdon + do_off, mask=m_ok[:, None], other=0.0).to(MM)
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
            bt = tl.load(bias_base + m64 * sbm + b_off, mask=m_ok[None, :] & n_ok[:, None], other=0.0)
            s1 += bt * 1.4426950408889634
            s2 += bt * 1.4426950408889634
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
            dq1 = tl.dot(tl.trans(ds1.to(ELT).to(MM)), k1, input_precision=PREC) * scale
            dq2 = tl.dot(tl.trans(ds2.to(ELT).to(MM)), k2, input_precision=PREC) * scale
            # relaxed: the sums need no ordering with other memory operations (acq_rel would put a
            # GPU-wide fence around every add of the innermost loop)
            tl.atomic_add(dq1_base + m64 * D + dq_off, dq1, mask=m_ok[:, None], sem="relaxed")
            tl.atomic_add(dq2_base + m64 * D + dq_off, dq2, mask=m_ok[:, None], sem="relaxed")
    return dk1, dk2, dv


@triton.jit
def _bwd_kv_kernel(
    Q, K, V, LAM, KPB, BIAS, DO, LSE, DELTA, DQ, DK, DVG,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdon, skpb, sbb, sbh, sbm, sbn,
    H, Hkv, G, Nq, Nk, qk_scale, scale, NQ_BUCKET, NK_BUCKET,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr, HAS_BIAS: tl.constexpr, DQ_ATOMIC: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """dK1, dK2, dV of one key tile of one key/value group (and dQ by atomics if DQ_ATOMIC).

    ``DK`` is ``(B, 2Hkv, Nk, D)``, ``DVG`` ``(B, Hkv, Nk, DV)``, ``DQ`` fp32 ``(B, 2H, Nq, D)``, contiguous.
    """
    ELT: tl.constexpr = Q.dtype.element_ty
    # operand type of the products: fp32 in the interpreter, whose bf16 product is wrong
    if UPCAST:
        MM: tl.constexpr = tl.float32
    else:
        MM: tl.constexpr = ELT  # type: ignore[no-redef]
    _, start_n, pid_bg = _program_tile(Nk, BLOCK_N)
    b = pid_bg // Hkv
    g = pid_bg % Hkv
    n64 = tl.cast(start_n, tl.int64)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_n = start_n + offs_n0
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    n_ok = offs_n < Nk

    k_off = offs_n0[:, None] * skn + offs_d[None, :]
    k1_base = K + b * skb + (2 * g) * skh + n64 * skn
    k1 = tl.load(k1_base + k_off, mask=n_ok[:, None], other=0.0).to(MM)
    k2 = tl.load(k1_base + skh + k_off, mask=n_ok[:, None], other=0.0).to(MM)
    v_ptrs = V + b * svb + g * svh + n64 * svn + (offs_n0[:, None] * svn + offs_dv[None, :])
    v = tl.load(v_ptrs, mask=n_ok[:, None], other=0.0).to(MM)
    if HAS_KPB:
        kb = tl.load(KPB + b * skpb + offs_n, mask=n_ok, other=float("-inf")) * 1.4426950408889634
    else:
        kb = tl.zeros([BLOCK_N], dtype=tl.float32)
    lam = tl.load(LAM)

    dk1 = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dk2 = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, DV], dtype=tl.float32)

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
        bias_base = BIAS + b * sbb + h * sbh + n64 * sbn
        dq1_base = DQ + (b * 2 * H + 2 * h) * Nq * D
        dq2_base = DQ + (b * 2 * H + 2 * h + 1) * Nq * D
        dk1, dk2, dv = _bwd_kv_loop(
            dk1, dk2, dv, k1, k2, v, kb, lam,
            q1_base, q2_base, do_base, lse_base, delta_base, bias_base, dq1_base, dq2_base,
            offs_n, offs_n0, offs_d, offs_dv, sqn, sdon, sbm, sbn, Nq, Nk, qk_scale, scale, m_lo, m_mid_c,
            BLOCK_M, D, True, CAUSAL, HAS_KPB, HAS_BIAS, DQ_ATOMIC, MM, ELT, PREC,
        )
        dk1, dk2, dv = _bwd_kv_loop(
            dk1, dk2, dv, k1, k2, v, kb, lam,
            q1_base, q2_base, do_base, lse_base, delta_base, bias_base, dq1_base, dq2_base,
            offs_n, offs_n0, offs_d, offs_dv, sqn, sdon, sbm, sbn, Nq, Nk, qk_scale, scale, m_mid_c, Nq,
            BLOCK_M, D, False, CAUSAL, HAS_KPB, HAS_BIAS, DQ_ATOMIC, MM, ELT, PREC,
        )

    dk_off = offs_n0[:, None] * D + offs_d[None, :]
    dk1_base = DK + (b * 2 * Hkv + 2 * g) * Nk * D + n64 * D
    dk2_base = DK + (b * 2 * Hkv + 2 * g + 1) * Nk * D + n64 * D
    tl.store(dk1_base + dk_off, (dk1 * scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    tl.store(dk2_base + dk_off, (dk2 * scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    dv_ptrs = DVG + (b * Hkv + g) * Nk * DV + n64 * DV + (offs_n0[:, None] * DV + offs_dv[None, :])
    tl.store(dv_ptrs, dv.to(DVG.dtype.element_ty), mask=n_ok[:, None])


@triton.jit
def _bwd_q_loop(
    dq1, dq2, q1, q2, do, lse1, lse2, dl1, dl2, lam,
    k1_base, k2_base, v_base, kpb_base, bias_base,
    offs_m, offs_d, offs_dv, b_off, skn, svn, sbn, Nq, Nk, qk_scale, lo, hi,
    BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr,
    HAS_BIAS: tl.constexpr, MM: tl.constexpr, ELT: tl.constexpr, PREC: tl.constexpr,
):
    offs_n0 = tl.arange(0, BLOCK_N)
    k_off = offs_n0[:, None] * skn + offs_d[None, :]
    v_off = offs_n0[:, None] * svn + offs_dv[None, :]
    for start_n in range(lo, hi, BLOCK_N):
        n64 = tl.cast(start_n, tl.int64)
        offs_n = start_n + offs_n0
        n_ok = offs_n < Nk
        if MASK:
            k1 = tl.load(k1_base + n64 * skn + k_off, mask=n_ok[:, None], other=0.0).to(MM)
            k2 = tl.load(k2_base + n64 * skn + k_off, mask=n_ok[:, None], other=0.0).to(MM)
            v = tl.load(v_base + n64 * svn + v_off, mask=n_ok[:, None], other=0.0).to(MM)
        else:
            k1 = tl.load(k1_base + n64 * skn + k_off).to(MM)
            k2 = tl.load(k2_base + n64 * skn + k_off).to(MM)
            v = tl.load(v_base + n64 * svn + v_off).to(MM)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
        if HAS_KPB:
            kb = tl.load(kpb_base + offs_n, mask=n_ok, other=float("-inf")) * 1.4426950408889634
            s1 += kb[None, :]
            s2 += kb[None, :]
        if HAS_BIAS:
            b_mask = (offs_m[:, None] < Nq) & n_ok[None, :]
            bt = tl.load(bias_base + n64 * sbn + b_off, mask=b_mask, other=0.0) * 1.4426950408889634
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
    H, G, Nq, Nk, qk_scale, scale, NQ_BUCKET, NK_BUCKET,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPB: tl.constexpr, HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """dQ1, dQ2 of one query tile of one differential head, without atomics; ``DQ`` is contiguous."""
    ELT: tl.constexpr = Q.dtype.element_ty
    # operand type of the products: fp32 in the interpreter, whose bf16 product is wrong
    if UPCAST:
        MM: tl.constexpr = tl.float32
    else:
        MM: tl.constexpr = ELT  # type: ignore[no-redef]
    _, start_m, pid_bh = _program_tile(Nq, BLOCK_M)
    b = pid_bh // H
    h = pid_bh % H
    g = h // G
    m64 = tl.cast(start_m, tl.int64)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_m0
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < Nq

    q_off = offs_m0[:, None] * sqn + offs_d[None, :]
    q1_base = Q + b * sqb + (2 * h) * sqh + m64 * sqn
    q1 = tl.load(q1_base + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    q2 = tl.load(q1_base + sqh + q_off, mask=m_ok[:, None], other=0.0).to(MM)
    do_ptrs = DO + b * sdob + h * sdoh + m64 * sdon + (offs_m0[:, None] * sdon + offs_dv[None, :])
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
    bias_base = BIAS + b * sbb + h * sbh + m64 * sbm

    b_off = offs_m0[:, None] * sbm + tl.arange(0, BLOCK_N)[None, :] * sbn  # bias tile, inside one tile
    dq1 = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    dq2 = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    full_end, hi = _query_tile_bounds(start_m, Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    dq1, dq2 = _bwd_q_loop(
        dq1, dq2, q1, q2, do, lse1, lse2, dl1, dl2, lam, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, b_off, skn, svn, sbn, Nq, Nk, qk_scale, 0, full_end,
        BLOCK_N, False, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )
    dq1, dq2 = _bwd_q_loop(
        dq1, dq2, q1, q2, do, lse1, lse2, dl1, dl2, lam, k1_base, k2_base, v_base, kpb_base, bias_base,
        offs_m, offs_d, offs_dv, b_off, skn, svn, sbn, Nq, Nk, qk_scale, full_end, hi,
        BLOCK_N, True, CAUSAL, HAS_KPB, HAS_BIAS, MM, ELT, PREC,
    )
    dq_off = offs_m0[:, None] * D + offs_d[None, :]
    dq1_base = DQ + (b * 2 * H + 2 * h) * Nq * D + m64 * D
    dq2_base = DQ + (b * 2 * H + 2 * h + 1) * Nq * D + m64 * D
    tl.store(dq1_base + dq_off, (dq1 * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None])
    tl.store(dq2_base + dq_off, (dq2 * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None])


# --------------------------------------------------------------------------------------------------
# Launch configurations
#
# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel, target family and head width (d <= 64 and
# 64 < d <= 128). BLOCK_M counts query rows and BLOCK_N key rows in every kernel. The lists were chosen
# from the static build report (``python -m benchmarks.kernels --static``, which compiles each entry
# exactly as a launch specialises it, for sm_90a and sm_80, and reads registers, spills, shared memory,
# the MMA instruction of every product, replicated score tiles, pipelining and atomic semantics); the
# rules and the exceptions are in docs/kernels.md, and tests/test_triton_static.py re-checks them. On
# CUDA the autotuner times the list of the device's family; the first entry is the pinned configuration,
# used without timing when deterministic algorithms are enabled, so that results are bit-identical
# across processes. In the interpreter the block sizes are fixed (64, or the test hook's).
# --------------------------------------------------------------------------------------------------

Config = tuple[int, int, int, int]
CONFIGS: dict[str, dict[str, dict[int, list[Config]]]] = {
    "fwd": {
        "sm90": {64: [(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3)],
                 128: [(64, 64, 8, 3), (64, 64, 8, 2), (64, 32, 8, 3)]},
        "sm80": {64: [(64, 64, 8, 2), (64, 64, 8, 3), (128, 32, 8, 3)], 128: [(32, 32, 8, 2), (32, 16, 4, 2)]},
    },
    "bwd_kv": {
        "sm90": {64: [(32, 128, 8, 3), (32, 64, 4, 3), (16, 128, 8, 3)], 128: [(32, 64, 8, 3), (32, 32, 8, 2)]},
        "sm80": {64: [(32, 32, 4, 2)], 128: [(32, 32, 8, 2)]},
    },
    "bwd_q": {
        "sm90": {64: [(128, 64, 8, 3), (128, 32, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2)],
                 128: [(128, 32, 8, 3), (128, 32, 8, 2)]},
        "sm80": {64: [(64, 32, 4, 2), (128, 32, 8, 2)], 128: [(32, 32, 4, 2), (64, 64, 8, 2)]},
    },
}
KERNELS = {"fwd": _fwd_kernel, "bwd_kv": _bwd_kv_kernel, "bwd_q": _bwd_q_kernel}
# Autotuning key: the compile-time flags and the sequence lengths in powers of two, so that a new length
# bucket is timed again while a kv-cache that grows by one token is not.
# DQ_ATOMIC (dK/dV kernel only; a key a kernel lacks is ignored) keeps the two dQ paths' timings apart.
TUNE_KEY = ["D", "DV", "CAUSAL", "HAS_KPB", "HAS_BIAS", "NQ_BUCKET", "NK_BUCKET", "DQ_ATOMIC"]
MAX_TILE = 128  # the largest BLOCK_M / BLOCK_N of any configuration (bounds the 32-bit in-tile offsets)
_INT32_MAX = 2**31 - 1


def width_bucket(d: int) -> int:
    return 64 if d <= 64 else 128


def target_family(capability: tuple[int, int]) -> str:
    """Configuration family of a CUDA compute capability: Hopper's tables, or the Ampere ones for others."""
    return "sm90" if capability[0] == 9 else "sm80"


def length_bucket(n: int) -> int:
    return min(max(16, triton.next_power_of_2(max(n, 1))), 1 << 16)


def _device_family() -> str:
    return target_family(torch.cuda.get_device_capability())


def _autotune(kind: str, **kwargs):
    table = CONFIGS[kind]
    union = sorted({c for fam in table.values() for cs in fam.values() for c in cs})
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st) for m, n, w, st in union]

    def prune(configs, named_args, **kw):
        d = kw.get("D", named_args.get("D"))
        allowed = table[_device_family()][width_bucket(d)]
        by_key = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages): c for c in configs}
        return [by_key[c] for c in allowed]

    return triton.autotune(configs, key=TUNE_KEY, prune_configs_by={"early_config_prune": prune}, **kwargs)


# On CUDA the kernels launch through these autotuners; the interpreter and pinned launches bypass them.
TUNED = {
    "fwd": _autotune("fwd")(_fwd_kernel),
    "bwd_kv": _autotune("bwd_kv", reset_to_zero=["DQ"])(_bwd_kv_kernel),
    "bwd_q": _autotune("bwd_q")(_bwd_q_kernel),
}

# dQ path of the backward when deterministic algorithms are off, per configuration family. Hopper: "split"
# (the atomic-free dQ kernel), whose forward + backward ran 0.87-1.01x the atomic path's time in 19 of 20
# cells on an H100 (median 0.91x; docs/kernels.md, "A third H100 lease"). Ampere keeps "atomic": no GPU of
# that family has timed the two (``python -m benchmarks.kernels --compare-dq`` does).
DQ_PATHS = ("atomic", "split")
DQ_DEFAULT = {"sm90": "split", "sm80": "atomic"}

# Test hooks: fill every output buffer with NaN before the kernels write (catches unwritten elements),
# and force a configuration per kernel (block sizes alone in the interpreter).
_poison = False
_forced: dict[str, Config] = {}
_forced_dq: str | None = None


@contextlib.contextmanager
def forced_config(kind: str, config: Config) -> Iterator[None]:
    """Launch kernel ``kind`` (``"fwd"``, ``"bwd_kv"``, ``"bwd_q"``) with ``config`` alone, untimed.

    For tests and benchmarks of one configuration; in the interpreter only the block sizes apply.
    """
    if kind not in KERNELS:
        raise ValueError(f"unknown kernel {kind!r}; choose from {sorted(KERNELS)}")
    old = _forced.get(kind)
    _forced[kind] = config
    try:
        yield
    finally:
        if old is None:
            _forced.pop(kind, None)
        else:
            _forced[kind] = old


@contextlib.contextmanager
def dq_path(path: str) -> Iterator[None]:
    """Compute dQ by ``path`` (``"atomic"`` or ``"split"``) instead of the device's default, for tests and
    benchmarks; deterministic algorithms still take ``"split"``."""
    global _forced_dq
    if path not in DQ_PATHS:
        raise ValueError(f"unknown dQ path {path!r}; choose from {list(DQ_PATHS)}")
    old, _forced_dq = _forced_dq, path
    try:
        yield
    finally:
        _forced_dq = old


def _split_dq(deterministic: bool) -> bool:
    """Whether the backward computes dQ in the atomic-free kernel."""
    if deterministic:
        return True
    if _forced_dq is not None:
        return _forced_dq == "split"
    if INTERPRET:  # no device family on CPU: the interpreter's default path is the atomic one
        return False
    return DQ_DEFAULT[_device_family()] == "split"  # pragma: no cover - needs a CUDA device


@contextlib.contextmanager
def _test_blocks(block_m: int, block_n: int) -> Iterator[None]:
    """Test hook: the same block sizes for every kernel (powers of two >= 16)."""
    with contextlib.ExitStack() as stack:
        for kind in KERNELS:
            stack.enter_context(forced_config(kind, (block_m, block_n, 4, 1)))
        yield


def _interp_blocks() -> tuple[int, int]:
    return _forced["fwd"][:2] if "fwd" in _forced else (64, 64)


def _run_kernel(kernel, grid, args: tuple, kwargs: dict) -> None:
    """Every launch of this module goes through here (tests record the grids)."""
    kernel[grid](*args, **kwargs)


def _launch(kind: str, grid, args: tuple, consts: dict, deterministic: bool) -> None:
    config = _forced.get(kind)
    if INTERPRET:
        bm, bn = config[:2] if config else (64, 64)
        _run_kernel(KERNELS[kind], grid, args, dict(consts, BLOCK_M=bm, BLOCK_N=bn))
        return
    if config is None and deterministic:
        config = CONFIGS[kind][_device_family()][width_bucket(consts["D"])][0]
    if config is None:  # pragma: no cover - needs a CUDA device
        _run_kernel(TUNED[kind], grid, args, consts)
    else:  # pragma: no cover - needs a CUDA device
        bm, bn, warps, stages = config
        _run_kernel(KERNELS[kind], grid, args, dict(consts, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                                                    num_stages=stages))


def _alloc(shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    if _poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def tf32_enabled() -> bool:
    """Whether fp32 CUDA matmuls may use TF32, read through the current precision API.

    ``torch.backends.cuda.matmul.fp32_precision`` also reflects the legacy ``allow_tf32`` flag, while
    reading the legacy flag raises once the new API has been used.
    """
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if precision is not None:
        return precision == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)  # pragma: no cover - torch without the new API


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not tf32_enabled():
        return "ieee"
    return "tf32"


def _mask_args(kpb: Tensor | None, bias: Tensor | None, dummy: Tensor) -> tuple:
    kpb_t, skpb = (dummy, 0) if kpb is None else (kpb, kpb.stride(0))
    if bias is None:
        return kpb_t, skpb, dummy, (0, 0, 0, 0)
    return kpb_t, skpb, bias, tuple(bias.stride())


def _forward_impl(
    q: Tensor, k: Tensor, v: Tensor, lam: Tensor, kpb: Tensor | None, bias: Tensor | None,
    causal: bool, scale: float, save_parts: bool, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    B, H2, Nq, D = q.shape
    H, Hkv, Nk, DV = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
    out = _alloc((B, H, Nq, DV), q.dtype, q.device)
    parts = _alloc((B, H, 2, Nq, DV), q.dtype, q.device) if save_parts else q.new_empty(0)
    lse = _alloc((B, H, 2, Nq), torch.float32, q.device)
    if out.numel() == 0:
        return out, parts, lse
    kpb_t, skpb, bias_t, sb = _mask_args(kpb, bias, lse)
    args = (
        q, k, v, lam, kpb_t, bias_t, out, parts, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), skpb, *sb,
        H, H // Hkv, Nq, Nk, scale * _LOG2E, length_bucket(Nq), length_bucket(Nk),
    )
    consts = dict(
        D=D, DV=DV, CAUSAL=causal, HAS_KPB=kpb is not None, HAS_BIAS=bias is not None, SAVE_PARTS=save_parts,
        UPCAST=INTERPRET, PREC=_precision(q.dtype),
    )
    grid = lambda meta: (triton.cdiv(Nq, meta["BLOCK_M"]) * B * H,)  # noqa: E731
    _launch("fwd", grid, args, consts, deterministic)
    return out, parts, lse


def _backward_impl(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lam: Tensor, kpb: Tensor | None, bias: Tensor | None,
    parts: Tensor, lse: Tensor, causal: bool, scale: float, deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    B, H2, Nq, D = q.shape
    H, Hkv, Nk, DV = H2 // 2, v.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    if q.numel() == 0 or k.numel() == 0:
        # gradients are returned contiguous, as the kernels write them (the fake kernel says so too)
        zeros = [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v, lam)]
        return zeros[0], zeros[1], zeros[2], zeros[3]
    if dout.stride(-1) != 1 or dout.stride(2) * MAX_TILE > _INT32_MAX:
        dout = dout.contiguous()
    dk = _alloc((B, 2 * Hkv, Nk, D), k.dtype, k.device)
    dv = _alloc((B, Hkv, Nk, DV), v.dtype, v.device)
    delta = _alloc((B, H, 2, Nq), torch.float32, q.device)
    # about 4K elements per tile and operand keeps the three fp32 tiles in registers
    bm_delta = _interp_blocks()[0] if INTERPRET else max(16, 4096 // DV)
    _run_kernel(
        _bwd_delta_kernel, (triton.cdiv(Nq, bm_delta) * B * H,),
        (dout, parts, delta, dout.stride(0), dout.stride(1), dout.stride(2), H, Nq), dict(DV=DV, BLOCK_M=bm_delta),
    )
    dlam = -delta[:, :, 1].sum()
    kpb_t, skpb, bias_t, sb = _mask_args(kpb, bias, delta)
    strides = (
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), dout.stride(0), dout.stride(1), dout.stride(2), skpb, *sb,
    )
    buckets = (length_bucket(Nq), length_bucket(Nk))
    consts = dict(
        D=D, DV=DV, CAUSAL=causal, HAS_KPB=kpb is not None, HAS_BIAS=bias is not None, UPCAST=INTERPRET,
        PREC=_precision(q.dtype),
    )
    split = _split_dq(deterministic)
    if split:
        dq = _alloc(q.shape, q.dtype, q.device)
        dq_acc = torch.zeros(1, dtype=torch.float32, device=q.device)  # unused
    else:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    grid_kv = lambda meta: (triton.cdiv(Nk, meta["BLOCK_N"]) * B * Hkv,)  # noqa: E731
    _launch(
        "bwd_kv", grid_kv,
        (q, k, v, lam, kpb_t, bias_t, dout, lse, delta, dq_acc, dk, dv, *strides,
         H, Hkv, G, Nq, Nk, scale * _LOG2E, scale, *buckets),
        dict(consts, DQ_ATOMIC=not split), deterministic,
    )
    if split:
        grid_q = lambda meta: (triton.cdiv(Nq, meta["BLOCK_M"]) * B * H,)  # noqa: E731
        _launch(
            "bwd_q", grid_q,
            (q, k, v, lam, kpb_t, bias_t, dout, lse, delta, dq, *strides, H, G, Nq, Nk, scale * _LOG2E, scale,
             *buckets),
            consts, deterministic,
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
    return _forward_impl(q, k, v, lam, kpb, bias, causal, scale, save_parts, deterministic)


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
    # the kernels write contiguous gradients whatever the strides of q, k, v
    return tuple(t.new_empty(t.shape) for t in (q, k, v, lam))


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


def _token_stride(t: Tensor) -> int:
    """Stride between tokens of ``t`` as the kernels see it (a tensor without unit last stride is copied)."""
    return t.stride(2) if t.stride(-1) == 1 else t.shape[-1]


def _device_refusal(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the compiled kernels would be slow on this CUDA device and dtype, or ``None``."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return (
            f"compute capability {major}.{minor}: the kernels need tensor cores with bf16/tf32 "
            "(8.0 or newer); older GPUs would run every product on FMA units"
        )
    if dtype == torch.float32 and not tf32_enabled():
        return (
            "float32 without TF32 would run the products on FMA units with register spills; enable TF32 "
            "(torch.backends.cuda.matmul.fp32_precision = 'tf32') or use bfloat16 / float16"
        )
    return None


def _refusal(
    q: Tensor, k: Tensor, v: Tensor, lam: Tensor | None, attn_mask: Tensor | None, dropout_p: float
) -> str | None:
    """Why the fused kernel must not run this call (wrong, unsupported or slow there), or ``None``."""
    if dropout_p > 0.0:
        return "attention dropout is not implemented in the fused kernel"
    if q.dtype not in _DTYPES:
        return f"dtype {q.dtype} is not supported (float16, bfloat16 or float32)"
    reason = scalar_lambda_refusal(lam, "triton")
    if reason is not None:
        return reason
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
    reason = _device_refusal(q.device, q.dtype)
    if reason is not None:
        return reason
    if q.dim() == 4 and q.shape[-1] > MAX_HEAD_DIM:
        return f"head width {q.shape[-1]} exceeds {MAX_HEAD_DIM}"
    if v.dim() == 4 and v.shape[-1] > MAX_VALUE_DIM:
        return f"value width {v.shape[-1]} exceeds {MAX_VALUE_DIM}"
    if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.requires_grad:
        return "no gradient with respect to a float attn_mask"
    # offsets inside one tile are 32-bit: every stride between rows must keep MAX_TILE rows in range
    strides = [_token_stride(t) for t in (q, k, v) if t.dim() == 4]
    if attn_mask is not None:
        if attn_mask.dtype == torch.float32 and attn_mask.dim() >= 2:
            strides.append(abs(attn_mask.stride(-2)) + abs(attn_mask.stride(-1)))
        else:
            strides.append(attn_mask.shape[-1] + 1)
    if strides and max(strides) * MAX_TILE > _INT32_MAX:
        return f"a row stride of {max(strides)} elements: {MAX_TILE} rows of one tile would overflow 32-bit offsets"
    if q.dim() == 4 and k.dim() == 4:
        programs = max(q.shape[2], k.shape[2]) // 16 + 1
        if programs * q.shape[0] * q.shape[1] > _INT32_MAX:
            return "more than 2**31 - 1 programs in the launch grid"
    return None


def unsupported(call: Call) -> str | None:
    """``None`` if the fused kernel can run ``call`` correctly and on tensor cores, else the reason."""
    return _refusal(call.q, call.k, call.v, call.lam, call.attn_mask, call.dropout_p)


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
    reason = _refusal(q, k, v, lam, attn_mask, dropout_p)
    if reason is not None:
        raise ValueError(f"the triton backend cannot run this call: {reason}")
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
