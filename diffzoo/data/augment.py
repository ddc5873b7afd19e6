"""timm augmentation that works with every supported Pillow.

timm's increasing-severity posterize (``PosterizeIncreasing``, in RandAugment policies with ``inc1`` such
as DeiT's ``rand-m9-mstd0.5-inc1``) keeps ``4 - int(4 * m / 10)`` bits, where the magnitude ``m`` is drawn
around 9 (``mstd0.5``) and clipped to ``[0, 10]``: whenever the draw reaches 10 it asks for 0 bits, meaning
"keep no bit" (a black image, as in the TensorFlow reference). Pillow up to 12.x computed exactly that;
Pillow 13 rejects ``bits=0`` with ``ValueError: bits must be between or equal to 1 and 8``.
:func:`posterize` restores the 0-bit result, and :func:`fix_posterize` puts it into a built transform.
"""

from __future__ import annotations

from typing import Any

from PIL import Image, ImageOps


def posterize(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """Keep the ``bits_to_keep`` most significant bits of every channel; 8 or more keeps the image and
    0 or fewer keeps no bit (every channel 0), whatever Pillow's own range check."""
    bits = int(bits_to_keep)
    if bits >= 8:
        return img
    if bits >= 1:
        return ImageOps.posterize(img, bits)
    return img.point([0] * 256 * len(img.getbands()))


def fix_posterize(transform: Any) -> int:
    """Make every timm posterize op inside ``transform`` (a ``Compose``, RandAugment or AutoAugment,
    nested in any way) call :func:`posterize`; returns how many ops were changed. The transform stays
    picklable (for DataLoader workers)."""
    from timm.data import auto_augment

    seen: set[int] = set()
    changed = 0

    def visit(obj: Any) -> None:
        nonlocal changed
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, auto_augment.AugmentOp):
            if obj.aug_fn is auto_augment.posterize:
                obj.aug_fn = posterize
                changed += 1
            return
        if isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item)
            return
        for name in ("transforms", "ops", "policy"):  # Compose, RandAugment / AugMixAugment, AutoAugment
            if hasattr(obj, name):
                visit(getattr(obj, name))

    visit(transform)
    return changed
