"""Image-text data for contrastive (CLIP) training: the embedded coloured digits and webdataset shards.

DiffCLIP (Hammoud & Ghanem, arXiv 2503.06626) trains CLIP with differential attention on CC3M / CC12M
image-text pairs. Two sources are provided here:

* **Coloured digits** (the embedded default, no download): the 5,000 real MNIST digits of
  :func:`diffzoo.data.embedded.load_mnist_5k`, drawn in a foreground colour on a background colour at
  32x32 RGB and captioned ``"a red seven on a blue background"``. Six colours give 30 ordered
  ``(fg, bg)`` pairs; six of them (:func:`heldout_pairs`) never occur in training and form the zero-shot
  test split, while their swapped pairs (``blue`` on ``red``) are trained on, so scoring the held-out
  pairs needs the caption's attributes bound to the right object, not a bag of words. Digit images are
  split first (train / val / test images are disjoint), then coloured.
* **Image-text shards** in the CC3M / CC12M webdataset layout (``<key>.jpg`` + ``<key>.txt``, as written
  by img2dataset): brace-expanded URLs, split by node and DataLoader worker, UTF-8 captions tokenised by
  a passed tokenizer; a corrupt shard or sample is logged, counted and skipped.

Images are tensors ``(3, H, W)`` through a ``transform`` argument, so open_clip's ``preprocess`` (a PIL
transform; pass ``as_pil=True`` for the digits) or a tensor transform (:class:`ToFloatTensor`) can be used.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from .embedded import load_mnist_5k
from .folder import RobustImageFolder, find_classes
from .modules import check_train_loader, epoch_sampler
from .shards import ShardImageDataset
from .skipping import EvalDataLoader

log = logging.getLogger("diffzoo.data")

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip.OPENAI_DATASET_MEAN (open_clip imported lazily)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

# Colour names and their RGB values; kept far apart so that a 32x32 rendering is unambiguous.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (40, 70, 230),
    "yellow": (240, 220, 30),
    "white": (245, 245, 245),
    "black": (10, 10, 10),
}
COLOR_NAMES: tuple[str, ...] = tuple(PALETTE)
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
CAPTION_TEMPLATES: tuple[str, ...] = ("a {}",)  # class name "red seven on a blue background" -> the caption


def clip_model_config(model: str) -> dict[str, Any] | None:
    """open_clip's config dict of ``model``, or None for a name open_clip does not know.

    The names come from open_clip's registry: its own models, and diffzoo's CLIP family, which
    ``import diffzoo`` registers (this module never imports the models).
    """
    import open_clip

    return open_clip.get_model_config(model)


def clip_preprocess_cfg(model: str) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """``(image_size, mean, std)`` that ``model``'s open_clip config asks for (OpenAI mean/std by default)."""
    cfg = clip_model_config(model)
    if cfg is None:
        raise ValueError(f"unknown open_clip model {model!r}; see open_clip.list_models()")
    vision = cfg.get("vision_cfg", {})
    size = vision.get("image_size", 224)
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    pre = {**_find_key(vision, "preprocess_cfg"), **cfg.get("preprocess_cfg", {})}
    mean = pre.get("mean", vision.get("image_mean", OPENAI_MEAN))
    std = pre.get("std", vision.get("image_std", OPENAI_STD))
    return size, tuple(mean), tuple(std)


def _find_key(cfg: dict, key: str) -> dict:
    """The first dict stored under ``key`` anywhere in a nested config (tower options may nest it)."""
    if isinstance(cfg.get(key), dict):
        return cfg[key]
    for value in cfg.values():
        if isinstance(value, dict) and (found := _find_key(value, key)):
            return found
    return {}


# -- coloured digits ------------------------------------------------------------------------------
def color_pairs(num_colors: int = len(PALETTE)) -> list[tuple[int, int]]:
    """All ordered ``(fg, bg)`` colour index pairs with ``fg != bg``, in a fixed order."""
    return [(f, b) for f in range(num_colors) for b in range(num_colors) if f != b]


def heldout_pairs(num_colors: int = len(PALETTE)) -> list[tuple[int, int]]:
    """The ``(fg, bg)`` pairs never shown in training: ``(c, c + 1 mod n)`` for every colour ``c``.

    Every colour is held out once as foreground and once as background, and the swapped pair
    ``(c + 1, c)`` stays in training, so a model must bind each colour to digit or background.
    """
    return [(c, (c + 1) % num_colors) for c in range(num_colors)]


