"""Reference backend: explicit attention maps, everything in fp32.

The slowest and plainest implementation of differential attention (Ye et al., "Differential
Transformer", ICLR 2025, arXiv 2410.05258, eq. 1) and of standard softmax attention. Every other
backend is tested against it. It is also the backend that can return the attention maps.

Every function takes an optional ``score_hook(logits, allowed) -> logits``, applied to the scaled
logits before the mask (``allowed``: the bool pairs the mask lets attend, or None). The registered
backend never passes one; :mod:`diffzoo.analysis` uses it to quantise the logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._masks import PreparedMask, as_lambda, check_attention_inputs, prepare_mask

ScoreHook = Callable[[Tensor, Tensor | None], Tensor]


def diff_attention_logits(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """Scaled logits of both branches, fp32 ``(B, H, 2, Nq, Nk)``: query head ``2i + b`` of
    ``q (B, 2H, Nq, d)`` against key head ``2g + b`` of its group in ``k (B, 2H_kv, Nk, d)``."""
    B, Hq, Nq, d = q.shape
    H, Hkv = Hq // 2, k.shape[1] // 2
    scale = d**-0.5 if scale is None else scale
    qf = q.float().reshape(B, H, 2, Nq, d)
    kf = k.float().reshape(B, Hkv, 2, k.shape[2], d).repeat_interleave(H // Hkv, dim=1)  # (B, H, 2, Nk, d)
    return (qf @ kf.transpose(-1, -2)) * scale


def attention_logits(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """Scaled logits of grouped-query softmax attention, fp32 ``(B, H, Nq, Nk)``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kf = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return (q.float() @ kf.transpose(-1, -2)) * scale


def _masked_softmax(scores: Tensor, m: PreparedMask, pairs: bool, score_hook: ScoreHook | None) -> Tensor:
    """softmax(hook(scores) + bias), zero on rows with no allowed key; ``pairs``: scores carry a branch
    axis at dim 2 that the mask is broadcast over."""
    bias, row_valid = m.bias, m.row_valid
    if pairs:
        bias = None if bias is None else bias.unsqueeze(2)
        row_valid = None if row_valid is None else row_valid.unsqueeze(2)
    if score_hook is not None:
        allowed = m.allowed()
        scores = score_hook(scores, None if allowed is None else (allowed.unsqueeze(2) if pairs else allowed))
    if bias is not None:
        scores = scores + bias
    a = torch.softmax(scores, dim=-1)
    return a if row_valid is None else a * row_valid


def diff_attention_maps(
    q: Tensor,
    k: Tensor,
    lam: Tensor,
    *,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    score_hook: ScoreHook | None = None,
) -> tuple[Tensor, Tensor]:
    """Both softmax maps of differential attention, fp32.

    Args:
        q: ``(B, 2H, Nq, d)``; heads ``2i`` and ``2i+1`` are ``(q1, q2)`` of differential head ``i``.
        k: ``(B, 2H_kv, Nk, d)``; heads ``2g`` and ``2g+1`` are ``(k1, k2)`` of key/value group ``g``.
        lam: scalar lambda (only used for validation of shapes here; kept for a uniform signature).

    Returns:
        ``(A1, A2)``, each ``(B, H, Nq, Nk)`` fp32; rows with no allowed key are all zero.
    """
    v_dummy = k.new_empty((k.shape[0], k.shape[1] // 2, k.shape[2], 1))
    B, H, Hkv, Nq, Nk = check_attention_inputs(
        q, k, v_dummy, differential=True, attn_mask=attn_mask, key_padding_mask=key_padding_mask
    )
    m = prepare_mask(attn_mask, key_padding_mask, causal, Nq, Nk, q.device)
    a = _masked_softmax(diff_attention_logits(q, k, scale), m, True, score_hook)  # (B, H, 2, Nq, Nk)
    return a[:, :, 0], a[:, :, 1]


def diff_attention_reference(
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
    score_hook: ScoreHook | None = None,
) -> Tensor:
    """``(softmax(q1 k1^T s + M) - lam * softmax(q2 k2^T s + M)) @ v`` per differential head.

    Args:
        q: ``(B, 2H, Nq, d)``, adjacent pairs of heads are ``(q1, q2)``.
        k: ``(B, 2H_kv, Nk, d)``, adjacent pairs are ``(k1, k2)`` of one key/value group.
        v: ``(B, H_kv, Nk, dv)``; differential head ``i`` uses group ``i // (H / H_kv)``.
        lam: scalar tensor (any dtype; used in fp32).
        attn_mask, key_padding_mask, causal: see :mod:`diffzoo.kernels._masks`.
        scale: logit scale, default ``d ** -0.5``.
        dropout_p: dropout on the combined map ``A1 - lam A2``.

    Returns:
        ``(B, H, Nq, dv)`` in ``q.dtype``.
    """
    lam = as_lambda(lam, q)
    a1, a2 = diff_attention_maps(
        q, k, lam, attn_mask=attn_mask, key_padding_mask=key_padding_mask, causal=causal, scale=scale,
        score_hook=score_hook,
    )
    B, H, Nq, _ = a1.shape
    check_attention_inputs(q, k, v, differential=True)
    G = H // v.shape[1]
    p = a1 - lam.float() * a2
    if dropout_p > 0.0:
        p = F.dropout(p, dropout_p)
    out = p @ v.float().repeat_interleave(G, dim=1)
    return out.to(q.dtype)


def attention_maps(
    q: Tensor,
    k: Tensor,
    *,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    score_hook: ScoreHook | None = None,
) -> Tensor:
    """Softmax attention map ``(B, H, Nq, Nk)`` in fp32 for ``q (B, H, Nq, d)``, ``k (B, H_kv, Nk, d)``."""
    v_dummy = k.new_empty((*k.shape[:3], 1))
    B, H, Hkv, Nq, Nk = check_attention_inputs(
        q, k, v_dummy, differential=False, attn_mask=attn_mask, key_padding_mask=key_padding_mask
    )
    m = prepare_mask(attn_mask, key_padding_mask, causal, Nq, Nk, q.device)
    return _masked_softmax(attention_logits(q, k, scale), m, False, score_hook)


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    score_hook: ScoreHook | None = None,
) -> Tensor:
    """Standard softmax attention ``softmax(q k^T s + M) @ v`` with grouped-query heads, fp32 inside."""
    a = attention_maps(
        q, k, attn_mask=attn_mask, key_padding_mask=key_padding_mask, causal=causal, scale=scale,
        score_hook=score_hook,
    )
    check_attention_inputs(q, k, v, differential=False)
    if dropout_p > 0.0:
        a = F.dropout(a, dropout_p)
    out = a @ v.float().repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return out.to(q.dtype)
