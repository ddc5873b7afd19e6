"""The retrieval pilot's measures: a model that copies scores on the second occurrence, the windows hold what
their answers say, and the loop runs."""

import numpy as np
import torch

from benchmarks import retrieval_pilot as rp


def test_copy_accuracy_separates_a_copying_model_from_one_that_does_not():
    prefix, span = 8, 10
    ctx = rp.repeated_spans(np.arange(1000) % 200, 16, prefix, span, np.random.default_rng(0), random_letters=True)
    assert torch.equal(ctx[:, prefix : prefix + span], ctx[:, prefix + span :])

    def copier(tokens):  # predicts the token that followed the same position one span earlier
        out = torch.zeros_like(tokens)
        out[:, span - 1 :] = tokens[:, : tokens.shape[1] - span + 1]
        return out

    first, second = rp.copy_accuracy(copier, ctx, prefix, span)
    assert second == 100.0 and first < 20.0
    first, second = rp.copy_accuracy(lambda t: torch.zeros_like(t), ctx, prefix, span)
    assert first == second == 0.0  # letters are 97..122, never 0


def test_exact_matches_counts_whole_answers_only():
    window = torch.arange(20).unsqueeze(0)
    answers = [[(5, 8), (10, 12)]]

    def almost(tokens):  # logits right everywhere except at the last byte of the second answer
        pred = torch.arange(1, tokens.shape[1] + 1).unsqueeze(0)
        pred[0, 10] = 0
        return torch.nn.functional.one_hot(pred, 32).float()

    assert rp.exact_matches(almost, window, answers) == 50.0
    assert rp.exact_matches(lambda t: almost(t) * float("nan"), window, answers) == 0.0  # non-finite never scores


def test_training_loop_prints_its_scores(capsys):
    rp.main(["train", "--steps", "2", "--every", "1", "--answer-loss"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("step 2: loss ") and "(chance 0.1 %)" in lines[-1]
