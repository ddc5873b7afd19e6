"""ImageNet-layout image folders (``<split>/<class>/<image>``) that survive bad files.

A missing folder or an empty class is an error raised when the data set is built. An unreadable or
truncated image met during training is skipped: it is logged, counted in :attr:`RobustImageFolder.num_bad`
(shared by the DataLoader workers), and replaced by the next readable image so batches stay full.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from PIL import Image
from torch.utils.data import Dataset

log = logging.getLogger("diffzoo.data")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm", ".tif", ".tiff")
# Give up after this many unreadable images in a row: the data is broken, not a few files.
MAX_CONSECUTIVE_BAD = 64


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


class RobustImageFolder(Dataset):
    """Images in ``root/<class>/*`` with integer labels; unreadable images are skipped and counted.

    Args:
        root: split folder (``.../train`` or ``.../val``).
        classes: class names defining label indices (default: the folders of ``root``).
        transform: applied to the PIL image.
        mode: PIL mode the images are converted to (``"RGB"`` or ``"L"``).
    """

    def __init__(
        self,
        root: os.PathLike,
        classes: Optional[Sequence[str]] = None,
        transform: Optional[Callable] = None,
        mode: str = "RGB",
    ) -> None:
        self.root = Path(root)
        self.classes = list(classes) if classes is not None else find_classes(self.root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder {self.root} does not exist")
        self.samples = scan_images(self.root, self.classes)
        self.transform = transform
        self.mode = mode
        self._num_bad = mp.Value("i", 0)  # shared with forked / spawned DataLoader workers

    @property
    def num_bad(self) -> int:
        """Failed image reads so far (all workers of this process; a bad file read twice counts twice)."""
        return int(self._num_bad.value)

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> Image.Image:
        """Open and fully decode one image (raises ``OSError`` for unreadable or truncated files)."""
        path, _ = self.samples[index]
        with Image.open(path) as img:
            img.load()  # decode now, so truncated files fail here and not inside a transform
            return img.convert(self.mode)

    def __getitem__(self, index: int):
        for attempt in range(MAX_CONSECUTIVE_BAD):
            i = (index + attempt) % len(self.samples)
            try:
                img = self.load(i)
            except (OSError, ValueError, SyntaxError) as e:  # PIL raises all three for bad files
                with self._num_bad.get_lock():
                    self._num_bad.value += 1
                log.warning("skipping unreadable image %s: %s", self.samples[i][0], e)
                continue
            if self.transform is not None:
                img = self.transform(img)
            return img, self.samples[i][1]
        raise RuntimeError(
            f"{MAX_CONSECUTIVE_BAD} unreadable images in a row from {self.samples[index][0]}; "
            "the data set looks corrupt"
        )