def caption(digit: int, fg: int, bg: int) -> str:
    """``"a red seven on a blue background"`` for digit 7, foreground red, background blue."""
    return CAPTION_TEMPLATES[0].format(class_name(digit, fg, bg))


def class_name(digit: int, fg: int, bg: int) -> str:
    """The zero-shot class name of a (digit, fg, bg) combination: ``"red seven on a blue background"``."""
    return f"{COLOR_NAMES[fg]} {DIGIT_WORDS[digit]} on a {COLOR_NAMES[bg]} background"


def digit_classes(num_colors: int = len(PALETTE)) -> tuple[list[str], dict[tuple[int, int, int], int]]:
    """All ``10 x n(n-1)`` class names (every digit and colour pair) and the ``(digit, fg, bg) -> index`` map."""
    names, index = [], {}
    for d in range(10):
        for f, b in color_pairs(num_colors):
            index[(d, f, b)] = len(names)
            names.append(class_name(d, f, b))
    return names, index


def render_digits(digits: Tensor, fg: Tensor, bg: Tensor, offsets: Tensor, size: int = 32) -> Tensor:
    """Colour grey digits: ``bg + (grey / 255) * (fg - bg)`` on a ``size`` x ``size`` canvas.

    Args:
        digits: uint8 ``(N, 28, 28)`` grey digits (white strokes on black).
        fg, bg: ``(N,)`` colour indices into :data:`PALETTE`.
        offsets: ``(N, 2)`` top-left ``(y, x)`` of the digit on the canvas, each in ``0..size-28``.

    Returns:
        uint8 ``(N, 3, size, size)``.
    """
    rgb = torch.tensor(list(PALETTE.values()), dtype=torch.float32)  # (C, 3)
    alpha = torch.zeros(len(digits), 1, size, size)
    for i, (y, x) in enumerate(offsets.tolist()):
        alpha[i, 0, y : y + 28, x : x + 28] = digits[i].float() / 255.0
    f, b = rgb[fg][:, :, None, None], rgb[bg][:, :, None, None]  # (N, 3, 1, 1)
    return (b + alpha * (f - b)).round().clamp(0, 255).to(torch.uint8)


class ToFloatTensor:
    """uint8 ``(3, H, W)`` -> normalised float ``(3, size, size)`` (bicubic resize when ``size`` differs).

    Picklable, so it works in DataLoader worker processes.
    """

    def __init__(
        self, size: int | None = None, mean: Sequence[float] = OPENAI_MEAN, std: Sequence[float] = OPENAI_STD
    ) -> None:
        self.size = size
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]

    def __call__(self, image: Tensor) -> Tensor:
        x = image.float() / 255.0
        if self.size is not None and tuple(x.shape[-2:]) != (self.size, self.size):
            x = F.interpolate(x[None], size=(self.size, self.size), mode="bicubic", align_corners=False)[0].clamp(0, 1)
        return (x - self.mean) / self.std


