"""Input checks and mask preparation shared by every attention backend.

Conventions (the same for every backend and every layer in diffzoo):

* ``attn_mask``: bool (``True`` = may attend, as in ``F.scaled_dot_product_attention``) or a float
  additive bias (``-inf`` forbids), broadcastable to ``(B, H, Nq, Nk)``.
* ``key_padding_mask``: bool ``(B, Nk)``, ``True`` marks a padded key that must be ignored
  (the ``nn.MultiheadAttention`` convention).
* ``causal``: query ``i`` may see key ``j`` iff ``j <= i + Nk - Nq`` (aligned to the bottom-right corner,
  so a query block that continues a kv-cache sees the whole cache and the causal part of itself).
* A query row whose keys are all forbidden produces an output of exactly zero, with zero gradients.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor


def check_dropout_p(p: float, name: str = "dropout_p") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``p`` is a probability in ``[0, 1)``."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name}={p!r} must be a dropout probability in [0, 1)")


def as_lambda(lam: Tensor | float, q: Tensor) -> Tensor:
    """``lam`` as a tensor on ``q``'s device: a Python number becomes an fp32 scalar; tensors pass through."""
    if isinstance(lam, Tensor):
        return lam
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real):
        raise TypeError(f"lam must be a tensor or a real number, got {type(lam).__name__}")
    return torch.tensor(float(lam), dtype=torch.float32, device=q.device)


def scalar_lambda_refusal(lam: Tensor | None, backend: str) -> str | None:
    """Why a backend that folds one lambda into its kernel cannot take ``lam`` (one per head or token)."""
    if lam is not None and lam.numel() != 1:
        return f"lambda of shape {tuple(lam.shape)}: the {backend} backend takes one scalar lambda per call"
    return None


