"""Cluttered digits: one whole MNIST digit on a larger canvas among ``k`` fragments of other digits.

Built from the embedded digits (:func:`diffzoo.data.embedded.load_mnist_5k`, no download). Each image is
a ``canvas x canvas`` grey canvas holding the target digit (28 x 28, whole, at a random place) and ``k``
distractor fragments: random ``fragment x fragment`` crops of other digits at random places, merged by
the pixel-wise maximum, so a fragment may overlap the target. The class is the target digit. ``k`` is
the knob that adds attention noise: the patches of the fragments look like parts of digits but carry no
information about the label.

The 5,000 digits are split once (fixed seed) into training, validation and test digits; the fragments
of an image come from the digits of its own split. Training images are composed afresh every epoch
from ``seed``; validation and test images are fixed.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from .embedded import MNIST_MEAN, MNIST_STD, load_mnist_5k

__all__ = ["ClutteredDigits", "ClutteredDigitsDataModule", "compose"]

SPLIT_SEED = 0
EVAL_SEEDS = (10_001, 10_002)


def _offsets(limit: int, align: int, g: torch.Generator) -> list[int]:
    """Two random offsets in ``0 .. limit`` that are multiples of ``align`` (``align = 1``: any pixel)."""
    return [int(v) * align for v in torch.randint(limit // align + 1, (2,), generator=g)]


def compose(digits: Tensor, target: int, k: int, canvas: int, fragment: int, g: torch.Generator,
            align: int = 1) -> Tensor:
    """One ``(canvas, canvas)`` uint8 image: ``digits[target]`` whole plus ``k`` crops of other digits.

    With ``align > 1`` the digit, the fragments and the crops inside the source digits all sit at multiples
    of ``align`` pixels: with ``align`` equal to the ViT's patch size, the digit covers whole patches and
    every fragment patch is a patch of some other digit, so the fragments are made of the same kind of
    tokens as the target.
    """
    n, h, w = digits.shape
    if canvas < max(h, w) or not 1 <= fragment <= min(h, w):
        raise ValueError(f"canvas={canvas} must hold a {h}x{w} digit and fragment={fragment} must be 1..{min(h, w)}")
    if align < 1 or (align > 1 and (canvas % align or h % align or w % align or fragment % align)):
        raise ValueError(f"align={align} must be 1 or divide the canvas ({canvas}), the digit ({h}) and the "
                         f"fragment ({fragment})")
    img = torch.zeros(canvas, canvas, dtype=torch.uint8)
    y, x = _offsets(canvas - h, align, g)
    img[y:y + h, x:x + w] = digits[target]
    for _ in range(k):
        src = int(torch.randint(n - 1, (1,), generator=g))
        src += int(src >= target)  # any digit but the target
        if align > 1:
            cy, cx = _offsets(h - fragment, align, g)
        else:  # crops centred in the digit's middle 20x20 so that a fragment holds ink
            cy, cx = torch.randint(4, h - 4 - fragment + 1, (2,), generator=g).tolist() if fragment <= h - 8 else (0, 0)
        py, px = _offsets(canvas - fragment, align, g)
        patch = digits[src, cy:cy + fragment, cx:cx + fragment]
        region = img[py:py + fragment, px:px + fragment]
        torch.maximum(region, patch, out=region)
    return img


def _normalise(img: Tensor) -> Tensor:
    return ((img.float() / 255.0) - MNIST_MEAN).div_(MNIST_STD).unsqueeze(0)  # (1, H, W)


class ClutteredDigits(Dataset):
    """Training images composed on the fly: item ``i`` of epoch ``e`` is drawn from seed ``(seed, e, i)``."""

    def __init__(self, digits: Tensor, labels: Tensor, k: int, canvas: int, fragment: int, seed: int = 0,
                 align: int = 1) -> None:
        self.digits, self.labels, self.k, self.canvas, self.fragment, self.seed = digits, labels, k, canvas, fragment, seed
        self.align = align
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 100_003 + i)
        img = compose(self.digits, i, self.k, self.canvas, self.fragment, g, self.align)
        return _normalise(img), self.labels[i]


def fixed_set(digits: Tensor, labels: Tensor, k: int, canvas: int, fragment: int, seed: int,
              align: int = 1) -> TensorDataset:
    """Every digit of a split composed once with a fixed seed (validation / test images)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.stack([_normalise(compose(digits, i, k, canvas, fragment, g, align)) for i in range(len(labels))])
    return TensorDataset(images, labels)


