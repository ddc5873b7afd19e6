"""Low-bit attention: absmax quantisation of the attention logits, for any evaluation.

Ye et al., "Differential Transformer", ICLR 2025 (arXiv 2410.05258), Section 3.7 ("Quantized
Attention"): the attention logits are quantised to fewer bits, 8, 6 and 4 in the paper (docs/design.md,
"Low-bit attention").

For ``b`` bits, ``qmax = 2**(b-1) - 1`` and logits ``s = q k^T * scale`` (per branch for differential
attention, before the mask)::

    absmax = max |s|  over the entries the mask allows, per (batch, query head) block  (granularity="head")
                      or over the whole call                                           (granularity="tensor")
    deq(s) = round(s / absmax * qmax) * absmax / qmax          (symmetric, round half to even)

so ``|s - deq(s)| <= absmax / qmax / 2``. Then ``softmax(deq(s) + M)``: the reference backend with
the quantisation as its score hook (for differential attention in both branches; DiffAttentionV2 and
softmax attention go through the reference softmax attention). Gradients pass straight through the rounding (``d deq / d s = 1``).

Use::

    with low_bit_attention(bits=4):
        metric = evaluate(model)
    results = metric_vs_bits(lambda: evaluate(model), bits=(None, 8, 6, 4))

This works by registering a kernel backend ``"lowbit"`` for the ops ``"diff"`` and ``"softmax"`` of
:mod:`diffzoo.kernels.registry` (on first use) and selecting it with ``use_backend``. A layer built with
an explicit ``backend=`` ignores the context selection: pass ``model=`` to override those too.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..kernels import Backend, reference, register_backend, use_backend

__all__ = [
    "BACKEND_NAME",
    "absmax_quantize",
    "attention_logits",
    "attention_lowbit",
    "diff_attention_lowbit",
    "low_bit_attention",
    "metric_vs_bits",
]

BACKEND_NAME = "lowbit"
Granularity = Literal["head", "tensor"]
# (bits, granularity) in force; bits None = no quantisation (the reference math).
_SETTINGS: contextvars.ContextVar[tuple[int | None, str]] = contextvars.ContextVar(
    "diffzoo_lowbit", default=(None, "head")
)


def _check(bits: int | None, granularity: str) -> None:
    if bits is not None and (not isinstance(bits, int) or bits < 2):
        raise ValueError(f"bits={bits!r}: need an integer >= 2 (symmetric levels -(2^(b-1)-1)..2^(b-1)-1) or None")
    if granularity not in ("head", "tensor"):
        raise ValueError(f"granularity={granularity!r}; expected 'head' (per batch item and head) or 'tensor'")


def absmax_quantize(
    s: Tensor, bits: int | None, allowed: Tensor | None = None, granularity: Granularity = "head"
) -> Tensor:
    """Symmetric absmax quantise-dequantise of logits ``s (..., Nq, Nk)``; same shape and dtype.

    Args:
        s: logits; the scale is taken per ``(..., Nq, Nk)`` block (``"head"``) or over all of ``s``.
        bits: bit width ``b`` (``qmax = 2**(b-1) - 1`` levels each side of 0), or None (returns ``s``).
        allowed: bool, broadcastable to ``s``: the entries the absmax is taken over (the mask's allowed
            entries); the others are quantised too, clamped to ``[-absmax, absmax]``.
        granularity: ``"head"`` or ``"tensor"``.

    Returns:
        ``deq(s)`` with ``|s - deq(s)| <= absmax / qmax / 2`` on every allowed entry. The rounding is
        straight-through for autograd.
    """
    _check(bits, granularity)
    if bits is None:
        return s
    qmax = 2 ** (bits - 1) - 1
    mag = s.detach().abs()
    if allowed is not None:
        mag = torch.where(allowed, mag, torch.zeros_like(mag))
    absmax = mag.amax(dim=(-2, -1), keepdim=True) if granularity == "head" else mag.amax()
    step = absmax.clamp_min(torch.finfo(s.dtype).tiny) / qmax
    deq = torch.round(s.detach() / step).clamp_(-qmax, qmax) * step
    return s + (deq - s.detach())  # value deq(s), gradient of s


def attention_logits(q: Tensor, k: Tensor, differential: bool, scale: float | None = None) -> Tensor:
    """``q k^T * scale`` in fp32 for every query head, ``(B, Hq, Nq, Nk)``, with diffzoo's head pairing.

    ``differential=True``: kernel layout of :func:`diffzoo.kernels.diff_attention` (query head ``2i + b``
    meets key head ``2g + b`` of its group, ``b`` the branch). Otherwise standard grouped-query heads
    (also DiffAttentionV2, whose ``2H`` query heads share the key heads). The reference backend's logits.
    """
    if differential:
        s = reference.diff_attention_logits(q, k, scale)  # (B, H, 2, Nq, Nk)
        return s.reshape(s.shape[0], -1, *s.shape[-2:])
    return reference.attention_logits(q, k, scale)


def _quantize_logits(s: Tensor, allowed: Tensor | None) -> Tensor:
    """The reference backend's score hook: quantise under the settings in force."""
    bits, granularity = _SETTINGS.get()
    return absmax_quantize(s, bits, allowed, granularity)


