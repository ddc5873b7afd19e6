"""Whether a layer is being traced symbolically (``torch.fx``), where inputs are proxies, not tensors."""

from __future__ import annotations

try:
    from torch.fx._symbolic_trace import is_fx_symbolic_tracing as _symbolic
except ImportError:  # older torch: this flag also covers torch.export, where skipping checks is harmless
    from torch.fx._symbolic_trace import is_fx_tracing as _symbolic


def is_fx_tracing() -> bool:
    """True inside ``torch.fx.symbolic_trace``: checks on shapes and types must be skipped there.

    ``torch.compile`` and ``torch.export`` see real (fake) tensors, so the checks stay in force for them.
    """
    return _symbolic()
