"""Text corpora for language modelling: tokenise once into a memory-mapped token file, then random windows.

The embedded default is real English that ships with Python: the help topics of the standard library's
``pydoc_data/topics.py`` (~750 KB, the text ``help("FOR")`` prints). The byte-level tokenizer needs no
download; a ``tokenizer.json`` of the ``tokenizers`` package may be given instead.

Training windows start at random offsets drawn from ``(seed, epoch)`` only, so a run resumed from an
epoch checkpoint sees exactly the windows the uninterrupted run would have seen. A fraction of the
training windows can be replaced by key-information retrieval contexts (:mod:`.needles`), and fixed sets of
such contexts cut from the held-out text can be scored at every validation and at test (``needle_eval``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .modules import _rank_world, check_train_loader, epoch_sampler
from .needles import (
    DEPTHS,
    NeedleSample,
    RecallWindow,
    fixed_needle_set,
    make_needle_sample,
    needle_sample_from_seed,
    recall_window,
)

PathLike = str | os.PathLike

__all__ = [
    "ByteTokenizer",
    "FileTokenizer",
    "RandomWindowSampler",
    "TextDataModule",
    "TokenWindows",
    "get_tokenizer",
    "load_tokens",
    "pydoc_topics_text",
    "tokenize_corpus",
]


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, no download, lossless. Token 0 (NUL) doubles as padding."""

    name = "byte"
    vocab_size = 256
    pad_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class FileTokenizer:
    """A ``tokenizer.json`` (Hugging Face ``tokenizers``) read from a local file."""

    pad_id = 0

    def __init__(self, path: PathLike) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover
            raise ImportError("a tokenizer.json needs the tokenizers package: pip install tokenizers") from e
        self.path = Path(path)
        self._tok = Tokenizer.from_file(str(self.path))
        self.name = f"{self.path.name}-{_sha1(self.path.read_bytes())[:8]}"
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])


def get_tokenizer(name: str = "byte") -> ByteTokenizer | FileTokenizer:
    """``"byte"`` or the path of a ``tokenizer.json``."""
    if name == "byte":
        return ByteTokenizer()
    if os.path.isfile(name):
        return FileTokenizer(name)
    raise ValueError(f"tokenizer={name!r}: expected 'byte' or the path of an existing tokenizer.json")


