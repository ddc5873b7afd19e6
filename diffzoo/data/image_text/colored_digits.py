"""The embedded image-text default: coloured MNIST digits with captions and held-out colour pairs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ..embedded import load_mnist_5k
from ..modules import check_train_loader, epoch_sampler
from .inputs import OPENAI_MEAN, OPENAI_STD, ToFloatTensor, require_tokenizer

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


def check_num_colors(num_colors: int) -> None:
    """Raise ``ValueError`` unless ``3 <= num_colors <= len(PALETTE)``: with two colours every seen pair
    would be the swap of a held-out one and nothing would be left to bind."""
    if not 3 <= num_colors <= len(PALETTE):
        raise ValueError(f"num_colors={num_colors}: expected 3 to {len(PALETTE)} (the colours of PALETTE: "
                         f"{', '.join(COLOR_NAMES)})")


def check_digits(digits: Sequence[int] | None) -> tuple[int, ...]:
    """``digits`` as a sorted tuple (None: all ten); ``ValueError`` unless it holds at least two distinct
    digits from 0 to 9."""
    if digits is None:
        return tuple(range(10))
    out = tuple(sorted({int(d) for d in digits}))
    if len(out) < 2 or out[0] < 0 or out[-1] > 9 or len(out) != len(list(digits)):
        raise ValueError(f"digits={list(digits)}: expected at least two distinct digits from 0 to 9")
    return out


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


def digit_classes(
    num_colors: int = len(PALETTE), digits: Sequence[int] | None = None
) -> tuple[list[str], dict[tuple[int, int, int], int]]:
    """All ``len(digits) x n(n-1)`` class names (every digit in use, default all ten, with every colour pair)
    and the ``(digit, fg, bg) -> index`` map."""
    names, index = [], {}
    for d in check_digits(digits):
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
        index: ``(N,)`` the MNIST image each item was drawn from (:func:`colored_digit_splits`), kept as
            :attr:`index`; None when unknown.
        num_colors, class_digits: the colours (the first ``num_colors`` of :data:`PALETTE`) and digits
            (default all ten) in use; they set the label space (:func:`digit_classes`).
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
        index: Tensor | None = None,
        num_colors: int = len(PALETTE),
        class_digits: Sequence[int] | None = None,
    ) -> None:
        check_num_colors(num_colors)
        allowed = check_digits(class_digits)
        outside = sorted(set(digits.unique().tolist()) - set(allowed))
        if outside:
            raise ValueError(f"digits {outside} are outside class_digits={list(allowed)}")
        if len(fg) and int(torch.maximum(fg, bg).max()) >= num_colors:
            raise ValueError(f"colour index {int(torch.maximum(fg, bg).max())} is outside num_colors={num_colors}")
        if target not in ("tokens", "label", "caption"):
            raise ValueError(f"target={target!r}; expected 'tokens', 'label' or 'caption'")
        if target == "tokens" and tokenizer is None:
            raise ValueError("target='tokens' needs a tokenizer (e.g. open_clip.get_tokenizer(model_name))")
        if as_pil and transform is None:
            raise ValueError("as_pil=True needs a transform that turns the PIL image into a tensor")
        self.images, self.digits, self.fg, self.bg, self.index = images, digits, fg, bg, index
        self.transform = transform if transform is not None else ToFloatTensor()
        self.target, self.as_pil = target, as_pil
        self.captions = [caption(d, f, b) for d, f, b in zip(digits.tolist(), fg.tolist(), bg.tolist())]
        _, class_index = digit_classes(num_colors, class_digits)
        self.labels = torch.tensor([class_index[k] for k in zip(digits.tolist(), fg.tolist(), bg.tolist())], dtype=torch.long)
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
    num_val_heldout: int = 500,
    num_colors: int = len(PALETTE),
    digits: Sequence[int] | None = None,
) -> dict[str, dict[str, Tensor]]:
    """Render the coloured-digit splits (deterministic for a given ``seed``).

    The MNIST images (shuffled by ``seed``, the first ``limit`` of them) are split into four disjoint sets,
    in this order: ``num_test`` test, ``num_val`` val, ``num_val_heldout`` val-heldout images, and the rest
    for training. Train (``colorings`` colourings of each digit image) and val (one colouring) use only the
    seen ``(fg, bg)`` pairs; test and val-heldout use only the :func:`heldout_pairs`. Each digit lands at a
    random offset on the ``size`` x ``size`` canvas. Test and val are the same images in the same colours
    whatever ``num_val_heldout`` is: the val-heldout images come out of the training images.

    ``num_colors`` (3 to 6) uses only the first colours of :data:`PALETTE`: fewer colour pairs, so fewer
    distinct captions, but also fewer seen pairs to learn the binding from (in a softmax CLIP pilot with four
    colours, zero-shot top-1 on the held-out pairs stayed near zero).
    ``digits`` keeps only the MNIST images of those digits (default all ten), before ``limit`` and the split:
    a smaller task with fewer captions, the colour pairs unchanged. The defaults give the splits this
    function always gave.

    Returns:
        ``{"train"|"val"|"val_heldout"|"test": {"images": uint8 (N, 3, size, size), "digits", "fg", "bg": (N,),
        "index": (N,) the MNIST image index}}``.
    """
    check_num_colors(num_colors)
    keep = check_digits(digits)
    if size < 28:
        raise ValueError(f"size={size}: the 28x28 digits need a canvas of at least 28 pixels")
    if colorings < 1:
        raise ValueError(f"colorings={colorings} must be at least 1")
    if min(num_val, num_test, num_val_heldout) < 0:
        raise ValueError(f"num_val={num_val}, num_test={num_test}, num_val_heldout={num_val_heldout} must not be negative")
    grey, labels = load_mnist_5k()
    perm = torch.randperm(len(grey), generator=torch.Generator().manual_seed(seed))
    if digits is not None:
        perm = perm[torch.isin(labels[perm], torch.tensor(keep))]
    if limit is not None:
        perm = perm[:limit]
    n = len(perm)
    held_out = num_test + num_val + num_val_heldout
    if held_out >= n:
        raise ValueError(f"num_test={num_test} + num_val={num_val} + num_val_heldout={num_val_heldout} leave no "
                         f"training digits out of {n}")
    a, b = num_test, num_test + num_val
    idx = {"test": perm[:a], "val": perm[a:b], "val_heldout": perm[b:held_out], "train": perm[held_out:]}
    held = torch.tensor(heldout_pairs(num_colors))
    seen = torch.tensor([p for p in color_pairs(num_colors) if p not in heldout_pairs(num_colors)])

    def coloring(pairs: Tensor, tag: int) -> tuple[Tensor, Tensor]:
        # One (pair, offset) per MNIST image, drawn for all 5,000: an image is coloured the same whatever
        # limit / num_val / num_test are, so a subset of a split is the same images in the same colours.
        g = torch.Generator().manual_seed(seed * 1_000_003 + tag)
        return pairs[torch.randint(len(pairs), (len(grey),), generator=g)], torch.randint(0, size - 27, (len(grey), 2), generator=g)

    out = {}
    for split, which in idx.items():
        heldout_split = split in ("test", "val_heldout")
        # held-out pairs: colouring 0 (test and val-heldout never share an image); seen pairs: colourings 1, 2, ...
        tags = [0] if heldout_split else range(1, 1 + (colorings if split == "train" else 1))
        parts = [tuple(t[which] for t in coloring(held if heldout_split else seen, tag)) for tag in tags]
        choice, offsets = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        which = which.repeat(len(parts))
        fg, bg = choice[:, 0].contiguous(), choice[:, 1].contiguous()
        out[split] = {
            "images": render_digits(grey[which], fg, bg, offsets, size),
            "digits": labels[which].clone(),
            "fg": fg,
            "bg": bg,
            "index": which.clone(),
        }
    return out


class ColoredDigitsDataModule(pl.LightningDataModule):
    """The embedded default for CLIP: coloured MNIST digits with captions and held-out colour pairs.

    The digit images are split four ways without overlap (:func:`colored_digit_splits`): ``num_test`` test
    images and ``num_val_heldout`` validation images drawn in the held-out colour pairs, ``num_val``
    validation images and the training images in the seen pairs. Model selection therefore never looks at
    a test image, and the test scores are on colour pairs and digit images that training never showed.

    Batches: training gives ``(images, tokens)``. Validation has two loaders: ``(images, tokens)`` of the
    seen-pair validation images (retrieval, identical captions merged) and ``(images, labels)`` of the
    held-out-pair validation images (zero-shot against :attr:`zeroshot_classnames` with
    :attr:`zeroshot_templates`). Test has two loaders over the held-out-pair test images: ``(images,
    tokens)`` (retrieval) and ``(images, labels)`` (zero-shot). :attr:`zeroshot_hard_negative` maps each
    class to its colour-swapped class (binding test). ``predict`` classifies the test images zero-shot.

    The model's input settings are passed in (``recipes.clip`` hands over its model's): the tokenizer, the
    input size and the normalisation (:func:`~diffzoo.data.image_text.inputs.clip_image_settings`).

    Args:
        tokenizer: ``list[str] -> (n, context_length)`` tokens, the model's (``open_clip.get_tokenizer``).
        image_size: model input size; None keeps the 32x32 canvas.
        mean, std: the model's image normalisation.
        batch_size: per-device batch size.
        num_workers: DataLoader workers (0 is fastest for these in-memory tensors).
        seed: seed of the training order.
        split_seed: seed of the split and the colouring (kept fixed across runs being compared).
        num_val: digit images of the seen-pair validation split (retrieval).
        num_test: digit images of the held-out-pair test split (retrieval and zero-shot).
        colorings: colourings of each training digit image (a fixed, larger training set).
        limit: use only ``limit`` digit images (tests).
        num_val_heldout: digit images of the held-out-pair validation split (zero-shot; the model selection
            metric ``val/zs_top1``), taken out of the training images.
        num_colors: colours in use, 3 to 6 (the first of :data:`PALETTE`); fewer colours give fewer
            captions and zero-shot classes (``len(digits) x n(n-1)``) and fewer seen pairs
            (:func:`colored_digit_splits`).
        digits: the digit classes in use (default all ten): only their MNIST images are drawn, so the
            split sizes above must leave training images out of fewer (about 500 per digit).
    """

    def __init__(
        self,
        tokenizer: Callable[[list[str]], Tensor] | None = None,
        image_size: int | None = None,
        mean: Sequence[float] = OPENAI_MEAN,
        std: Sequence[float] = OPENAI_STD,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        split_seed: int = 0,
        num_val: int = 500,
        num_test: int = 1000,
        colorings: int = 1,
        limit: int | None = None,
        num_val_heldout: int = 500,
        num_colors: int = len(PALETTE),
        digits: list[int] | None = None,
    ) -> None:
        check_num_colors(num_colors)
        check_digits(digits)
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer"])  # an object: not in hyper-parameters or checkpoints
        self.tokenizer = tokenizer
        self.zeroshot_classnames, index = digit_classes(num_colors, digits)
        self.zeroshot_templates = list(CAPTION_TEMPLATES)
        self.zeroshot_hard_negative = torch.tensor([index[(d, b, f)] for (d, f, b) in index], dtype=torch.long)
        self.data_name = "coloured MNIST digits"
        self.train_set: ColoredDigits | None = None
        self.val_set: ColoredDigits | None = None  # seen pairs, (images, tokens)
        self.val_heldout_set: ColoredDigits | None = None  # held-out pairs, (images, labels)
        self.test_set: ColoredDigits | None = None  # held-out pairs, (images, labels)
        self.test_pairs_set: ColoredDigits | None = None  # the test images, (images, tokens)
        self.num_bad = 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        require_tokenizer(self.tokenizer, "ColoredDigitsDataModule")
        hp, tokenizer = self.hparams, self.tokenizer
        transform = ToFloatTensor(hp.image_size, hp.mean, hp.std)
        splits = colored_digit_splits(hp.num_val, hp.num_test, hp.colorings, 32, hp.split_seed, hp.limit,
                                      num_val_heldout=hp.num_val_heldout, num_colors=hp.num_colors, digits=hp.digits)
        space = {"num_colors": hp.num_colors, "class_digits": hp.digits, "transform": transform}
        self.train_set = ColoredDigits(**splits["train"], tokenizer=tokenizer, **space)
        self.val_set = ColoredDigits(**splits["val"], tokenizer=tokenizer, **space)
        self.val_heldout_set = ColoredDigits(**splits["val_heldout"], target="label", **space)
        self.test_set = ColoredDigits(**splits["test"], target="label", **space)
        self.test_pairs_set = ColoredDigits(**splits["test"], tokenizer=tokenizer, **space)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        loader = DataLoader(
            self.train_set, batch_size=hp.batch_size, sampler=epoch_sampler(self.train_set, hp.seed),
            num_workers=hp.num_workers, drop_last=True, persistent_workers=hp.num_workers > 0,
        )
        return check_train_loader(loader, f"the training split ({len(self.train_set)} coloured digits)")

    @property
    def has_test_split(self) -> bool:
        """Whether ``test`` scores digit images of its own (``num_test > 0``), apart from training and
        validation; ``recipes.clip`` then scores them after ``fit`` (``recipes._cli.TestAfterFit``)."""
        return self.hparams.num_test > 0

    def _eval_loader(self, dataset: ColoredDigits | None) -> DataLoader:
        hp = self.hparams
        return DataLoader(dataset, batch_size=hp.batch_size, shuffle=False, num_workers=hp.num_workers)

    def val_dataloader(self) -> list[DataLoader]:
        """Seen-pair retrieval on the val images, held-out-pair zero-shot on the val-heldout images."""
        return [self._eval_loader(self.val_set), self._eval_loader(self.val_heldout_set)]

    def test_dataloader(self) -> list[DataLoader]:
        """Held-out-pair retrieval and held-out-pair zero-shot, both on the test images."""
        return [self._eval_loader(self.test_pairs_set), self._eval_loader(self.test_set)]

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)
