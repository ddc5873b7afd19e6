"""Whether a layer is being traced symbolically (``torch.fx``), where inputs are proxies, not tensors."""

from __future__ import annotations

from torch.fx._symbolic_trace import is_fx_tracing as _is_fx_tracing


def is_fx_tracing() -> bool:
    """True inside ``torch.fx.symbolic_trace``: value checks on shapes must be skipped there.

    ``torch.compile`` and ``torch.export`` see real (fake) shapes, so the checks stay in force for them.
    """
    return _is_fx_tracing()
