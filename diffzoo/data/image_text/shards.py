"""Image-text pairs in ``{jpg,txt}`` webdataset shards (the CC3M / CC12M layout): reading, writing, DataModule."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader

from ..folder import RobustImageFolder
from ..modules import check_train_loader, epoch_sampler
from ..shards import ShardImageDataset
from ..skipping import EvalDataLoader
from .inputs import OPENAI_MEAN, OPENAI_STD, require_tokenizer
from .zeroshot_folders import zeroshot_folder


class ShardImageTextDataset(ShardImageDataset):
    """``(transform(image), tokens)`` from ``{jpg,txt}`` webdataset shards (CC3M / CC12M layout).

    Splitting by node and worker, epoch shuffling and the skipping of corrupt shards are those of
    :class:`~diffzoo.data.shards.ShardImageDataset`. A sample without an image or a ``txt``, with an
    undecodable image, a caption that is not UTF-8 or an empty caption is skipped and counted in
    :attr:`num_bad` (the log names shard and sample key).

    Args:
        urls: shard paths / URLs or a brace pattern (``cc3m/{00000..00331}.tar``).
        transform: applied to the PIL image (open_clip's ``preprocess``).
        tokenizer: ``list[str] -> (n, L)`` tokens (``open_clip.get_tokenizer(name)``); None yields the caption string.
        samples_per_epoch, shuffle, shuffle_buffer, seed, mode: as :class:`ShardImageDataset`.
        caption_key: the caption's extension.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        transform: Callable | None = None,
        tokenizer: Callable | None = None,
        samples_per_epoch: int | None = None,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        mode: str = "RGB",
        caption_key: str = "txt",
    ) -> None:
        super().__init__(urls, transform, samples_per_epoch, shuffle, shuffle_buffer, seed, mode)
        self.tokenizer = tokenizer
        self.caption_key = caption_key

    def _target(self, sample: dict) -> str:
        if self.caption_key not in sample:
            raise ValueError(f"no caption ({self.caption_key})")
        raw = sample[self.caption_key]
        text = (raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)).strip()
        if not text:
            raise ValueError("empty caption")
        return text

    def _decode(self, sample: dict) -> tuple:
        item = super()._decode(sample)  # image decoding as for class shards; failures are skipped and counted
        if self.tokenizer is None:
            return item
        return item[0], self.tokenizer([item[1]])[0]


