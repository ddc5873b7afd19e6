"""SDPA backend: differential attention from ``F.scaled_dot_product_attention`` calls.

The two branches are folded into the batch so that one SDPA call computes both maps. On CPU the
flash kernel refuses a value width different from the query width (it would fall back to the
O(N^2)-memory math path), so the value is split into two halves of width ``d`` that are also folded
into the batch: four standard attentions in one call (2.0x the FLOPs of standard attention). On CUDA
the memory-efficient and cuDNN kernels accept value width ``2d``: two standard attentions (1.43x).

Attention dropout is refused: SDPA would drop each branch (and each value slice) with its own mask,
while differential attention drops the combined map ``A1 - lam A2`` once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._masks import as_lambda, check_attention_inputs, prepare_mask


def _sdpa_mask(bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    # SDPA takes an additive mask in the query dtype; -inf survives the cast.
    return None if bias is None else bias.to(dtype)


def _repeat_batch(mask: Tensor | None, times: int) -> Tensor | None:
    if mask is None or mask.shape[0] == 1:
        return mask
    return mask.repeat(times, 1, 1, 1)


def diff_attention_sdpa(
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
    """Differential attention via SDPA; same signature and result as the reference backend (no dropout)."""
    if dropout_p > 0.0:
        raise ValueError(
            "the sdpa backend cannot drop the combined map A1 - lam A2 with one mask; "
            "use backend='blockwise' or 'reference' for attention dropout"
        )
    B, H, Hkv, Nq, Nk = check_attention_inputs(
        q, k, v, differential=True, attn_mask=attn_mask, key_padding_mask=key_padding_mask
    )
    lam = as_lambda(lam, q)
    d, dv = q.shape[-1], v.shape[-1]
    G = H // Hkv
    m = prepare_mask(attn_mask, key_padding_mask, causal, Nq, Nk, q.device, keep_causal_separate=Nq == Nk)
    # Branch-major layout: (2, B, H, N, d) -> fold the branch into the batch.
    qb = q.reshape(B, H, 2, Nq, d).transpose(1, 2).transpose(0, 1).reshape(2 * B, H, Nq, d)
    kb = k.reshape(B, Hkv, 2, Nk, d).transpose(1, 2).transpose(0, 1)  # (2, B, Hkv, Nk, d)
    if G > 1:
        kb = kb.repeat_interleave(G, dim=2)
        v = v.repeat_interleave(G, dim=1)
    kb = kb.reshape(2 * B, H, Nk, d)
    split_value = q.device.type != "cuda" and dv != d and dv % d == 0
    if split_value:
        parts = dv // d
        # (parts, B, H, Nk, d): every value slice is attended by both branches
        vs = v.reshape(B, H, Nk, parts, d).permute(3, 0, 1, 2, 4)
        vb = vs.unsqueeze(1).expand(parts, 2, B, H, Nk, d).reshape(parts * 2 * B, H, Nk, d)
        qb = qb.repeat(parts, 1, 1, 1)
        kb = kb.repeat(parts, 1, 1, 1)
    else:
        parts = 1
        vb = v.unsqueeze(0).expand(2, B, H, Nk, dv).reshape(2 * B, H, Nk, dv)
    mask = _repeat_batch(_sdpa_mask(m.bias, q.dtype), 2 * parts)
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=m.causal, scale=scale)  # (parts * 2 * B, H, Nq, dv / parts)
    o = o.reshape(parts, 2, B, H, Nq, dv // parts)
    o = o[:, 0] - lam.to(o.dtype) * o[:, 1]  # (parts, B, H, Nq, dv / parts)
    if parts > 1:
        o = o.permute(1, 2, 3, 0, 4).reshape(B, H, Nq, dv)
    else:
        o = o[0]
    if m.row_valid is not None:
        o = o * m.row_valid
    return o


def attention_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Standard softmax attention via SDPA, with grouped-query heads and safe fully-masked rows."""
    B, H, Hkv, Nq, Nk = check_attention_inputs(
        q, k, v, differential=False, attn_mask=attn_mask, key_padding_mask=key_padding_mask
    )
    m = prepare_mask(attn_mask, key_padding_mask, causal, Nq, Nk, q.device, keep_causal_separate=Nq == Nk)
    if H != Hkv:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    o = F.scaled_dot_product_attention(
        q, k, v, attn_mask=_sdpa_mask(m.bias, q.dtype), dropout_p=dropout_p, is_causal=m.causal, scale=scale
    )
    if m.row_valid is not None:
        o = o * m.row_valid
    return o
