"""Validation of head counts and widths, shared by every attention layer and model config."""

from __future__ import annotations

import numbers


def check_positive_int(name: str, value: object) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer >= 1 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def resolve_heads(
    dim: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    *,
    widths_per_head: int = 1,
) -> tuple[int, int]:
    """Check a head layout and fill in its defaults; return ``(num_kv_heads, head_dim)``.

    Args:
        dim: model width.
        num_heads: query heads (must be a positive multiple of ``num_kv_heads``).
        num_kv_heads: key/value heads, default ``num_heads``.
        head_dim: width of one head; default ``dim // (widths_per_head * num_heads)``, which must divide.
        widths_per_head: head widths each of the ``num_heads`` heads spans in ``dim`` (2 for a
            differential head, which holds two query/key pairs).

    Raises:
        ValueError: naming the value to change.
    """
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    for name, value in (("dim", dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        check_positive_int(name, value)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}; "
            f"choose num_kv_heads from the divisors of {num_heads}"
        )
    if head_dim is None:
        split = widths_per_head * num_heads
        if dim % split:
            what = "num_heads" if widths_per_head == 1 else f"{widths_per_head} * num_heads"
            raise ValueError(
                f"dim={dim} is not divisible by {what} = {split}; pass head_dim= explicitly "
                f"or use a dim that is a multiple of {split}"
            )
        head_dim = dim // split
    check_positive_int("head_dim", head_dim)
    return num_kv_heads, head_dim