class ClutteredDigitsDataModule(pl.LightningDataModule):
    """Cluttered digits for the ViT recipes.

    Args:
        k: distractor fragments per image (the noise knob).
        canvas: canvas side in pixels (42 with 7 x 7 patches: 36 patches; 84: 144 patches).
        fragment: side of a distractor fragment in pixels.
        num_val, num_test: digits held out for validation (model selection) and test (reported).
        batch_size, num_workers: loader settings.
        seed: seed of the training compositions (the split and the held-out images are fixed).
        align: positions snap to multiples of this many pixels (set it to the patch size so that the digit and the
            fragments cover whole patches; 1: any pixel).
        limit_train: use only the first ``limit_train`` training digits (None: all; smoke runs).
        shuffle_labels: permute the training labels once (from ``seed``), a control: validation and test keep
            their true labels, so a model trained this way measures the metric's floor.
        score_test: score the test set beside the validation set at every validation (False: the test
            set is never looked at during fit; a study's learning-rate grid runs this way).
    """

    num_classes = 10
    in_chans = 1

    def __init__(self, k: int = 4, canvas: int = 64, fragment: int = 12, num_val: int = 500, num_test: int = 1000,
                 batch_size: int = 64, num_workers: int = 0, seed: int = 0, limit_train: int | None = None,
                 align: int = 1, shuffle_labels: bool = False, score_test: bool = True) -> None:
        super().__init__()
        self.score_test = score_test
        if k < 0:
            raise ValueError(f"k={k} distractor fragments must be >= 0")
        if canvas < 28:
            raise ValueError(f"canvas={canvas} must be >= 28 to hold a whole digit")
        self.k, self.canvas, self.fragment, self.align = k, canvas, fragment, align
        self.shuffle_labels = shuffle_labels
        self.img_size = canvas
        self.num_val, self.num_test = num_val, num_test
        self.batch_size, self.num_workers, self.seed, self.limit_train = batch_size, num_workers, seed, limit_train
        self.chance = 0.1
        self.train_set: ClutteredDigits | None = None
        self.eval_sets: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = load_mnist_5k()
        if not 0 < self.num_val + self.num_test < len(labels):
            raise ValueError(f"num_val + num_test = {self.num_val + self.num_test} must be below {len(labels)}")
        perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
        val, test = perm[:self.num_val], perm[self.num_val:self.num_val + self.num_test]
        train = perm[self.num_val + self.num_test:][:self.limit_train]
        train_labels = labels[train]
        if self.shuffle_labels:
            train_labels = train_labels[torch.randperm(len(train), generator=torch.Generator().manual_seed(self.seed))]
        self.train_set = ClutteredDigits(images[train], train_labels, self.k, self.canvas, self.fragment, self.seed,
                                         self.align)
        for name, idx, seed in (("val", val, EVAL_SEEDS[0]), ("test", test, EVAL_SEEDS[1])):
            self.eval_sets[name] = fixed_set(images[idx], labels[idx], self.k, self.canvas, self.fragment, seed,
                                             self.align)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          drop_last=True)

    def _loader(self, name: str) -> DataLoader:
        return DataLoader(self.eval_sets[name], batch_size=256, num_workers=self.num_workers)

    def val_dataloader(self) -> list[DataLoader]:
        """The validation set (model selection) and, with ``score_test``, the test set (reported)."""
        return [self._loader("val"), self._loader("test")] if self.score_test else [self._loader("val")]

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
