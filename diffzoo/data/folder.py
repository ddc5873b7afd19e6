"""ImageNet-layout image folders (``<split>/<class>/<image>``) that survive bad files.

A missing folder or an empty class is an error raised when the data set is built. An unreadable or
truncated image, or one the transform fails on, is skipped: it is logged once, counted once in
:attr:`RobustImageFolder.num_bad` (shared by the DataLoader workers) and, in training, replaced by the next
usable image so batches stay full; in evaluation (``substitute=False``) it is left out (see
:mod:`diffzoo.data.skipping`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from .skipping import MAX_CONSECUTIVE_BAD, SkipsBadItems  # noqa: F401  (MAX_CONSECUTIVE_BAD re-exported)

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm", ".tif", ".tiff")


def find_classes(root: os.PathLike) -> list[str]:
    """Sorted class folder names under ``root``; raises if ``root`` is missing or has no class folders."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"image folder {root} does not exist; expected the ImageNet layout {root}/<class>/<image>.JPEG"
        )
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"{root} has no class folders; expected {root}/<class>/<image>.JPEG")
    return classes


def scan_images(
    root: os.PathLike, classes: Sequence[str], extensions: Sequence[str] = IMG_EXTENSIONS
) -> list[tuple[str, int]]:
    """``(path, class_index)`` for every image under ``root/<class>/``, in sorted order.

    Raises ``ValueError`` naming the class folders that hold no image (an empty class would silently
    change the label space). Class folders missing from ``root`` are allowed (a validation split may
    hold a subset of the training classes).
    """
    root, exts = Path(root), tuple(e.lower() for e in extensions)
    samples, empty = [], []
    for idx, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            continue
        files = sorted(
            os.path.join(dirpath, f)
            for dirpath, _, filenames in os.walk(folder, followlinks=True)
            for f in filenames
            if f.lower().endswith(exts)
        )
        if not files:
            empty.append(str(folder))
        samples.extend((f, idx) for f in files)
    if empty:
        raise ValueError(f"{len(empty)} empty class folder(s) (no {', '.join(exts)} files): {', '.join(empty[:5])}")
    if not samples:
        raise ValueError(f"no images found under {root}")
    return samples


class RobustImageFolder(SkipsBadItems):
    """Images in ``root/<class>/*`` with integer labels; unusable images are skipped and counted once.

    Args:
        root: split folder (``.../train`` or ``.../val``).
        classes: class names defining label indices (default: the folders of ``root``).
        transform: applied to the PIL image.
        mode: PIL mode the images are converted to (``"RGB"`` or ``"L"``).
        substitute: replace a skipped image by the next usable one (training); False returns None for it,
            to be left out by :class:`~diffzoo.data.skipping.EvalDataLoader` (evaluation).
    """

    # PIL raises all of these for broken files
    read_errors = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
    bad_noun = "unreadable images"

    def __init__(
        self,
        root: os.PathLike,
        classes: Sequence[str] | None = None,
        transform: Callable | None = None,
        mode: str = "RGB",
        substitute: bool = True,
    ) -> None:
        self.root = Path(root)
        self.classes = list(classes) if classes is not None else find_classes(self.root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder {self.root} does not exist")
        self.samples = scan_images(self.root, self.classes)
        self.transform = transform
        self.mode = mode
        self.init_skipping(len(self.samples), substitute)

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> Image.Image:
        """Open and fully decode one image (raises ``OSError`` for unreadable or truncated files)."""
        path, _ = self.samples[index]
        with Image.open(path) as img:
            img.load()  # decode now, so truncated files fail here and not inside a transform
            return img.convert(self.mode)

    def read(self, index: int) -> Image.Image:
        return self.load(index)

    def finish(self, index: int, raw: Image.Image) -> tuple[Any, int]:
        return (self.transform(raw) if self.transform is not None else raw), self.samples[index][1]

    def describe(self, index: int) -> str:
        return f"image {self.samples[index][0]}"