class ColoredDigits(Dataset):
    """One split of the coloured digits: uint8 images, their captions, digits and colours.

    Items are ``(transform(image), target)`` with target chosen by ``target``: ``"tokens"`` (the caption
    tokenised by ``tokenizer``; training and retrieval), ``"label"`` (index into :func:`digit_classes`;
    zero-shot classification) or ``"caption"`` (the string).

    Args:
        images: uint8 ``(N, 3, H, W)``.
        digits, fg, bg: ``(N,)`` digit labels and colour indices.
        transform: applied to the uint8 ``(3, H, W)`` tensor, or to a PIL image with ``as_pil=True``
            (open_clip's ``preprocess``); default :class:`ToFloatTensor` (OpenAI mean/std, no resize).
        tokenizer: a callable ``list[str] -> (n, context_length)`` token tensor (open_clip's tokenizers).
        target: ``"tokens"``, ``"label"`` or ``"caption"``.
        as_pil: hand ``transform`` a PIL image instead of a tensor.
    """

    def __init__(
        self,
        images: Tensor,
        digits: Tensor,
        fg: Tensor,
        bg: Tensor,
        transform: Callable | None = None,
        tokenizer: Callable | None = None,
        target: str = "tokens",
        as_pil: bool = False,
    ) -> None:
        if target not in ("tokens", "label", "caption"):
            raise ValueError(f"target={target!r}; expected 'tokens', 'label' or 'caption'")
        if target == "tokens" and tokenizer is None:
            raise ValueError("target='tokens' needs a tokenizer (e.g. open_clip.get_tokenizer(model_name))")
        if as_pil and transform is None:
            raise ValueError("as_pil=True needs a transform that turns the PIL image into a tensor")
        self.images, self.digits, self.fg, self.bg = images, digits, fg, bg
        self.transform = transform if transform is not None else ToFloatTensor()
        self.target, self.as_pil = target, as_pil
        self.captions = [caption(d, f, b) for d, f, b in zip(digits.tolist(), fg.tolist(), bg.tolist())]
        _, index = digit_classes()
        self.labels = torch.tensor([index[k] for k in zip(digits.tolist(), fg.tolist(), bg.tolist())], dtype=torch.long)
        self.tokens: Tensor | None = None
        if tokenizer is not None:  # few distinct captions: tokenise each once
            unique = sorted(set(self.captions))
            table = tokenizer(unique)
            row = {c: i for i, c in enumerate(unique)}
            self.tokens = table[torch.tensor([row[c] for c in self.captions], dtype=torch.long)]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image = self.images[index]
        if self.as_pil:
            image = Image.fromarray(image.permute(1, 2, 0).numpy())
        x = self.transform(image)
        if self.target == "tokens":
            return x, self.tokens[index]
        if self.target == "label":
            return x, int(self.labels[index])
        return x, self.captions[index]


def colored_digit_splits(
    num_val: int = 500,
    num_test: int = 1000,
    colorings: int = 1,
    size: int = 32,
    seed: int = 0,
    limit: int | None = None,
) -> dict[str, dict[str, Tensor]]:
    """Render the coloured-digit splits (deterministic for a given ``seed``).

    The MNIST images are split into disjoint train / val / test sets. Train (``colorings`` colourings of
    each digit image) and val (one colouring) use only the seen ``(fg, bg)`` pairs; test uses only the
    :func:`heldout_pairs`. Each digit lands at a random offset on the ``size`` x ``size`` canvas.

    Returns:
        ``{"train"|"val"|"test": {"images": uint8 (N, 3, size, size), "digits", "fg", "bg": (N,)}}``.
    """
    if size < 28:
        raise ValueError(f"size={size}: the 28x28 digits need a canvas of at least 28 pixels")
    if colorings < 1:
        raise ValueError(f"colorings={colorings} must be at least 1")
    grey, labels = load_mnist_5k()
    perm = torch.randperm(len(grey), generator=torch.Generator().manual_seed(seed))
    if limit is not None:
        perm = perm[:limit]
    n = len(perm)
    if num_val + num_test >= n:
        raise ValueError(f"num_val={num_val} + num_test={num_test} leave no training digits out of {n}")
    idx = {"test": perm[:num_test], "val": perm[num_test : num_test + num_val], "train": perm[num_test + num_val :]}
    held = torch.tensor(heldout_pairs())
    seen = torch.tensor([p for p in color_pairs() if p not in heldout_pairs()])

    def coloring(pairs: Tensor, tag: int) -> tuple[Tensor, Tensor]:
        # One (pair, offset) per MNIST image, drawn for all 5,000: an image is coloured the same whatever
        # limit / num_val / num_test are, so a subset of a split is the same images in the same colours.
        g = torch.Generator().manual_seed(seed * 1_000_003 + tag)
        return pairs[torch.randint(len(pairs), (len(grey),), generator=g)], torch.randint(0, size - 27, (len(grey), 2), generator=g)

    out = {}
    for split, which in idx.items():
        tags = [0] if split == "test" else range(1, 1 + (colorings if split == "train" else 1))
        parts = [tuple(t[which] for t in coloring(held if split == "test" else seen, tag)) for tag in tags]
        choice, offsets = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        which = which.repeat(len(parts))
        fg, bg = choice[:, 0].contiguous(), choice[:, 1].contiguous()
        out[split] = {
            "images": render_digits(grey[which], fg, bg, offsets, size),
            "digits": labels[which].clone(),
            "fg": fg,
            "bg": bg,
        }
    return out