def check_attention_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    differential: bool,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
) -> tuple[int, int, int, int, int]:
    """Validate kernel inputs and return ``(B, H, H_kv, Nq, Nk)``.

    For the differential kernel ``q`` is ``(B, 2H, Nq, d)``, ``k`` is ``(B, 2H_kv, Nk, d)`` and ``v`` is
    ``(B, H_kv, Nk, dv)``. For standard attention ``q`` is ``(B, H, Nq, d)`` and ``k``/``v`` are
    ``(B, H_kv, Nk, d)`` / ``(B, H_kv, Nk, dv)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4 (batch, heads, tokens, width), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, Hq, Nq, d = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-1] != d:
        raise ValueError(f"q and k widths differ: {d} vs {k.shape[-1]}")
    if d == 0:
        raise ValueError("q and k have width 0; the head width (head_dim) must be at least 1")
    Nk = k.shape[2]
    if v.shape[2] != Nk:
        raise ValueError(f"k and v token counts differ: {Nk} vs {v.shape[2]}")
    if differential:
        if Hq % 2 or k.shape[1] % 2:
            raise ValueError(
                f"differential attention needs an even number of q and k heads (pairs), got {Hq} and {k.shape[1]}"
            )
        H, Hkv = Hq // 2, k.shape[1] // 2
    else:
        H, Hkv = Hq, k.shape[1]
    if v.shape[1] != Hkv:
        raise ValueError(f"v has {v.shape[1]} heads, expected {Hkv} (one per key/value group)")
    if H % Hkv:
        raise ValueError(f"{H} query heads are not divisible into {Hkv} key/value groups")
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool:
            raise ValueError(f"key_padding_mask must be bool (True = padding), got {key_padding_mask.dtype}")
        if tuple(key_padding_mask.shape) != (B, Nk):
            raise ValueError(
                f"key_padding_mask must have shape (batch, keys) = ({B}, {Nk}), got {tuple(key_padding_mask.shape)}"
            )
        if key_padding_mask.device != q.device:
            raise ValueError(f"key_padding_mask is on {key_padding_mask.device}, inputs on {q.device}")
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise ValueError(f"attn_mask must be bool or floating point, got {attn_mask.dtype}")
        if attn_mask.dim() > 4:
            raise ValueError(f"attn_mask has rank {attn_mask.dim()}; it must broadcast to (B, H, Nq, Nk)")
        try:
            shape = torch.broadcast_shapes(tuple(attn_mask.shape), (B, H, Nq, Nk))
        except RuntimeError:
            shape = None
        if shape != (B, H, Nq, Nk):
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (B, H, Nq, Nk) = {(B, H, Nq, Nk)}"
            )
        if attn_mask.device != q.device:
            raise ValueError(f"attn_mask is on {attn_mask.device}, inputs on {q.device}")
    return B, H, Hkv, Nq, Nk


def causal_allowed(Nq: int, Nk: int, device: torch.device, row_offset: int = 0, rows: int | None = None) -> Tensor:
    """Bool ``(rows, Nk)`` mask, True where query ``row_offset + r`` may see key ``j`` (bottom-right aligned)."""
    rows = Nq - row_offset if rows is None else rows
    i = torch.arange(row_offset, row_offset + rows, device=device).unsqueeze(1)
    j = torch.arange(Nk, device=device).unsqueeze(0)
    return j <= i + (Nk - Nq)


@dataclass
class PreparedMask:
    """A merged mask for one attention call.

    Attributes:
        bias: float additive mask broadcastable to ``(B, H, Nq, Nk)`` (0 or ``-inf``, or the user's values),
            with fully forbidden rows replaced by zeros, or ``None``.
        causal: the causal mask was *not* folded into ``bias``; the backend must apply it itself.
        row_valid: bool ``(B|1, H|1, Nq, 1)``, False for rows with no allowed key, or ``None`` if all rows are valid.
    """

    bias: Tensor | None
    causal: bool
    row_valid: Tensor | None

    def allowed(self) -> Tensor | None:
        """bool, broadcastable to ``(B, H, Nq, Nk)``: the (query, key) pairs that may attend; None = all.

        Only for masks prepared without ``keep_causal_separate`` (a separate causal mask is not in it).
        """
        if self.bias is None:
            return None
        allowed = torch.isfinite(self.bias)
        return allowed if self.row_valid is None else allowed & self.row_valid


def prepare_mask(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    causal: bool,
    Nq: int,
    Nk: int,
    device: torch.device,
    keep_causal_separate: bool = False,
) -> PreparedMask:
    """Merge the three mask kinds into one additive bias in fp32.

    With ``keep_causal_separate=True`` and no other mask, the causal mask is left to the backend
    (SDPA's ``is_causal`` or a kernel's own index test) when ``Nq == Nk`` or when it cannot forbid
    anything (``Nq == 1``).
    """
    if causal and Nq == 1:
        causal = False  # a single query continuing a cache sees every key
    if attn_mask is None and key_padding_mask is None:
        if not causal:
            return PreparedMask(None, False, None)
        if keep_causal_separate and Nq <= Nk:
            return PreparedMask(None, True, None)
    bias: Tensor | None = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=torch.float32, device=device).masked_fill_(~attn_mask, float("-inf"))
        else:
            bias = attn_mask.float()
        while bias.dim() < 4:
            bias = bias.unsqueeze(0)
    if key_padding_mask is not None:
        kp = torch.zeros(key_padding_mask.shape, dtype=torch.float32, device=device)
        kp = kp.masked_fill_(key_padding_mask, float("-inf"))[:, None, None, :]
        bias = kp if bias is None else bias + kp
    if causal:
        c = torch.zeros((Nq, Nk), dtype=torch.float32, device=device)
        c = c.masked_fill_(~causal_allowed(Nq, Nk, device), float("-inf"))[None, None]
        bias = c if bias is None else bias + c
    assert bias is not None
    row_valid = torch.isfinite(bias).any(dim=-1, keepdim=True) | (bias.shape[-1] == 0)
    # Eager skips the row fix-up when every row has a key; a traced graph (torch.compile / export)
    # cannot branch on data, so it always applies it (a no-op on valid rows: same result).
    if not torch.compiler.is_compiling() and bool(row_valid.all()):
        return PreparedMask(bias, False, None)
    bias = bias.masked_fill(~row_valid, 0.0)
    return PreparedMask(bias, False, row_valid)
