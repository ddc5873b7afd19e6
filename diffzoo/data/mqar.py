"""Multi-query associative recall with distractors (in the style of the Zoology MQAR benchmark).

One sequence: ``P`` key-value pairs, then ``F`` filler tokens drawn from the key alphabet, then ``Q``
queries, each a key seen in the pairs followed by its value::

    k1 v1 k2 v2 ... kP vP | f1 f2 ... fF | q1 a1 q2 a2 ... qQ aQ

Keys come from ``[0, key_vocab)``, values from ``[key_vocab, key_vocab + value_vocab)``; the keys of
one sequence are distinct, its values are drawn independently. A model must predict ``a_i`` at the
position of ``q_i``: the filler puts copies of keys (not followed by their value) between the pairs and
the queries, so attending to "the last time this key appeared" is no longer enough. The label of a
query position is the token id of its value; every other position has the label ``-100``. Chance
accuracy is ``1 / value_vocab``.

**Answering by elimination.** With the default distinct queries (each pair queried at most once), a
model that never binds a key to its value can still answer query ``i`` (0-based) with probability
``1 / (P - i)`` by choosing among the pair values no earlier query has taken; with ``Q = P`` the last
query is always right and the mean is ``(1/P + 1/(P-1) + ... + 1) / P`` (52 % for 4 pairs).
:func:`elimination_accuracy` gives these levels and :func:`accuracy_by_query` the measured ones: a model
whose accuracy by query index follows them has learned the shortcut, not the recall. With
``query_replacement=True`` every query draws its key from all ``P`` pairs again (repeats allowed), so
elimination gains nothing and a guess among the pair values scores ``1 / P``.

Knobs: ``num_pairs``, ``filler`` (or ``seq_len``, which sets the filler to ``seq_len - 2P - 2Q``) and
their ratio, the filler share ``F / N``. Training data is generated on the fly from ``seed`` (new
sequences every epoch); validation and test sets are fixed and drawn from seeds of their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["MQARDataModule", "MQARSpec", "accuracy_by_query", "elimination_accuracy", "make_mqar"]

IGNORE = -100
EVAL_SEEDS = (10_001, 10_002)  # the fixed validation and test sets (never a training seed of the study)


class MQARSpec:
    """Shape of an MQAR sequence; see the module docstring. ``seq_len`` (if given) fixes the filler."""

    def __init__(self, num_pairs: int = 4, num_queries: int | None = None, filler: int = 0,
                 seq_len: int | None = None, key_vocab: int = 64, value_vocab: int = 64,
                 query_replacement: bool = False) -> None:
        q = num_pairs if num_queries is None else num_queries
        if num_pairs < 1 or q < 1 or (q > num_pairs and not query_replacement):
            raise ValueError(f"num_pairs={num_pairs} must be >= 1 and num_queries={q} between 1 and num_pairs "
                             "(more queries than pairs need query_replacement=True)")
        if num_pairs > key_vocab:
            raise ValueError(f"num_pairs={num_pairs} distinct keys need key_vocab >= {num_pairs} (got {key_vocab})")
        if value_vocab < 2:
            raise ValueError(f"value_vocab={value_vocab} must be >= 2")
        if seq_len is not None:
            filler = seq_len - 2 * num_pairs - 2 * q
            if filler < 0:
                raise ValueError(f"seq_len={seq_len} is shorter than the {num_pairs} pairs and {q} queries "
                                 f"({2 * num_pairs + 2 * q} tokens); raise seq_len or lower num_pairs")
        if filler < 0:
            raise ValueError(f"filler={filler} must be >= 0")
        self.num_pairs, self.num_queries, self.filler = num_pairs, q, filler
        self.key_vocab, self.value_vocab = key_vocab, value_vocab
        self.query_replacement = query_replacement

    @property
    def seq_len(self) -> int:
        return 2 * self.num_pairs + self.filler + 2 * self.num_queries

    @property
    def vocab_size(self) -> int:
        return self.key_vocab + self.value_vocab

    @property
    def filler_share(self) -> float:
        return self.filler / self.seq_len

    @property
    def chance(self) -> float:
        """Accuracy of guessing a value uniformly."""
        return 1.0 / self.value_vocab


def make_mqar(spec: MQARSpec, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` sequences of ``spec``: ``tokens`` int64 ``(n, N)`` and ``labels`` int64 ``(n, N)``."""
    P, Q, F = spec.num_pairs, spec.num_queries, spec.filler
    keys = torch.rand(n, spec.key_vocab, generator=generator).argsort(1)[:, :P]  # distinct keys per row
    values = spec.key_vocab + torch.randint(spec.value_vocab, (n, P), generator=generator)
    pairs = torch.stack([keys, values], 2).flatten(1)  # (n, 2P): k1 v1 k2 v2 ...
    filler = torch.randint(spec.key_vocab, (n, F), generator=generator)
    if spec.query_replacement:  # each query's pair drawn from all P again: nothing to eliminate
        pick = torch.randint(P, (n, Q), generator=generator)
    else:  # which pairs are queried, in what order (each at most once)
        pick = torch.rand(n, P, generator=generator).argsort(1)[:, :Q]
    q_keys, q_values = keys.gather(1, pick), values.gather(1, pick)
    queries = torch.stack([q_keys, q_values], 2).flatten(1)  # (n, 2Q)
    tokens = torch.cat([pairs, filler, queries], 1)
    labels = torch.full_like(tokens, IGNORE)
    start = 2 * P + F
    labels[:, start:start + 2 * Q:2] = q_values  # at each query key: predict its value
    return tokens, labels