class ColoredDigitsDataModule(pl.LightningDataModule):
    """The embedded default for CLIP: coloured MNIST digits with captions and held-out colour pairs.

    Batches: training and the first validation loader give ``(images, tokens)`` (retrieval on seen
    combinations); the second validation loader gives ``(images, labels)`` over the held-out pairs, to be
    scored zero-shot against :attr:`zeroshot_classnames` with :attr:`zeroshot_templates`.
    :attr:`zeroshot_hard_negative` maps each class to its colour-swapped class (binding test).
    ``test`` scores the same two loaders; ``predict`` classifies the held-out-pair images zero-shot.

    Args:
        model: open_clip model name; gives the tokenizer, input size and normalisation.
        batch_size: per-device batch size.
        num_workers: DataLoader workers (0 is fastest for these in-memory tensors).
        seed: seed of the training order.
        split_seed: seed of the split and the colouring (kept fixed across runs being compared).
        num_val: digit images of the seen-pair validation split (retrieval).
        num_test: digit images of the held-out-pair zero-shot split.
        colorings: colourings of each training digit image (a fixed, larger training set).
        image_size: model input size; default from the model's open_clip config.
        limit: use only ``limit`` digit images (tests).
    """

    def __init__(
        self,
        model: str = "DiffCLIP-nano",
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        split_seed: int = 0,
        num_val: int = 500,
        num_test: int = 1000,
        colorings: int = 1,
        image_size: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.zeroshot_classnames, index = digit_classes()
        self.zeroshot_templates = list(CAPTION_TEMPLATES)
        self.zeroshot_hard_negative = torch.tensor([index[(d, b, f)] for (d, f, b) in index], dtype=torch.long)
        self.data_name = "coloured MNIST digits"
        self.train_set: ColoredDigits | None = None
        self.val_set: ColoredDigits | None = None
        self.test_set: ColoredDigits | None = None
        self.num_bad = 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        import open_clip

        hp = self.hparams
        size, mean, std = clip_preprocess_cfg(hp.model)
        transform = ToFloatTensor(hp.image_size or size, mean, std)
        tokenizer = open_clip.get_tokenizer(hp.model)
        splits = colored_digit_splits(hp.num_val, hp.num_test, hp.colorings, 32, hp.split_seed, hp.limit)
        self.train_set = ColoredDigits(**splits["train"], transform=transform, tokenizer=tokenizer)
        self.val_set = ColoredDigits(**splits["val"], transform=transform, tokenizer=tokenizer)
        self.test_set = ColoredDigits(**splits["test"], transform=transform, target="label")

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        loader = DataLoader(
            self.train_set, batch_size=hp.batch_size, sampler=epoch_sampler(self.train_set, hp.seed),
            num_workers=hp.num_workers, drop_last=True, persistent_workers=hp.num_workers > 0,
        )
        return check_train_loader(loader, f"the training split ({len(self.train_set)} coloured digits)")

    def val_dataloader(self) -> list[DataLoader]:
        hp = self.hparams
        return [
            DataLoader(self.val_set, batch_size=hp.batch_size, shuffle=False, num_workers=hp.num_workers),
            DataLoader(self.test_set, batch_size=hp.batch_size, shuffle=False, num_workers=hp.num_workers),
        ]

    test_dataloader = val_dataloader

    def predict_dataloader(self) -> DataLoader:
        hp = self.hparams
        return DataLoader(self.test_set, batch_size=hp.batch_size, shuffle=False, num_workers=hp.num_workers)


# -- image-text shards ----------------------------------------------------------------------------
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


# -- zero-shot image folders ----------------------------------------------------------------------
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


class ImageTextShardDataModule(pl.LightningDataModule):
    """CC3M / CC12M-style ``{jpg,txt}`` shards for training, optional val shards (retrieval) and an
    optional zero-shot image folder (ImageNet's val with ``zeroshot_imagenet=True``).

    Args:
        model: open_clip model name; gives the tokenizer, input size and normalisation.
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
        image_size: model input size; default from the model's open_clip config.

    ``test`` scores the validation loaders; ``predict`` classifies the zero-shot folder.
    """

    def __init__(
        self,
        model: str,
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
        image_size: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
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

        hp = self.hparams
        size, mean, std = clip_preprocess_cfg(hp.model)
        size = hp.image_size or size
        tokenizer = open_clip.get_tokenizer(hp.model)
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
