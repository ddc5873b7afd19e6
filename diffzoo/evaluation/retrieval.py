"""Key-information retrieval evaluation and the paper's attention-noise scores (docs/design.md, "Attention noise").

For query tokens ``G``, answer tokens ``A`` and noise tokens ``Nz`` (paper, Table 3)::

    score_ans   = mean_{i in G} sum_{j in A}  a_ij / sum_j a_ij
    score_noise = mean_{i in G} sum_{j in Nz} a_ij / sum_j a_ij

with ``a = a1 - lam * a2`` for differential maps (row sum ``1 - lam``) and the softmax map otherwise,
averaged over heads and layers. Here ``G`` are the positions that predict the answer tokens, ``A`` the
queried needle's value in the context and ``Nz`` the distractor text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..analysis.maps import answer_share, effective_map, record_attention
from .metrics import finite_rows

if TYPE_CHECKING:  # pragma: no cover
    from ..data.needles import NeedleSample, Tokenizer

__all__ = ["answer_hits", "attention_scores", "evaluate_retrieval", "retrieval_hits"]


def attention_scores(
    maps: Sequence[dict[str, Tensor]], query: Tensor, answer: Tensor, noise: Tensor
) -> tuple[Tensor, Tensor]:
    """Attention to answer and to noise per sample, averaged over query tokens, heads and layers.

    Args:
        maps: one dict per layer, e.g. ``record.maps()`` of :func:`diffzoo.analysis.record_attention`.
        query: bool ``(B, Nq)``, the query tokens ``G``.
        answer: bool ``(B, Nk)``, the answer tokens ``A``.
        noise: bool ``(B, Nk)``, the noise tokens ``Nz``.

    Returns:
        ``(score_answer, score_noise)``, each fp32 ``(B,)``: :func:`diffzoo.analysis.answer_share` of
        each layer's :func:`~diffzoo.analysis.effective_map`, mean over heads, then over layers.
    """
    if not maps:
        raise ValueError("no attention maps given")
    if bool((query.sum(-1) == 0).any()):
        raise ValueError("every sample needs at least one query token")
    ans, nz = [], []
    for m in maps:
        a = effective_map(m).float()  # (B, H, Nq, Nk)
        ans.append(answer_share(a, query, answer).mean(-1))  # (B,)
        nz.append(answer_share(a, query, noise).mean(-1))
    return torch.stack(ans).mean(0), torch.stack(nz).mean(0)


def answer_hits(logits: Tensor, tokens: Tensor, answers: Sequence[tuple[int, int]]) -> Tensor:
    """bool ``(B,)``: True where the argmax at every answer position is the right token (greedy decoding of
    the answer) and those logits are finite.

    Args:
        logits: ``(B, M, V)`` of the model fed ``tokens[:, :M]`` (``M >= end - 1`` of every answer: the last
            answer token itself need not be fed).
        tokens: ``(B, N)`` contexts with their answers.
        answers: ``(start, end)`` of each context's answer tokens (:attr:`NeedleSample.answer`).
    """
    if len(answers) != len(tokens):
        raise ValueError(f"{len(answers)} answer spans for {len(tokens)} contexts")
    hits = []
    for i, (a0, a1) in enumerate(answers):
        if not 0 < a0 < a1 <= tokens.shape[1] or a1 - 1 > logits.shape[1]:
            raise ValueError(f"answer span {(a0, a1)} does not fit logits of {logits.shape[1]} positions")
        rows = logits[i, a0 - 1 : a1 - 1]  # the positions whose next token is an answer token
        hits.append((rows.argmax(-1) == tokens[i, a0:a1]).all() & finite_rows(rows.flatten()[None])[0])
    return torch.stack(hits) if hits else torch.zeros(0, dtype=torch.bool)


@torch.no_grad()
def retrieval_hits(model: torch.nn.Module, samples: Sequence[NeedleSample], batch_size: int = 16) -> Tensor:
    """bool ``(len(samples),)``: which contexts ``model`` answers exactly (:func:`answer_hits`).

    Each context is fed without its last token, as a training window of ``len - 1`` inputs is, so a model
    trained on windows of ``seq_len`` inputs scores contexts of ``seq_len + 1`` tokens at its own length.
    The model is put in eval mode for the call and back in its mode after it; the result is on the CPU.
    """
    samples = list(samples)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        out = []
        for b in range(0, len(samples), batch_size):
            batch = samples[b : b + batch_size]
            lengths = {len(s.tokens) for s in batch}
            if len(lengths) > 1:
                raise ValueError(f"contexts of different lengths {sorted(lengths)} in one batch")
            tokens = torch.stack([s.tokens for s in batch]).to(device)
            logits = model(tokens[:, :-1])
            out.append(answer_hits(logits, tokens, [s.answer for s in batch]).cpu())
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


@torch.no_grad()
def evaluate_retrieval(
    model: torch.nn.Module,
    distractor: np.ndarray,
    tokenizer: Tokenizer,
    lengths: Sequence[int] = (128, 192, 256),
    needle_counts: Sequence[int] = (1, 2, 4, 6),
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    samples: int = 8,
    seed: int = 0,
    batch_size: int = 16,
) -> list[dict]:
    """Exact-match retrieval accuracy and attention scores for every (length, needles, depth) cell.

    The contexts depend only on ``seed`` and the cell (:func:`diffzoo.data.needles.needle_cells`), so different
    models see the same contexts. An answer counts as retrieved when the argmax at every answer position is
    the right token (:func:`answer_hits`, the same as greedy decoding of the answer). Cells whose needles do
    not fit the length are skipped.

    Returns:
        one dict per cell: ``length, needles, depth, n, correct, accuracy, score_answer, score_noise``.
    """
    # diffzoo.data's package imports its Lightning DataModules: imported here, when contexts are built
    from ..data.needles import needle_cells, needle_masks

    model.eval()
    device = next(model.parameters()).device
    rows = []
    for length in lengths:
        for count, depth, cell in needle_cells(distractor, tokenizer, length, needle_counts, depths, samples, seed):
            correct, ans_scores, noise_scores = 0, [], []
            for b in range(0, len(cell), batch_size):
                batch = cell[b : b + batch_size]
                tokens = torch.stack([s.tokens for s in batch]).to(device)
                with record_attention(model) as record:
                    logits = model(tokens)
                correct += int(answer_hits(logits, tokens, [s.answer for s in batch]).sum())
                query, answer, noise = (m.to(device) for m in needle_masks(batch))
                s_ans, s_noise = attention_scores(record.maps(), query, answer, noise)
                ans_scores += s_ans.tolist()
                noise_scores += s_noise.tolist()
            rows.append(dict(
                length=length, needles=count, depth=depth, n=len(cell), correct=correct,
                accuracy=correct / len(cell), score_answer=float(np.mean(ans_scores)),
                score_noise=float(np.mean(noise_scores)),
            ))
    return rows