def elimination_accuracy(spec: MQARSpec) -> list[float]:
    """Per query index, the accuracy of answering without recall: a pair value no earlier query has taken,
    chosen uniformly (``1 / (P - i)`` with distinct queries; ``1 / P`` with ``query_replacement``)."""
    P = spec.num_pairs
    if spec.query_replacement:
        return [1.0 / P] * spec.num_queries
    return [1.0 / (P - i) for i in range(spec.num_queries)]


def accuracy_by_query(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(correct, total)``, each ``(Q,)``: exact-value hits and counts of the ``i``-th labelled position of
    every row (the ``i``-th query), from ``(B, N, V)`` logits and ``(B, N)`` labels with the same number of
    labelled positions per row."""
    mask = labels != IGNORE
    q = int(mask[0].sum())
    if not bool((mask.sum(1) == q).all()):
        raise ValueError("every row must have the same number of labelled (query) positions")
    hits = (logits.argmax(-1) == labels)[mask].view(len(labels), q)  # row-major: queries in order
    return hits.sum(0), torch.full((q,), len(labels))


class _Stream(IterableDataset):
    """``steps`` fresh batches per pass; pass ``e`` draws from seed ``(seed, e)``."""

    def __init__(self, spec: MQARSpec, batch_size: int, steps: int, seed: int) -> None:
        self.spec, self.batch_size, self.steps, self.seed = spec, batch_size, steps, seed
        self.epoch = 0

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        self.epoch += 1
        for _ in range(self.steps):
            yield make_mqar(self.spec, self.batch_size, g)


class MQARDataModule(pl.LightningDataModule):
    """MQAR sequences for :class:`diffzoo.tasks.mqar.MQARTask`.

    Args:
        num_pairs, num_queries, filler, seq_len, key_vocab, value_vocab, query_replacement: see
            :class:`MQARSpec` and the module docstring.
        batch_size: sequences per step.
        steps_per_epoch: training batches per epoch (each epoch draws new sequences).
        num_val, num_test: sizes of the fixed validation and test sets.
        seed: seed of the training stream (validation and test use seeds of their own, fixed).
        score_test: score the test set beside the validation set at every validation (False: the test
            set is never looked at during fit; a study's learning-rate grid runs this way).
    """

    def __init__(self, num_pairs: int = 4, num_queries: int | None = None, filler: int = 0,
                 seq_len: int | None = None, key_vocab: int = 64, value_vocab: int = 64, batch_size: int = 64,
                 steps_per_epoch: int = 100, num_val: int = 1000, num_test: int = 1000, seed: int = 0,
                 query_replacement: bool = False, score_test: bool = True) -> None:
        super().__init__()
        self.score_test = score_test
        self.spec = MQARSpec(num_pairs, num_queries, filler, seq_len, key_vocab, value_vocab, query_replacement)
        if batch_size < 1 or steps_per_epoch < 1 or num_val < 1 or num_test < 1:
            raise ValueError("batch_size, steps_per_epoch, num_val and num_test must be >= 1")
        self.batch_size, self.steps_per_epoch, self.seed = batch_size, steps_per_epoch, seed
        self.num_val, self.num_test = num_val, num_test
        self.vocab_size = self.spec.vocab_size
        self.chance = self.spec.chance
        self._eval: dict[str, tuple[Tensor, Tensor]] = {}

    def eval_set(self, split: str) -> tuple[Tensor, Tensor]:
        """The fixed ``"val"`` or ``"test"`` sequences: ``(tokens, labels)``, the same on every call."""
        if split not in ("val", "test"):
            raise ValueError(f"split={split!r}: MQAR has the fixed splits 'val' and 'test'")
        if split not in self._eval:
            n, seed = (self.num_val, EVAL_SEEDS[0]) if split == "val" else (self.num_test, EVAL_SEEDS[1])
            self._eval[split] = make_mqar(self.spec, n, torch.Generator().manual_seed(seed))
        return self._eval[split]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Stream(self.spec, self.batch_size, self.steps_per_epoch, self.seed), batch_size=None)

    def _loader(self, split: str) -> DataLoader:
        tokens, labels = self.eval_set(split)
        return DataLoader(list(zip(tokens.split(self.batch_size * 4), labels.split(self.batch_size * 4))),
                          batch_size=None)

    def val_dataloader(self) -> list[DataLoader]:
        """The validation set (model selection) and, with ``score_test``, the test set (reported)."""
        return [self._loader("val"), self._loader("test")] if self.score_test else [self._loader("val")]

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
