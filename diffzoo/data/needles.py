"""Multi-needle key-information retrieval contexts (the paper's Section 3.4 test; docs/design.md, "Attention noise").

A context is distractor text (real corpus tokens) with ``N`` needles ``" The key of ABC is 123. "``
inserted at chosen depths, followed by a query that repeats one needle's prefix; the model must
produce its value::

    ...distractor... The key of QXV is 417. ...distractor... The key of MRA is 902. ...
    The key of QXV is 417
                      ^^^ answer (scored by exact match of every answer token)

The queried needle sits at ``depth`` (0 = start of the context, 1 = just before the query); the
other ``N - 1`` needles, with distinct names, are placed uniformly at random. Every span is recorded
so the evaluation can measure attention to the answer and to the distractors; :func:`needle_masks`
turns the spans of a batch into the query / answer / noise token masks of the attention scores.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DEPTHS",
    "NeedleSample",
    "Tokenizer",
    "fixed_needle_set",
    "make_needle_sample",
    "needle_cells",
    "needle_masks",
    "needle_sample_from_seed",
    "needle_text",
    "query_text",
    "recall_window",
    "RecallWindow",
]

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # depths of the queried needle in evaluation contexts


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


def needle_text(name: str, value: str) -> str:
    """The needle sentence planted in the context."""
    return f" The key of {name} is {value}. "


def query_text(name: str) -> str:
    """The query that ends the context; the answer (the value) follows it."""
    return f"\nThe key of {name} is "


@dataclass
class NeedleSample:
    """One retrieval context.

    Attributes:
        tokens: int64 ``(length,)``: context, query and answer.
        answer: ``(start, end)`` of the answer tokens at the end of ``tokens`` (what the model must produce).
        value: ``(start, end)`` of the queried needle's value inside the context (the answer span of the
            attention scores).
        needles: ``(start, end)`` of every needle sentence; ``needles[0]`` is the queried one.
        query: ``(start, end)`` of the query text before the answer.
        depth: requested depth of the queried needle; ``num_needles``: needles in the context.
    """

    tokens: Tensor
    answer: tuple[int, int]
    value: tuple[int, int]
    needles: list[tuple[int, int]] = field(default_factory=list)
    query: tuple[int, int] = (0, 0)
    depth: float = 0.0
    num_needles: int = 1

    def noise_mask(self) -> Tensor:
        """bool ``(length,)``: True at distractor tokens (context outside every needle, before the query)."""
        mask = torch.zeros(len(self.tokens), dtype=torch.bool)
        mask[: self.query[0]] = True
        for s, e in self.needles:
            mask[s:e] = False
        return mask


def needle_masks(samples: Sequence[NeedleSample]) -> tuple[Tensor, Tensor, Tensor]:
    """``(query, answer, noise)`` bool ``(B, N)`` token masks of contexts of one length ``N``.

    ``query``: the positions that predict the answer tokens (each answer token's predecessor);
    ``answer``: the queried needle's value inside the context; ``noise``: the distractor text
    (:meth:`NeedleSample.noise_mask`).
    """
    samples = list(samples)
    if not samples:
        raise ValueError("needle_masks needs at least one NeedleSample")
    lengths = sorted({len(s.tokens) for s in samples})
    if len(lengths) > 1:
        raise ValueError(f"the samples have different lengths {lengths}; pass contexts of one length per batch")
    B, N = len(samples), lengths[0]
    query = torch.zeros(B, N, dtype=torch.bool)
    answer = torch.zeros(B, N, dtype=torch.bool)
    noise = torch.stack([s.noise_mask() for s in samples])
    for i, s in enumerate(samples):
        query[i, s.answer[0] - 1 : s.answer[1] - 1] = True  # positions whose next token is an answer token
        answer[i, s.value[0] : s.value[1]] = True
    return query, answer, noise


def _random_names(rng: np.random.Generator, n: int, letters: int = 3) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(list(string.ascii_uppercase), letters))
        if name not in names:
            names.append(name)
    return names


@dataclass
class RecallWindow:
    """A window dense with retrieval (:func:`recall_window`).

    Attributes:
        tokens: int64 ``(length,)``.
        answers: ``(start, end)`` of every asked value in the queries at the end of ``tokens``.
        queries: ``(start, end)`` of the text that asks for each answer (``"\\nABC="``).
        needles: ``(start, end)`` of every needle in the window.
        asked: for each answer, the index in ``needles`` of the needle it is asked from.
    """

    tokens: np.ndarray
    answers: list[tuple[int, int]]
    queries: list[tuple[int, int]] = field(default_factory=list)
    needles: list[tuple[int, int]] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)

    def samples(self) -> list[NeedleSample]:
        """One :class:`NeedleSample` per answer, each holding the whole window: a causal model's prediction of an
        answer does not see the queries after it, so scoring the samples one by one
        (:func:`diffzoo.evaluation.retrieval.retrieval_hits`) scores every answer of the window."""
        tokens = torch.from_numpy(np.asarray(self.tokens, dtype=np.int64))
        out = []
        for (a0, a1), query, i in zip(self.answers, self.queries, self.asked):
            s, e = self.needles[i]
            value = (e - 2 - (a1 - a0), e - 2)  # the needle ends with "<value>. "
            others = [span for j, span in enumerate(self.needles) if j != i]
            out.append(NeedleSample(tokens=tokens, answer=(a0, a1), value=value, needles=[(s, e), *others],
                                    query=query, num_needles=len(self.needles)))
        return out


def recall_window(
    distractor: np.ndarray,
    length: int,
    rng: np.random.Generator,
    needles: int = 4,
    queries: int = 4,
    letters: int = 3,
    digits: int = 3,
) -> RecallWindow:
    """A byte window of ``length`` tokens: distractor text with ``needles`` compact needles ``" ABC=123. "`` at
    random places, ending with ``queries`` questions (``"\\nABC=123"``), so one window holds ``queries`` answers
    instead of the single one of :func:`make_needle_sample`. Byte tokens only (the needles are written as UTF-8
    bytes).

    Each question asks a needle drawn uniformly from all of them, independently of the others (a needle may be
    asked twice). Were the needles asked without repeats, the last question's needle would be the one not yet
    asked: a model could answer it by elimination, without matching its key. Here a model that copies the value
    of a random needle instead of the one whose key is asked scores ``1 / needles`` on every question.

    Raises ValueError when the needles and queries do not fit ``length`` or the distractor text is too short.
    """
    if not 1 <= queries <= needles:
        raise ValueError(f"queries={queries} must be between 1 and needles={needles}")
    names = _random_names(rng, needles, letters)
    values = ["".join(rng.choice(list(string.digits), digits)) for _ in names]
    planted = [f" {n}={v}. ".encode() for n, v in zip(names, values)]
    asked = [int(i) for i in rng.integers(0, needles, queries)]  # with repeats: nothing to eliminate
    tail = b"".join(f"\n{names[i]}={values[i]}".encode() for i in asked)
    filler = length - len(tail) - sum(len(p) for p in planted)
    if filler < 0:
        raise ValueError(f"{needles} needles and {queries} queries take {length - filler} tokens, more than {length}")
    if len(distractor) <= filler:
        raise ValueError(f"the distractor text has {len(distractor)} tokens; more than {filler} are needed")
    start = int(rng.integers(0, len(distractor) - filler))
    fill = np.asarray(distractor[start : start + filler], dtype=np.int64)
    pieces: list[np.ndarray] = []
    spans: list[tuple[int, int]] = []
    cursor = 0
    for point, needle in zip(sorted(int(p) for p in rng.integers(0, filler + 1, needles)), planted):
        pieces += [fill[cursor:point], np.frombuffer(needle, dtype=np.uint8).astype(np.int64)]
        at = point + sum(len(p) for p in planted[: len(spans)])  # the needles before this one shift it
        spans.append((at, at + len(needle)))
        cursor = point
    pieces += [fill[cursor:], np.frombuffer(tail, dtype=np.uint8).astype(np.int64)]
    answers, query_spans, pos = [], [], length - len(tail)
    for i in asked:
        query = len(f"\n{names[i]}=")
        query_spans.append((pos, pos + query))
        answers.append((pos + query, pos + query + digits))
        pos += query + digits
    return RecallWindow(tokens=np.concatenate(pieces), answers=answers, queries=query_spans, needles=spans,
                        asked=asked)


def make_needle_sample(
    distractor: np.ndarray,
    tokenizer: Tokenizer,
    length: int,
    num_needles: int,
    depth: float,
    rng: np.random.Generator,
    value_digits: int = 3,
) -> NeedleSample:
    """Build one context of exactly ``length`` tokens.

    Args:
        distractor: 1-d token array the filler text is cut from (at a random offset).
        tokenizer: has ``encode(str) -> list[int]`` (the byte tokenizer or any other).
        length: total tokens including query and answer.
        num_needles: needles in the context (>= 1); the first is the queried one.
        depth: position of the queried needle in the filler, 0..1.
        rng: numpy generator (all randomness comes from it).
        value_digits: digits of each needle's value.
    """
    if num_needles < 1:
        raise ValueError(f"num_needles={num_needles} must be >= 1")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} must be in [0, 1]")
    names = _random_names(rng, num_needles)
    values = ["".join(rng.choice(list(string.digits), value_digits)) for _ in names]
    needles = [tokenizer.encode(needle_text(n, v)) for n, v in zip(names, values)]
    query = tokenizer.encode(query_text(names[0]))
    answer = tokenizer.encode(values[0])
    filler_len = length - len(query) - len(answer) - sum(len(t) for t in needles)
    if filler_len < 0:
        raise ValueError(
            f"length={length} is too short for {num_needles} needle(s): needles, query and answer alone take "
            f"{length - filler_len} tokens"
        )
    if len(distractor) < filler_len:
        raise ValueError(f"the distractor text has {len(distractor)} tokens; {filler_len} are needed")
    start = int(rng.integers(0, len(distractor) - filler_len + 1))
    filler = np.asarray(distractor[start : start + filler_len], dtype=np.int64)
    # Insertion points into the filler: the queried needle at its depth, the others uniformly.
    points = [int(round(depth * filler_len))] + [int(p) for p in rng.integers(0, filler_len + 1, num_needles - 1)]
    order = sorted(range(num_needles), key=lambda i: (points[i], i))
    pieces: list[np.ndarray] = []
    spans: dict[int, tuple[int, int]] = {}
    cursor, pos = 0, 0
    for i in order:
        pieces.append(filler[cursor : points[i]])
        pos += points[i] - cursor
        cursor = points[i]
        pieces.append(np.asarray(needles[i], dtype=np.int64))
        spans[i] = (pos, pos + len(needles[i]))
        pos += len(needles[i])
    pieces.append(filler[cursor:])
    pieces += [np.asarray(query, dtype=np.int64), np.asarray(answer, dtype=np.int64)]
    tokens = torch.from_numpy(np.concatenate(pieces))
    assert len(tokens) == length
    # The queried needle's value: where its encoding ends with "<value>. "
    s, e = spans[0]
    suffix = len(tokenizer.encode(f"{values[0]}. "))
    value_start = e - suffix
    answer_start = length - len(answer)
    return NeedleSample(
        tokens=tokens, answer=(answer_start, length), value=(value_start, value_start + len(answer)),
        needles=[spans[i] for i in range(num_needles)], query=(answer_start - len(query), answer_start),
        depth=depth, num_needles=num_needles,
    )


def needle_sample_from_seed(
    distractor: np.ndarray,
    tokenizer: Tokenizer,
    length: int,
    seed: int,
    needle_counts: Sequence[int] = (1, 2, 4),
    depth: float | None = None,
) -> NeedleSample:
    """A training-mix sample: needle count and depth drawn from ``seed`` (depth uniform unless given)."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice(list(needle_counts)))
    d = float(rng.uniform()) if depth is None else depth
    return make_needle_sample(distractor, tokenizer, length, n, d, rng)


def needle_cells(
    distractor: np.ndarray,
    tokenizer: Tokenizer,
    length: int,
    needle_counts: Sequence[int],
    depths: Sequence[float],
    samples: int,
    seed: int = 0,
) -> list[tuple[int, float, list[NeedleSample]]]:
    """``samples`` contexts of ``length`` tokens for every (needle count, depth) cell, as
    ``(count, depth, contexts)``, counts outer and depths inner.

    Each cell's contexts come from a generator seeded by ``(seed, length, count, depth)`` only, so they do not
    depend on the other cells, and the first ``k`` contexts of a cell are the same for any ``samples >= k``.
    Cells whose needles do not fit ``length`` are left out.
    """
    cells = []
    for count in needle_counts:
        for depth in depths:
            rng = np.random.default_rng([seed, length, count, int(round(depth * 1000))])
            try:
                cell = [make_needle_sample(distractor, tokenizer, length, count, depth, rng) for _ in range(samples)]
            except ValueError:
                continue  # the needles alone exceed this length
            cells.append((count, depth, cell))
    return cells


def fixed_needle_set(
    distractor: np.ndarray,
    tokenizer: Tokenizer,
    length: int,
    total: int,
    needle_counts: Sequence[int] = (1, 2, 4),
    depths: Sequence[float] = DEPTHS,
    seed: int = 0,
) -> list[NeedleSample]:
    """``total`` contexts of ``length`` tokens balanced over (needle count, depth): the cells of
    :func:`needle_cells` taken in turn (context ``i`` is of cell ``i % cells``), so counts and depths differ by
    at most one context whatever ``total`` is. The same arguments give the same contexts.

    Raises ValueError when the largest needle count does not fit ``length`` or the distractor text is too short.
    """
    if total < 1:
        raise ValueError(f"total={total} must be positive")
    per_cell = -(-total // (len(needle_counts) * len(depths)))
    cells = needle_cells(distractor, tokenizer, length, needle_counts, depths, per_cell, seed)
    if len(cells) < len(needle_counts) * len(depths):
        make_needle_sample(distractor, tokenizer, length, max(needle_counts), 0.5, np.random.default_rng(0))  # raises
        raise ValueError(f"contexts of {length} tokens could not be built for needle counts {list(needle_counts)}")
    return [cells[i % len(cells)][2][i // len(cells)] for i in range(total)]
