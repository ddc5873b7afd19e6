"""Backend registry and selection for the attention kernels.

Selection order: the ``backend=`` argument, then :func:`use_backend` (a context manager), then the
``DIFFZOO_ATTN_BACKEND`` environment variable, then ``"auto"``. An explicitly requested backend that
cannot run the call raises; ``auto`` falls back along a per-device preference list and logs each
fallback once. The backend never changes the result beyond floating-point rounding.

Selection is plain Python that ``torch.compile`` traces without a graph break: the name set by
:func:`use_backend` lives in thread-local state, which dynamo guards (a compiled model re-traces
when it changes), while the environment variable is read when the graph is traced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from torch import Tensor

log = logging.getLogger("diffzoo.kernels")

ENV_VAR = "DIFFZOO_ATTN_BACKEND"
# The backend named by the innermost ``use_backend`` of this thread (attribute ``name``, unset = None).
_requested = threading.local()
_logged: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Call:
    """What a backend needs to know to say whether it can run a call."""

    q: Tensor
    k: Tensor
    v: Tensor
    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    causal: bool
    dropout_p: float
    requires_grad: bool
    lam: Tensor | None = None  # the differential op's lambda (a backend may take only a scalar)


@dataclass
class Backend:
    """A registered implementation of one op.

    Attributes:
        name: the name users select it by.
        load: returns the kernel function (imported lazily, so optional packages load only when used).
        unavailable: returns ``None`` if the backend can run on this machine, else the reason it cannot.
        unsupported: returns ``None`` if the backend can run this call, else the reason it cannot.
    """

    name: str
    load: Callable[[], Callable[..., Tensor]]
    unavailable: Callable[[], str | None] = lambda: None
    unsupported: Callable[[Call], str | None] = lambda call: None
    _fn: Callable[..., Tensor] | None = field(default=None, repr=False)

    def fn(self) -> Callable[..., Tensor]:
        if self._fn is None:
            self._fn = self.load()
        return self._fn


_REGISTRY: dict[str, dict[str, Backend]] = {"diff": {}, "softmax": {}}
# Preference of ``auto`` per device type; the first backend that can run the call wins.
_AUTO_ORDER: dict[str, dict[str, tuple[str, ...]]] = {
    # The fused Triton kernel is opt-in (backend="triton"): on an H200 it was 0.84-1.61x the time of the SDPA
    # backend, which runs PyTorch's flash / cuDNN kernels, so ``auto`` on CUDA uses SDPA (docs/kernels.md).
    "diff": {"cuda": ("sdpa", "blockwise", "reference"), "cpu": ("blockwise", "sdpa", "reference")},
    "softmax": {"cuda": ("sdpa", "reference"), "cpu": ("sdpa", "reference")},
}
# Differential-only backend names used for a standard-attention call resolve to these.
_SOFTMAX_ALIASES = {"blockwise": "sdpa", "triton": "sdpa"}


def register_backend(op: str, backend: Backend) -> None:
    """Register ``backend`` for ``op`` (``"diff"`` or ``"softmax"``), replacing one of the same name."""
    if op not in _REGISTRY:
        raise ValueError(f"unknown op {op!r}; expected one of {sorted(_REGISTRY)}")
    _REGISTRY[op][backend.name] = backend


def list_backends(op: str = "diff") -> list[str]:
    """Names of the backends registered for ``op``."""
    return sorted(_REGISTRY[op])


def available_backends(op: str = "diff") -> list[str]:
    """Names of the backends for ``op`` that can run on this machine."""
    return [n for n, b in sorted(_REGISTRY[op].items()) if b.unavailable() is None]


def set_auto_order(op: str, device_type: str, order: tuple[str, ...]) -> None:
    """Change the preference list that ``auto`` walks for ``op`` on ``device_type``."""
    _AUTO_ORDER[op][device_type] = tuple(order)


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Run the enclosed code with attention backend ``name`` (``None`` restores the default chain)."""
    if name is not None:
        _check_name(name)
    previous = getattr(_requested, "name", None)
    _requested.name = name
    try:
        yield
    finally:
        _requested.name = previous


def requested_backend(explicit: str | None = None) -> str:
    """The backend name in force: argument, context manager, environment variable, then ``"auto"``."""
    name = explicit or getattr(_requested, "name", None) or os.environ.get(ENV_VAR) or "auto"
    _check_name(name)
    return name


def _check_name(name: str) -> None:
    known = set(_REGISTRY["diff"]) | set(_REGISTRY["softmax"]) | {"auto"}
    if name not in known:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(known)}")


def _log_once(op: str, wanted: str, got: str, reason: str) -> None:
    key = (op, wanted, got)
    if key not in _logged:
        _logged.add(key)
        log.warning("diffzoo %s attention: backend %r not used (%s); using %r", op, wanted, reason, got)


def select_backend(op: str, call: Call, explicit: str | None = None) -> Backend:
    """Pick the backend for one call (see the module docstring for the order)."""
    name = requested_backend(explicit)
    table = _REGISTRY[op]
    if op == "softmax":
        name = _SOFTMAX_ALIASES.get(name, name)
    if name != "auto":
        backend = table.get(name)
        if backend is None:
            raise ValueError(f"backend {name!r} has no {op} attention; choose from {sorted(table)}")
        reason = backend.unavailable() or backend.unsupported(call)
        if reason is not None:
            raise RuntimeError(f"attention backend {name!r} cannot run this call: {reason}")
        return backend
    order = _AUTO_ORDER[op].get(call.q.device.type, _AUTO_ORDER[op]["cpu"])
    first_reason = None
    for candidate in order:
        backend = table.get(candidate)
        if backend is None:
            continue
        reason = backend.unavailable() or backend.unsupported(call)
        if reason is None:
            if first_reason is not None:
                _log_once(op, order[0], candidate, first_reason)
            return backend
        first_reason = first_reason or reason
    raise RuntimeError(f"no {op} attention backend can run this call (first refusal: {first_reason})")