def write_image_text_shards(
    pairs: Iterable[tuple[Any, str]],
    pattern: str | os.PathLike,
    max_per_shard: int = 1000,
    image_format: str = "jpg",
    quality: int = 95,
) -> list[str]:
    """Write ``(image, caption)`` pairs as ``{jpg,txt}`` webdataset shards; returns the shard paths.

    Args:
        pairs: images as PIL images, uint8 arrays / tensors ``(H, W, 3)`` or ``(3, H, W)``, or encoded
            bytes (written as they are); captions as strings (stored UTF-8).
        pattern: shard path with a ``%d``-style field for the shard index, e.g. ``out/train-%06d.tar``.
        max_per_shard: samples per shard.
        image_format: ``jpg`` or ``png``.
        quality: JPEG quality.
    """
    pattern = str(pattern)
    if "%" not in pattern:
        raise ValueError(f"pattern {pattern!r} needs a shard-index field such as %06d")
    if image_format not in ("jpg", "png"):
        raise ValueError(f"image_format={image_format!r}; expected 'jpg' or 'png'")
    paths: list[str] = []
    tar: tarfile.TarFile | None = None

    def add(name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime = len(data), 0
        tar.addfile(info, io.BytesIO(data))

    try:
        for i, (image, text) in enumerate(pairs):
            if i % max_per_shard == 0:
                if tar is not None:
                    tar.close()
                path = pattern % len(paths)
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                tar = tarfile.open(path, "w")
                paths.append(path)
            add(f"{i:09d}.{image_format}", _encode_image(image, image_format, quality))
            add(f"{i:09d}.txt", str(text).encode("utf-8"))
    finally:
        if tar is not None:
            tar.close()
    return paths


def _encode_image(image: Any, fmt: str, quality: int) -> bytes:
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    if isinstance(image, Tensor):
        image = image.detach().cpu().numpy()
    if isinstance(image, np.ndarray):
        if image.ndim == 3 and image.shape[0] in (1, 3) and image.shape[-1] not in (1, 3):
            image = image.transpose(1, 2, 0)
        image = Image.fromarray(np.ascontiguousarray(image.astype(np.uint8)).squeeze())
    buf = io.BytesIO()
    image.convert("RGB").save(buf, "JPEG" if fmt == "jpg" else "PNG", **({"quality": quality} if fmt == "jpg" else {}))
    return buf.getvalue()


class ImageTextShardDataModule(pl.LightningDataModule):
    """CC3M / CC12M-style ``{jpg,txt}`` shards for training, optional val shards (retrieval) and an
    optional zero-shot image folder (ImageNet's val with ``zeroshot_imagenet=True``).

    Args:
        train_shards: shard paths / URLs or brace pattern of the training pairs.
        train_samples: pairs in one training epoch over all devices (CC3M as downloaded: ~2.9 M).
        val_shards: shards of held-out pairs scored by image-text retrieval, or None.
        zeroshot_dir: ``<dir>/<class>/<image>`` scored zero-shot, or None.
        zeroshot_imagenet: ``zeroshot_dir`` has the 1000 ImageNet wnid folders.
        zeroshot_classnames: class-name file for a non-ImageNet ``zeroshot_dir``.
        zeroshot_templates: ``"openai"`` (80 prompts) or ``"simple"`` (open_clip's short list).
        batch_size: per-device batch size.
        num_workers: DataLoader worker processes.
        seed: seed of the shard and sample order.
        shuffle_buffer: sample shuffle buffer per worker.
        tokenizer: ``list[str] -> (n, context_length)`` tokens, the model's (``open_clip.get_tokenizer``).
        image_size: model input size.
        mean, std: the model's image normalisation.

    The model's input settings (tokenizer, size, normalisation) are passed in; ``recipes.clip`` hands over
    its model's (:func:`~diffzoo.data.image_text.inputs.clip_image_settings`).

    ``test`` scores the validation loaders; ``predict`` classifies the zero-shot folder.
    """

    #: ``test`` scores the validation loaders again, so a recipe does not run it after ``fit``
    #: (``recipes._cli.TestAfterFit``)
    has_test_split = False

    def __init__(
        self,
        train_shards: str | list[str],
        train_samples: int,
        val_shards: str | list[str] | None = None,
        zeroshot_dir: str | None = None,
        zeroshot_imagenet: bool = True,
        zeroshot_classnames: str | None = None,
        zeroshot_templates: str = "openai",
        batch_size: int = 256,
        num_workers: int = 8,
        seed: int = 0,
        shuffle_buffer: int = 5000,
        tokenizer: Callable[[list[str]], Tensor] | None = None,
        image_size: int = 224,
        mean: Sequence[float] = OPENAI_MEAN,
        std: Sequence[float] = OPENAI_STD,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer"])  # an object: not in hyper-parameters or checkpoints
        self.tokenizer = tokenizer
        if train_samples < 1:
            raise ValueError(f"train_samples={train_samples} must be positive")
        if zeroshot_templates not in ("openai", "simple"):
            raise ValueError(f"zeroshot_templates={zeroshot_templates!r}; expected 'openai' or 'simple'")
        self.train_set: ShardImageTextDataset | None = None
        self.val_set: ShardImageTextDataset | None = None
        self.zeroshot_set: RobustImageFolder | None = None
        self.zeroshot_classnames: list[str] | None = None
        self.zeroshot_templates: list | None = None
        self.zeroshot_hard_negative = None

    @property
    def num_bad(self) -> int:
        """Corrupt shards, samples and unreadable zero-shot images skipped so far in this process."""
        return sum(getattr(ds, "num_bad", 0) for ds in (self.train_set, self.val_set, self.zeroshot_set) if ds is not None)

    def setup(self, stage: str | None = None) -> None:
        import open_clip

        require_tokenizer(self.tokenizer, "ImageTextShardDataModule")
        hp, tokenizer = self.hparams, self.tokenizer
        size, mean, std = hp.image_size, tuple(hp.mean), tuple(hp.std)
        val_tf = open_clip.image_transform(size, is_train=False, mean=mean, std=std)
        if self.train_set is None and stage in (None, "fit"):
            self.train_set = ShardImageTextDataset(
                hp.train_shards, open_clip.image_transform(size, is_train=True, mean=mean, std=std), tokenizer,
                samples_per_epoch=hp.train_samples, shuffle=True, shuffle_buffer=hp.shuffle_buffer, seed=hp.seed,
            )
        if self.val_set is None and hp.val_shards:
            self.val_set = ShardImageTextDataset(hp.val_shards, val_tf, tokenizer, shuffle=False)
        if self.zeroshot_set is None and hp.zeroshot_dir:
            self.zeroshot_set, self.zeroshot_classnames = zeroshot_folder(
                hp.zeroshot_dir, val_tf, hp.zeroshot_imagenet, hp.zeroshot_classnames
            )
            templates = open_clip.OPENAI_IMAGENET_TEMPLATES if hp.zeroshot_templates == "openai" \
                else open_clip.SIMPLE_IMAGENET_TEMPLATES
            self.zeroshot_templates = list(templates)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        loader = DataLoader(
            self.train_set, batch_size=hp.batch_size, num_workers=hp.num_workers, drop_last=True,
            pin_memory=torch.cuda.is_available(), persistent_workers=hp.num_workers > 0,
        )
        return check_train_loader(loader, f"data.train_samples={hp.train_samples}")

    def val_dataloader(self) -> list[DataLoader]:
        hp = self.hparams
        loaders = []
        if self.val_set is not None:
            loaders.append(DataLoader(self.val_set, batch_size=hp.batch_size, num_workers=hp.num_workers))
        if self.zeroshot_set is not None:
            loaders.append(EvalDataLoader(
                self.zeroshot_set, batch_size=hp.batch_size, num_workers=hp.num_workers,
                sampler=epoch_sampler(self.zeroshot_set, hp.seed, shuffle=False),
            ))
        return loaders

    test_dataloader = val_dataloader

    def predict_dataloader(self) -> DataLoader:
        """The zero-shot folder (classified zero-shot by ``predict``)."""
        if self.zeroshot_set is None:
            raise ValueError("predict classifies the zero-shot folder: set --data.init_args.zeroshot_dir")
        return self.val_dataloader()[-1]
