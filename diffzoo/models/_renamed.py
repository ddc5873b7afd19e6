"""Former config field names that model configs still accept (and read back) under their new names."""

from __future__ import annotations

import functools
from typing import Any, TypeVar

T = TypeVar("T", bound=type)


def accept_former_names(renamed: dict[str, str]):
    """Class decorator for a dataclass: ``__init__`` takes each former name of ``renamed`` (``former ->
    field``) as a keyword for its field, and ``cfg.former`` reads the field back.

    ``dataclasses.fields``/``asdict``/``replace`` see only the new names. Giving a field under both
    names with different values raises ``ValueError``.
    """

    def decorate(cls: T) -> T:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **current_names(kwargs, renamed))

        cls.__init__ = __init__  # type: ignore[misc]
        for former, field in renamed.items():
            setattr(cls, former, property(lambda self, _f=field: getattr(self, _f), doc=f"Former name of ``{field}``."))
        return cls

    return decorate


def current_names(kwargs: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """``kwargs`` with former names replaced by the fields they stand for (before merging config dicts)."""
    out = {k: v for k, v in kwargs.items() if k not in renamed}
    for former, field in renamed.items():
        if former in kwargs:
            if field in kwargs and kwargs[field] != kwargs[former]:
                raise ValueError(
                    f"got {field}={kwargs[field]} and {former}={kwargs[former]} ({former} is the former name of "
                    f"{field}); pass only {field}"
                )
            out[field] = kwargs[former]
    return out
