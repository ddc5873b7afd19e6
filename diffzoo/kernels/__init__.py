"""Attention kernels: pure functions with no parameters, one signature for every backend.

``diff_attention(q, k, v, lam, ...)`` computes differential attention and ``attention(q, k, v, ...)``
standard softmax attention; ``backend=`` picks the implementation (see :mod:`.registry`).

Backends of ``diff_attention``:

* ``reference``: explicit maps in fp32, the ground truth of the tests.
* ``sdpa``: ``F.scaled_dot_product_attention`` with both branches folded into one call.
* ``blockwise``: exact blockwise form at the FLOPs of standard attention, with a fused backward.
* ``triton``: fused Triton kernels (two online softmaxes sharing K/V tiles), CUDA or ``TRITON_INTERPRET=1``;
  opt-in (``auto`` does not pick it): measured on an H200 it was not faster than ``sdpa`` (docs/kernels.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import torch
from torch import Tensor

from ._masks import as_lambda, check_dropout_p, scalar_lambda_refusal
from .blockwise import diff_attention_blockwise
from .reference import attention_maps, attention_reference, diff_attention_maps, diff_attention_reference
from .registry import (
    _REGISTRY,
    Backend,
    Call,
    available_backends,
    list_backends,
    register_backend,
    requested_backend,
    select_backend,
    set_auto_order,
    use_backend,
)
from .sdpa import attention_sdpa, diff_attention_sdpa

__all__ = [
    "Backend",
    "attention",
    "attention_maps",
    "available_backends",
    "diff_attention",
    "diff_attention_maps",
    "list_backends",
    "register_backend",
    "requested_backend",
    "select_backend",
    "set_auto_order",
    "use_backend",
]


def diff_attention(
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
    backend: str | None = None,
) -> Tensor:
    """Differential attention ``(softmax(q1 k1^T s + M) - lam softmax(q2 k2^T s + M)) v``.

    Args:
        q: ``(B, 2H, Nq, d)``; heads ``2i, 2i+1`` are ``(q1, q2)`` of differential head ``i``.
        k: ``(B, 2H_kv, Nk, d)``; heads ``2g, 2g+1`` are ``(k1, k2)`` of key/value group ``g``.
        v: ``(B, H_kv, Nk, dv)`` (``dv = 2d`` in the paper); head ``i`` reads group ``i // (H / H_kv)``.
        lam: scalar tensor; its gradient is returned by every backend.
        attn_mask: bool (True = attend) or additive float, broadcastable to ``(B, H, Nq, Nk)``.
        key_padding_mask: bool ``(B, Nk)``, True marks padding.
        causal: bottom-right aligned causal mask (works with a kv-cache, ``Nq <= Nk``).
        scale: logit scale, default ``d ** -0.5``.
        dropout_p: attention dropout probability in ``[0, 1)``, applied once to the combined map
            ``A1 - lam A2`` (every output channel of a head sees the same mask). Backends that cannot
            draw it that way refuse it, so ``auto`` picks one that can.
        backend: ``"reference"``, ``"sdpa"``, ``"blockwise"``, ``"triton"`` or ``"auto"``.

    Returns:
        ``(B, H, Nq, dv)`` in ``q.dtype``; rows with no allowed key are zero.
    """
    check_dropout_p(dropout_p)
    lam = as_lambda(lam, q)
    call = Call(q, k, v, attn_mask, key_padding_mask, causal, dropout_p, torch.is_grad_enabled(), lam)
    fn = select_backend("diff", call, backend).fn()
    return fn(
        q, k, v, lam, attn_mask=attn_mask, key_padding_mask=key_padding_mask, causal=causal, scale=scale,
        dropout_p=dropout_p,
    )


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str | None = None,
) -> Tensor:
    """Standard softmax attention with the same conventions as :func:`diff_attention`.

    Args:
        q: ``(B, H, Nq, d)``; k: ``(B, H_kv, Nk, d)``; v: ``(B, H_kv, Nk, dv)``.

    Returns:
        ``(B, H, Nq, dv)``.
    """
    check_dropout_p(dropout_p)
    call = Call(q, k, v, attn_mask, key_padding_mask, causal, dropout_p, torch.is_grad_enabled())
    fn = select_backend("softmax", call, backend).fn()
    return fn(
        q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, causal=causal, scale=scale,
        dropout_p=dropout_p,
    )


def _load(module: str, name: str):
    def load():
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)

    return load


# Looked up once: installed packages do not change while the process runs, and a look-up at call time
# would end the graph under torch.compile.
_HAS_TRITON = importlib.util.find_spec("triton") is not None
_HAS_TRITON_KERNEL = importlib.util.find_spec(f"{__name__}.triton_diff") is not None


def _triton_unavailable() -> str | None:
    if not _HAS_TRITON:
        return "triton is not installed (pip install triton)"
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return "no CUDA device (set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)"
    if not _HAS_TRITON_KERNEL:
        return "the fused Triton kernel is not part of this build"
    return None


def _triton_unsupported(call: Call) -> str | None:
    from . import triton_diff

    return triton_diff.unsupported(call)


def _sdpa_unsupported(call: Call) -> str | None:
    if call.dropout_p > 0.0:
        return "attention dropout: SDPA would draw separate masks for the two branches, not one for A1 - lam A2"
    return None


def _blockwise_unsupported(call: Call) -> str | None:
    return scalar_lambda_refusal(call.lam, "blockwise")


def _loaded(fn):
    # The plain-PyTorch backends are imported with the package: an import at call time would be a
    # graph break under torch.compile. Only the Triton backend loads on first use.
    return lambda: fn


register_backend("diff", Backend("reference", _loaded(diff_attention_reference)))
register_backend("diff", Backend("sdpa", _loaded(diff_attention_sdpa), unsupported=_sdpa_unsupported))
register_backend("diff", Backend("blockwise", _loaded(diff_attention_blockwise), unsupported=_blockwise_unsupported))
register_backend(
    "diff",
    Backend(
        "triton",
        _load("triton_diff", "diff_attention_triton"),
        unavailable=_triton_unavailable,
        unsupported=_triton_unsupported,
    ),
)
if _triton_unavailable() is None:
    # Triton can run here: load the kernel now, as an import on first use inside a torch.compile'd
    # region would end the graph (a failed import is raised again at the first call).
    try:
        _REGISTRY["diff"]["triton"].fn()
    except Exception:  # noqa: BLE001
        pass
register_backend("softmax", Backend("reference", _loaded(attention_reference)))
register_backend("softmax", Backend("sdpa", _loaded(attention_sdpa)))
