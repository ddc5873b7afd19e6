"""Image folders for zero-shot classification and their class names (ImageNet's wnids or a names file)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from ..folder import RobustImageFolder, find_classes

WNID = re.compile(r"^n\d{8}$")


def imagenet_classnames(root: str | os.PathLike) -> tuple[list[str], list[str]]:
    """``(wnids, classnames)`` of an ImageNet-layout folder: 1000 WordNet-id class folders.

    The sorted wnids index open_clip's ``IMAGENET_CLASSNAMES`` (the standard ImageNet-1k class order).
    Raises ``FileNotFoundError`` for a missing folder and ``ValueError`` unless there are exactly 1000
    ``n########`` folders.
    """
    from open_clip import IMAGENET_CLASSNAMES

    wnids = find_classes(root)
    bad = [w for w in wnids if not WNID.match(w)]
    if bad or len(wnids) != len(IMAGENET_CLASSNAMES):
        raise ValueError(
            f"{root} holds {len(wnids)} class folders ({len(bad)} not named like n01440764, e.g. "
            f"{(bad or wnids)[:3]}); an ImageNet-1k folder needs the 1000 WordNet-id folders "
            "(use --folder for other class sets)"
        )
    return wnids, list(IMAGENET_CLASSNAMES)


def read_classnames(path: str | os.PathLike, folders: Sequence[str]) -> list[str]:
    """Class names for ``folders`` from a file: one name a line in folder order, or ``folder<TAB>name`` lines."""
    lines = [ln.rstrip("\n") for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if lines and all("\t" in ln for ln in lines):
        table = dict(ln.split("\t", 1) for ln in lines)
        missing = [f for f in folders if f not in table]
        if missing:
            raise ValueError(f"{path} names no class for folder(s) {missing[:5]}")
        return [table[f].strip() for f in folders]
    if len(lines) != len(folders):
        raise ValueError(f"{path} has {len(lines)} class names for {len(folders)} class folders")
    return [ln.strip() for ln in lines]


def zeroshot_folder(
    root: str | os.PathLike,
    transform: Callable | None = None,
    imagenet: bool = False,
    classnames_file: str | os.PathLike | None = None,
) -> tuple[RobustImageFolder, list[str]]:
    """An image folder ``root/<class>/<image>`` for zero-shot classification and its class names.

    The folder returns None for an unusable image (each counted once in its ``num_bad``): read it with
    :class:`~diffzoo.data.skipping.EvalDataLoader`, which leaves such images out instead of scoring a
    substitute twice.

    Args:
        root: the folder (e.g. ImageNet's ``val``).
        transform: applied to the PIL images (open_clip's ``preprocess``).
        imagenet: 1000 WordNet-id folders named by open_clip's ``IMAGENET_CLASSNAMES``.
        classnames_file: otherwise class names from this file (:func:`read_classnames`); default the
            folder names with ``_`` as spaces.
    """
    if imagenet:
        folders, names = imagenet_classnames(root)
    else:
        folders = find_classes(root)
        names = read_classnames(classnames_file, folders) if classnames_file else [f.replace("_", " ") for f in folders]
    return RobustImageFolder(root, folders, transform, "RGB", substitute=False), names