def pydoc_topics_text() -> str:
    """The embedded corpus: every help topic of ``pydoc_data.topics``, sorted by name, blank-line separated."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics)) + "\n"


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


# Characters that do not occur in text: C0 controls other than tab, newlines, form feed and escape.
_NON_TEXT = frozenset(chr(c) for c in range(32) if chr(c) not in "\t\n\r\x0b\x0c\x1b")
MAX_NON_TEXT_FRACTION = 0.1


def _check_text(path: Path, data: bytes, text: str) -> None:
    """Refuse a corpus file that is mostly not UTF-8 text (a binary file would train on U+FFFD tokens)."""
    undecodable = text.count("\ufffd") - data.count("\ufffd".encode())  # replacements made by decoding
    control = sum(text.count(c) for c in _NON_TEXT)
    fraction = (undecodable + control) / max(1, len(text))
    if fraction > MAX_NON_TEXT_FRACTION:
        raise ValueError(
            f"corpus file {path} does not look like UTF-8 text: {fraction:.0%} of its {len(text)} characters are "
            f"undecodable bytes or control characters (at most {MAX_NON_TEXT_FRACTION:.0%} allowed); pass text files"
        )


def _read_corpus(corpus: PathLike | Sequence[PathLike] | None) -> tuple[str, str]:
    """``(text, label)`` of the corpus: the embedded topics, text files, or every ``*.txt`` of a folder."""
    if corpus is None:
        return pydoc_topics_text(), "pydoc_topics"
    paths = [corpus] if isinstance(corpus, (str, os.PathLike)) else list(corpus)
    if not paths:
        raise ValueError("corpus is an empty list; pass text files, a folder of *.txt, or None for the default")
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.rglob("*.txt"))
            if not found:
                raise FileNotFoundError(f"corpus folder {p} holds no *.txt files")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"corpus file {p} does not exist")
    texts = []
    for f in files:
        data = f.read_bytes()
        text = data.decode("utf-8", errors="replace")
        if not text.strip():
            raise ValueError(f"corpus file {f} is empty")
        _check_text(f, data, text)
        texts.append(text)
    return "\n\n".join(texts), files[0].stem if len(files) == 1 else f"{files[0].stem}+{len(files) - 1}"


def tokenize_corpus(
    corpus: PathLike | Sequence[PathLike] | None = None,
    tokenizer: str = "byte",
    cache_dir: PathLike = "outputs/cache/text",
) -> Path:
    """Tokenise the corpus once into ``<cache_dir>/<label>-<tokenizer>-<hash>.bin`` (raw tokens) and return it.

    The file name carries a hash of the text and the tokenizer, so a changed corpus is tokenised again
    and an unchanged one is reused. A ``.json`` file beside it records ``dtype`` and ``num_tokens``.
    """
    tok = get_tokenizer(tokenizer)
    text, label = _read_corpus(corpus)
    digest = _sha1(text.encode("utf-8") + tok.name.encode())[:12]
    path = Path(cache_dir) / f"{label}-{tok.name}-{digest}.bin"
    meta_path = path.with_suffix(".json")
    if path.is_file() and meta_path.is_file():
        return path
    ids = tok.encode(text)
    if not ids:
        raise ValueError(f"the corpus {label!r} produced no tokens")
    dtype = np.uint8 if tok.vocab_size <= 2**8 else np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    np.asarray(ids, dtype=dtype).tofile(tmp)
    os.replace(tmp, path)  # atomic: concurrent processes never read a half-written file
    meta = {"dtype": np.dtype(dtype).name, "num_tokens": len(ids), "tokenizer": tok.name, "source": label}
    meta_path.write_text(json.dumps(meta, indent=1))
    return path


def load_tokens(path: PathLike) -> np.memmap:
    """Memory-map a token file written by :func:`tokenize_corpus` (read-only)."""
    path = Path(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["num_tokens"],))


IGNORE_INDEX = -100  # a target the cross-entropy skips (torch's default ignore_index)
NEEDLE_STYLES = ("sentence", "recall")


def check_needle_style(style: str, queries: int, key_letters: int = 3) -> None:
    """Raise ValueError naming the problem for an unknown ``needle_style``, ``needle_queries < 1`` or
    ``needle_key_letters`` outside 1-8."""
    if style not in NEEDLE_STYLES:
        raise ValueError(f"data.needle_style={style!r}: choose one of {', '.join(NEEDLE_STYLES)}")
    if queries < 1:
        raise ValueError(f"data.needle_queries={queries} must be a positive integer")
    if not 1 <= key_letters <= 8:
        raise ValueError(f"data.needle_key_letters={key_letters} must be between 1 and 8")


class TokenWindows(Dataset):
    """Windows of ``seq_len + 1`` tokens from ``tokens[start:end]`` of a token file, as ``(x, y)`` pairs.

    An index is either a window number (when ``offsets`` is given: fixed validation windows) or a key
    ``(offset, needle_seed)`` from :class:`RandomWindowSampler`; ``needle_seed >= 0`` returns a retrieval
    context drawn from that seed instead of plain text: a needle sentence and its query
    (``needle_style="sentence"``, :func:`~diffzoo.data.needles.make_needle_sample`) or compact needles with up to
    ``needle_queries`` of them asked (``"recall"``, :func:`~diffzoo.data.needles.recall_window`, keys of
    ``needle_key_letters`` capitals), the needle count drawn from ``needle_counts``. With ``answer_loss`` a
    retrieval context's targets are its answers only (``IGNORE_INDEX`` elsewhere); plain text keeps every target.
    The memory map is opened lazily in each worker.
    """

    def __init__(
        self,
        path: PathLike,
        seq_len: int,
        start: int = 0,
        end: int | None = None,
        offsets: Sequence[int] | None = None,
        tokenizer: str = "byte",
        needle_counts: Sequence[int] = (1, 2, 4),
        needle_style: str = "sentence",
        needle_queries: int = 4,
        answer_loss: bool = False,
        needle_key_letters: int = 3,
    ) -> None:
        check_needle_style(needle_style, needle_queries, needle_key_letters)
        self.path, self.seq_len, self.tokenizer_name = str(path), seq_len, tokenizer
        self.needle_style, self.needle_queries, self.answer_loss = needle_style, needle_queries, answer_loss
        self.needle_key_letters = needle_key_letters
        n = len(load_tokens(path))
        self.start, self.end = start, n if end is None else end
        if self.end - self.start < seq_len + 1:
            raise ValueError(
                f"{self.end - self.start} tokens cannot fill one window of seq_len + 1 = {seq_len + 1}; "
                "use a longer corpus or a shorter seq_len"
            )
        self.offsets = list(offsets) if offsets is not None else None
        self.needle_counts = tuple(needle_counts)
        self._tokens: np.memmap | None = None
        self._tok = None

    @property
    def num_offsets(self) -> int:
        """Number of distinct window start positions."""
        return self.end - self.start - self.seq_len

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = load_tokens(self.path)
        return self._tokens[self.start : self.end]

    def __len__(self) -> int:
        return len(self.offsets) if self.offsets is not None else self.num_offsets

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[Tensor, Tensor]:
        if isinstance(key, tuple):
            offset, needle_seed = key
        else:
            offset, needle_seed = (self.offsets[key] if self.offsets is not None else key), -1
        if needle_seed < 0:
            window = torch.from_numpy(self.tokens[offset : offset + self.seq_len + 1].astype(np.int64))
            return window[:-1], window[1:]
        if self.needle_style == "recall":
            rng = np.random.default_rng(needle_seed)
            n = int(rng.choice(list(self.needle_counts)))
            recall = self.recall(self.tokens, rng, n)
            window, answers = torch.from_numpy(recall.tokens), recall.answers
        else:
            if self._tok is None:
                self._tok = get_tokenizer(self.tokenizer_name)
            sample = needle_sample_from_seed(self.tokens, self._tok, self.seq_len + 1, needle_seed, self.needle_counts)
            window, answers = sample.tokens, [sample.answer]
        x, y = window[:-1], window[1:]
        if self.answer_loss:  # only the answers are targets (the cross-entropy's ignore_index elsewhere)
            y = torch.full_like(y, IGNORE_INDEX)
            for s, e in answers:
                y[s - 1 : e - 1] = window[s:e]
        return x, y

    def recall(self, tokens: np.ndarray, rng: np.random.Generator, needles: int) -> RecallWindow:
        """A ``"recall"`` window of ``seq_len + 1`` tokens with ``needles`` needles cut from ``tokens``, asked
        ``min(needles, needle_queries)`` questions, keys of ``needle_key_letters`` capitals."""
        return recall_window(tokens, self.seq_len + 1, rng, needles=needles, queries=min(needles, self.needle_queries),
                             letters=self.needle_key_letters)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_tokens"] = None  # reopened in the worker
        return state


class RandomWindowSampler(DistributedSampler):
    """``num_windows`` random ``(offset, needle_seed)`` keys per epoch, from ``(seed, epoch)`` only.

    A :class:`~torch.utils.data.DistributedSampler`, so Lightning keeps it under DDP (each rank takes
    every ``world``-th key) and calls :meth:`set_epoch`.

    Args:
        dataset: the :class:`TokenWindows` of the training split.
        num_windows: windows per epoch over all ranks.
        seed: seed of the order.
        needle_fraction: probability that a window is a retrieval context instead of plain text.
    """

    def __init__(self, dataset: TokenWindows, num_windows: int, seed: int = 0, needle_fraction: float = 0.0) -> None:
        rank, world = _rank_world()
        super().__init__(dataset, num_replicas=world, rank=rank, shuffle=False, seed=seed)
        if num_windows < 1:
            raise ValueError(f"num_windows={num_windows} must be positive")
        if not 0.0 <= needle_fraction <= 1.0:
            raise ValueError(f"needle_fraction={needle_fraction} must be in [0, 1]")
        self.num_windows, self.needle_fraction = num_windows, needle_fraction
        self.num_samples = math.ceil(num_windows / world)
        self.total_size = self.num_samples * world

    def keys(self, epoch: int) -> list[tuple[int, int]]:
        """Every rank's keys of ``epoch``, in order."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        offsets = torch.randint(0, self.dataset.num_offsets, (self.total_size,), generator=g).tolist()
        needle = (torch.rand(self.total_size, generator=g) < self.needle_fraction).tolist()
        seeds = torch.randint(0, 2**31 - 1, (self.total_size,), generator=g).tolist()
        return [(o, s if n else -1) for o, n, s in zip(offsets, needle, seeds)]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.keys(self.epoch)[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class TextDataModule(pl.LightningDataModule):
    """Language-model windows from a text corpus (default: the embedded ``pydoc_data`` topics).

    Args:
        corpus: text file(s) or a folder of ``*.txt``; None for the embedded default.
        tokenizer: ``"byte"`` or the path of a ``tokenizer.json``.
        cache_dir: where the token file is written once.
        seq_len: tokens per training window (the model sees ``seq_len`` inputs and targets).
        batch_size: windows per batch and device.
        train_windows: windows per epoch (all devices together); an epoch ends with validation and a checkpoint.
        val_windows: fixed, non-overlapping validation windows (at most what the split holds).
        val_fraction: the last fraction of the corpus held out for validation (and test).
        test_windows: fixed test windows from the held-out part, after the validation windows (0: no test
            split; the validation windows are the same either way).
        needle_fraction: share of training windows replaced by retrieval contexts (0 = plain LM).
        needle_counts: needle counts drawn for those contexts (and of the ``needle_eval`` contexts).
        seed: seed of the window order.
        num_workers: DataLoader workers.
        needle_eval: retrieval contexts of ``seq_len + 1`` tokens in each of a fixed validation and a fixed test
            set (0 = none), scored by the task as ``val/needle_acc`` at every validation and ``test/needle_acc``
            at test (:meth:`needle_contexts`). Their distractor text is the held-out part of the corpus only:
            its first half for validation, its second half for test. Counts (``needle_counts``) and depths
            (0, 0.25, 0.5, 0.75, 1) are balanced.
        needle_eval_seed: seed of those contexts (the validation set's; the test set's is ``needle_eval_seed + 1``),
            independent of ``seed``, so that every run sees the same contexts.
        needle_style: ``"sentence"`` (one needle sentence ``" The key of ABC is 123. "`` per count, one query)
            or ``"recall"`` (compact needles ``" ABC=123. "``, and ``needle_queries`` of them asked at the end of
            the window: several answers per window). Applies to the training and the ``needle_eval`` contexts;
            a ``"recall"`` evaluation set of ``needle_eval`` windows scores every answer in them.
        needle_queries: queries per ``"recall"`` window (at most its needle count).
        needle_key_letters: capitals in a ``"recall"`` needle's key (``" ABC=123. "`` has 3). One letter makes
            the task associative recall of single tokens in text; longer keys must be matched byte by byte.
        answer_loss: train on the answers of the retrieval contexts only (plain-text windows keep every target).
    """

    def __init__(
        self,
        corpus: str | list[str] | None = None,
        tokenizer: str = "byte",
        cache_dir: str = "outputs/cache/text",
        seq_len: int = 256,
        batch_size: int = 16,
        train_windows: int = 3200,
        val_windows: int = 64,
        val_fraction: float = 0.1,
        needle_fraction: float = 0.0,
        needle_counts: tuple[int, ...] = (1, 2, 4),
        seed: int = 0,
        num_workers: int = 0,
        test_windows: int = 0,
        needle_eval: int = 0,
        needle_eval_seed: int = 0,
        needle_style: str = "sentence",
        needle_queries: int = 4,
        answer_loss: bool = False,
        needle_key_letters: int = 3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_needle_style(needle_style, needle_queries, needle_key_letters)
        if test_windows < 0:
            raise ValueError(f"data.test_windows={test_windows} must be 0 (no test split) or positive")
        if needle_eval < 0:
            raise ValueError(f"data.needle_eval={needle_eval} must be 0 (no retrieval contexts) or positive")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be between 0 and 1")
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("train_windows", train_windows),
                            ("val_windows", val_windows)):
            if value < 1:
                raise ValueError(f"data.{name}={value} must be a positive integer")
        self.tokenizer = get_tokenizer(tokenizer)
        self.vocab_size = self.tokenizer.vocab_size  # linked to the model by the recipe
        self.token_path: Path | None = None
        self.train_set: TokenWindows | None = None
        self.val_set: TokenWindows | None = None
        self.test_set: TokenWindows | None = None
        self.needle_val: list[NeedleSample] = []
        self.needle_test: list[NeedleSample] = []

    @property
    def has_test_split(self) -> bool:
        """Whether ``test`` reads windows of its own (``test_windows > 0``) rather than the validation ones."""
        return self.hparams.test_windows > 0

    def prepare_data(self) -> None:
        tokenize_corpus(self.hparams.corpus, self.hparams.tokenizer, self.hparams.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        self.token_path = tokenize_corpus(hp.corpus, hp.tokenizer, hp.cache_dir)  # reused when already written
        n = len(load_tokens(self.token_path))
        split = int(n * (1 - hp.val_fraction))
        L = hp.seq_len
        held_out = list(range(0, n - split - L, L))
        offsets = held_out[: hp.val_windows]
        if not offsets:
            raise ValueError(f"the validation split ({n - split} tokens) cannot fill a window of {L + 1} tokens")
        common = dict(seq_len=L, tokenizer=hp.tokenizer, needle_counts=hp.needle_counts,
                      needle_style=hp.needle_style, needle_queries=hp.needle_queries, answer_loss=hp.answer_loss,
                      needle_key_letters=hp.needle_key_letters)
        self.train_set = TokenWindows(self.token_path, start=0, end=split, **common)
        self.val_set = TokenWindows(self.token_path, start=split, end=n, offsets=offsets, **common)
        if hp.test_windows:
            test = held_out[len(offsets) : len(offsets) + hp.test_windows]
            if len(test) < hp.test_windows:
                raise ValueError(
                    f"data.test_windows={hp.test_windows}: the held-out {n - split} tokens give {len(held_out)} "
                    f"windows of {L} tokens, {len(offsets)} of them for validation, so at most "
                    f"{len(held_out) - len(offsets)} for test; lower test_windows or val_windows, or raise val_fraction"
                )
            self.test_set = TokenWindows(self.token_path, start=split, end=n, offsets=test, **common)
        if hp.needle_fraction > 0:  # fail now, not in the middle of an epoch
            most = max(hp.needle_counts)
            try:
                if hp.needle_style == "recall":
                    self.train_set.recall(self.train_set.tokens, np.random.default_rng(0), most)
                else:
                    make_needle_sample(self.train_set.tokens, self.tokenizer, L + 1, most, 0.5,
                                       np.random.default_rng(0))
            except ValueError as e:
                raise ValueError(f"seq_len={L} is too short for needle_counts up to {most}: {e}") from None
        if hp.needle_eval:
            held = load_tokens(self.token_path)[split:n]
            half = len(held) // 2
            try:
                self.needle_val = self._eval_contexts(self.train_set, held[:half], hp.needle_eval_seed)
                self.needle_test = self._eval_contexts(self.train_set, held[half:], hp.needle_eval_seed + 1)
            except ValueError as e:
                raise ValueError(f"data.needle_eval={hp.needle_eval}: contexts of seq_len + 1 = {L + 1} tokens with "
                                 f"needle_counts up to {max(hp.needle_counts)} from each half of the held-out "
                                 f"{n - split} tokens: {e}") from None

    def _eval_contexts(self, windows: TokenWindows, held: np.ndarray, seed: int) -> list[NeedleSample]:
        """``needle_eval`` fixed contexts of ``seq_len + 1`` tokens cut from ``held`` (recall windows built with the
        settings of ``windows``); a ``"recall"`` window gives one sample per answer, a needle count from
        ``needle_counts`` in turn."""
        hp = self.hparams
        if hp.needle_style == "sentence":
            return fixed_needle_set(held, self.tokenizer, hp.seq_len + 1, hp.needle_eval, hp.needle_counts, DEPTHS,
                                    seed=seed)
        rng = np.random.default_rng(seed)
        counts = [hp.needle_counts[i % len(hp.needle_counts)] for i in range(hp.needle_eval)]
        recalls = [windows.recall(held, rng, c) for c in counts]
        return [sample for w in recalls for sample in w.samples()]

    def needle_contexts(self, stage: str) -> list[NeedleSample]:
        """The fixed retrieval contexts of ``stage`` (``"val"`` or ``"test"``); empty with ``needle_eval=0``
        or before :meth:`setup`."""
        if stage not in ("val", "test"):
            raise ValueError(f"stage={stage!r}: expected 'val' or 'test'")
        return self.needle_val if stage == "val" else self.needle_test

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        sampler = RandomWindowSampler(self.train_set, hp.train_windows, hp.seed, hp.needle_fraction)
        loader = DataLoader(
            self.train_set, batch_size=hp.batch_size, sampler=sampler, num_workers=hp.num_workers, drop_last=True,
            persistent_workers=hp.num_workers > 0,
        )
        return check_train_loader(loader, f"data.train_windows={hp.train_windows}")

    def val_dataloader(self) -> DataLoader:
        hp = self.hparams
        return DataLoader(
            self.val_set, batch_size=hp.batch_size, sampler=epoch_sampler(self.val_set, hp.seed, shuffle=False),
            num_workers=hp.num_workers,
        )

    def test_dataloader(self) -> DataLoader:
        """The test windows; the validation windows when there is no test split (``test_windows=0``)."""
        if self.test_set is None:
            return self.val_dataloader()
        hp = self.hparams
        return DataLoader(
            self.test_set, batch_size=hp.batch_size, sampler=epoch_sampler(self.test_set, hp.seed, shuffle=False),
            num_workers=hp.num_workers,
        )

    predict_dataloader = test_dataloader