def diff_attention_lowbit(q: Tensor, k: Tensor, v: Tensor, lam: Tensor, **kwargs: Any) -> Tensor:
    """The reference differential attention with absmax-quantised logits in both branches.

    Same signature and layouts as :func:`diffzoo.kernels.reference.diff_attention_reference`.
    """
    return reference.diff_attention_reference(q, k, v, lam, score_hook=_quantize_logits, **kwargs)


def attention_lowbit(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """The reference softmax attention with absmax-quantised logits (also the kernel of DiffAttentionV2)."""
    return reference.attention_reference(q, k, v, score_hook=_quantize_logits, **kwargs)


def _register() -> None:
    """Register the ``"lowbit"`` backend for both ops (idempotent; it reads the bits from the context)."""
    register_backend("diff", Backend(BACKEND_NAME, lambda: diff_attention_lowbit))
    register_backend("softmax", Backend(BACKEND_NAME, lambda: attention_lowbit))


@contextlib.contextmanager
def low_bit_attention(
    bits: int | None = 8, *, granularity: Granularity = "head", model: nn.Module | None = None
) -> Iterator[None]:
    """Run the enclosed code with absmax-quantised attention logits in every diffzoo attention call.

    Args:
        bits: 2 or more; None runs the same backend without quantisation (the reference math).
        granularity: ``"head"`` (one absmax per batch item and query head, per branch) or ``"tensor"``.
        model: if given, its attention layers' own ``backend`` attributes are overridden too (restored
            on exit, also after an exception), and its timm ``Attention`` layers are routed through
            diffzoo's kernels (:func:`~diffzoo.analysis.maps.timm_attention_seam`); calls that pass
            ``backend=`` explicitly still win.
    """
    _check(bits, granularity)
    _register()
    from ..layers import AttentionBase
    from .maps import timm_attention_seam

    token = _SETTINGS.set((bits, granularity))
    saved: list[tuple[nn.Module, Any]] = []
    try:
        if model is not None:
            for m in model.modules():
                if isinstance(m, AttentionBase):
                    saved.append((m, m.backend))
                    m.backend = BACKEND_NAME
        # timm's own attention layers (softmax ViT baselines) attend through diffzoo's kernels meanwhile
        with use_backend(BACKEND_NAME), timm_attention_seam(model if model is not None else []):
            yield
    finally:
        for m, backend in saved:
            m.backend = backend
        _SETTINGS.reset(token)


def metric_vs_bits(
    evaluate_fn: Callable[[], Any], bits: Sequence[int | None] = (None, 8, 6, 4), *,
    granularity: Granularity = "head", model: nn.Module | None = None,
) -> dict[int | None, Any]:
    """``{b: evaluate_fn()}`` with the logits quantised to ``b`` bits (None: unquantised, same backend).

    ``evaluate_fn`` takes no argument (close over the model and data). Every entry, ``None`` included,
    runs on the ``"lowbit"`` backend, so differences come from the quantisation alone.
    """
    out: dict[int | None, Any] = {}
    for b in bits:
        with low_bit_attention(b, granularity=granularity, model=model):
            out[b] = evaluate_fn()
    return out
