"""Needle-retrieval accuracy of the LM during fit: ``TextDataModule(needle_eval=N)`` builds fixed validation and
test sets of retrieval contexts from the held-out text, ``LanguageModelTask`` logs ``val/needle_acc`` and
``test/needle_acc`` (scored by :func:`diffzoo.evaluation.retrieval.retrieval_hits`), and the study's "needle"
family selects and reports on them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from diffzoo.data.text import TextDataModule
from diffzoo.evaluation.retrieval import answer_hits, retrieval_hits

from conftest import QUIET_CPU_TRAINER  # tests/ is on sys.path

# A corpus whose training part and the two halves of its held-out part use disjoint letters, so the letters of
# a context's distractor text say which part of the corpus it was cut from.
N_CHARS, VAL_FRACTION = 40_000, 0.2
TRAIN_LETTERS, VAL_LETTERS, TEST_LETTERS = "abcdefgh", "ijklmnop", "qrstuvwx"


def _corpus(path: Path) -> Path:
    split = int(N_CHARS * (1 - VAL_FRACTION))
    half = (N_CHARS - split) // 2
    rng = np.random.default_rng(0)
    parts = [(TRAIN_LETTERS, split), (VAL_LETTERS, half), (TEST_LETTERS, N_CHARS - split - half)]
    path.write_text("".join("".join(rng.choice(list(letters), n)) for letters, n in parts))
    return path


def _data(tmp_path: Path, **kw) -> TextDataModule:
    args = dict(corpus=str(_corpus(tmp_path / "corpus.txt")), cache_dir=str(tmp_path / "cache"), seq_len=128,
                batch_size=8, train_windows=16, val_windows=4, val_fraction=VAL_FRACTION, needle_eval=45)
    dm = TextDataModule(**{**args, **kw})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _filler(sample) -> str:
    """The distractor text of a context (its tokens outside the needles, before the query), in order."""
    return bytes(sample.tokens[sample.noise_mask()].tolist()).decode()


def test_contexts_are_held_out_disjoint_balanced_and_the_same_for_every_run(tmp_path: Path) -> None:
    dm = _data(tmp_path)
    text = (tmp_path / "corpus.txt").read_text()
    split = int(N_CHARS * (1 - VAL_FRACTION))
    half = split + (N_CHARS - split) // 2
    val, test = dm.needle_contexts("val"), dm.needle_contexts("test")
    assert len(val) == len(test) == 45 and {len(s.tokens) for s in val + test} == {129}  # seq_len + 1
    for contexts, letters, (lo, hi) in ((val, VAL_LETTERS, (split, half)), (test, TEST_LETTERS, (half, N_CHARS))):
        for s in contexts:
            filler = _filler(s)
            assert set(filler) <= set(letters), "distractor text from outside this set's part of the held-out text"
            assert filler in text[lo:hi]  # one contiguous cut of it
        # balanced over needle counts (1, 2, 4) and the five depths: 45 contexts = 3 per (count, depth)
        cells = [(s.num_needles, s.depth) for s in contexts]
        assert {cells.count(c) for c in set(cells)} == {3} and len(set(cells)) == 15
    assert not {tuple(s.tokens.tolist()) for s in val} & {tuple(s.tokens.tolist()) for s in test}
    # another run (other data seed: other training windows) sees exactly the same contexts
    other = _data(tmp_path, seed=7)
    for a, b in zip(val + test, other.needle_contexts("val") + other.needle_contexts("test")):
        assert torch.equal(a.tokens, b.tokens) and a.answer == b.answer
    moved = _data(tmp_path, needle_eval_seed=1).needle_contexts("val")
    assert not any(torch.equal(a.tokens, b.tokens) for a, b in zip(val, moved))  # the seed does choose them
    # off by default: the plain LM has no contexts
    assert TextDataModule().hparams.needle_eval == 0 and _data(tmp_path, needle_eval=0).needle_contexts("val") == []
    with pytest.raises(ValueError, match="needle_eval"):
        _data(tmp_path, seq_len=96)  # 4 needles, query and answer take 118 tokens


def test_family_windows_hold_four_needles_and_four_queries() -> None:
    """The study's 128-token windows (contexts of 129) hold 4 compact needles " A=123. " and 4 queries "\\nA=123"
    (one-letter keys) with 73 bytes of distractor text left over."""
    from diffzoo.data.needles import recall_window
    from diffzoo.study.families import FAMILIES

    args = FAMILIES["needle"].base_args
    seq_len = int(args[args.index("--data.seq_len") + 1])
    assert seq_len == 128 and args[args.index("--data.needle_counts") + 1] == "[4]"
    assert args[args.index("--data.needle_queries") + 1] == "4"
    letters = int(args[args.index("--data.needle_key_letters") + 1])
    assert letters == 1
    w = recall_window(np.zeros(1000, np.uint8), seq_len + 1, np.random.default_rng(0), needles=4, queries=4,
                      letters=letters)
    assert int(w.samples()[0].noise_mask().sum()) == 129 - 4 * 8 - 4 * 6 == 73
    with pytest.raises(ValueError, match="more than 55"):
        recall_window(np.zeros(1000, np.uint8), 55, np.random.default_rng(0), needles=4, queries=4, letters=letters)


def test_recall_contexts_score_every_answer_and_train_on_the_answers_only(tmp_path: Path) -> None:
    dm = _data(tmp_path, needle_style="recall", needle_counts=[4], needle_queries=4, needle_eval=10,
               answer_loss=True, needle_fraction=1.0)
    val, test = dm.needle_contexts("val"), dm.needle_contexts("test")
    assert len(val) == len(test) == 40  # 10 windows of 4 answers each
    assert len({id(s.tokens) for s in val}) == 10 and {len(s.tokens) for s in val + test} == {129}
    for contexts, letters in ((val, VAL_LETTERS), (test, TEST_LETTERS)):
        for s in contexts[::4]:  # the first answer of each window: its noise is the distractor text only
            assert set(_filler(s)) <= set(letters)
    other = _data(tmp_path, seed=7, needle_style="recall", needle_counts=[4], needle_eval=10)
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(val, other.needle_contexts("val")))
    # a training retrieval window: targets are the 12 answer digits, ignored elsewhere; plain text keeps them all
    x, y = dm.train_set[(0, 123)]
    kept = y != -100
    assert len(x) == len(y) == 128 and int(kept.sum()) == 12
    assert bytes(y[kept].tolist()).isdigit() and torch.equal(y[kept], torch.cat([x[1:], y[-1:]])[kept])
    assert bytes(x[kept].tolist()).replace(b"=", b"").isdigit()  # each answer digit follows "=" or a digit
    x, y = dm.train_set[(0, -1)]
    assert (y != -100).all() and torch.equal(x[1:], y[:-1])
    with pytest.raises(ValueError, match="needle_style='nested'"):
        _data(tmp_path, needle_style="nested")
    with pytest.raises(ValueError, match="needle_queries=0"):
        _data(tmp_path, needle_style="recall", needle_queries=0)


def test_recall_keys_have_the_letters_asked_for(tmp_path: Path) -> None:
    dm = _data(tmp_path, needle_style="recall", needle_counts=[4], needle_queries=4, needle_eval=4,
               needle_fraction=1.0, needle_key_letters=1)
    for tokens in [dm.train_set[(0, seed)][0] for seed in range(5)] + [s.tokens for s in dm.needle_contexts("val")]:
        text = bytes(tokens.tolist()).decode("latin-1")
        assert len(re.findall(r" [A-Z]=\d{3}\. ", text)) == 4 and not re.search(r" [A-Z]{2,}=\d", text)
    with pytest.raises(ValueError, match="needle_key_letters=0"):
        _data(tmp_path, needle_style="recall", needle_key_letters=0)


class _RecallLookup(torch.nn.Module):
    """An oracle for "recall" windows: at every ``"\\nABC="`` it predicts the value planted as ``" ABC=123. "``."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, 256) + self.dummy
        for i, row in enumerate(tokens.tolist()):
            text = bytes(row).decode("latin-1")
            planted = dict(re.findall(r" ([A-Z]{3})=(\d{3})\. ", text))
            for m in re.finditer(r"\n([A-Z]{3})=", text):
                for k, digit in enumerate(planted.get(m.group(1), "")):
                    if m.end() - 1 + k < len(row):
                        logits[i, m.end() - 1 + k, ord(digit)] = 10.0
        return logits


def test_validation_scores_a_recall_oracle_one(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from diffzoo.tasks.lm import LanguageModelTask

    dm = _data(tmp_path, needle_style="recall", needle_counts=[2, 4], needle_queries=3, needle_eval=6)
    assert len(dm.needle_contexts("val")) == 3 * 2 + 3 * 3  # windows of 2 needles ask 2, of 4 ask 3
    task = LanguageModelTask("lm_tiny", attn="softmax")
    task.model = _RecallLookup()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=1)
    assert trainer.validate(task, datamodule=dm, verbose=False)[0]["val/needle_acc"] == 1.0
    assert "15 answers in 6 fixed contexts of 129 tokens" in task.describe_metric("val/needle_acc", dm)


class _KeyLookup(torch.nn.Module):
    """A model that reads the context: it finds the queried name and predicts the value planted for it
    (``honest``) or the value of the needle planted first in the text (``honest=False``), one-hot at the three
    positions that predict the answer digits; uniform logits everywhere else."""

    def __init__(self, honest: bool = True) -> None:
        super().__init__()
        self.honest = honest
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, 256) + self.dummy
        for i, row in enumerate(tokens.tolist()):
            text = bytes(row).decode("latin-1")
            q = text.rfind("\nThe key of ")
            if q < 0:
                continue
            name = text[q + 12 : q + 15]
            planted = re.findall(r" The key of ([A-Z]{3}) is (\d{3})\. ", text[:q])
            value = next((v for n, v in planted if n == name), None) if self.honest else planted[0][1]
            start = q + len(f"\nThe key of {name} is ")  # position of the first answer token
            for k, digit in enumerate(value or ""):
                if start - 1 + k < len(row):
                    logits[i, start - 1 + k, ord(digit)] = 10.0
        return logits


class _ReadsNextToken(torch.nn.Module):
    """A cheat: predicts every token from the next input token. It scores 1.0 only on a scorer that feeds the
    whole answer to the model."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.roll(tokens, -1, 1), 256).float() + self.dummy


def test_scores_an_oracle_one_a_wrong_key_partly_and_a_cheat_or_random_model_not_at_all(tmp_path: Path) -> None:
    from diffzoo.models.lm import CausalLM

    contexts = _data(tmp_path, needle_eval=60).needle_contexts("val")
    assert retrieval_hits(_KeyLookup(), contexts).all()
    # the first-planted needle is the right one only where the queried needle was planted first (always with 1)
    wrong = retrieval_hits(_KeyLookup(honest=False), contexts)
    first = torch.tensor([s.needles[0][0] == min(a for a, _ in s.needles) for s in contexts])
    assert torch.equal(wrong, first) and 0.3 < wrong.float().mean() < 0.8
    assert not retrieval_hits(_ReadsNextToken(), contexts).any()  # the last answer token is never fed
    torch.manual_seed(0)
    untrained = CausalLM.from_preset("lm_tiny", attn="softmax", vocab_size=256)
    assert retrieval_hits(untrained, contexts).float().mean() < 0.05  # chance: 1 in 1,000 three-digit values
    # one wrong digit is a miss; a non-finite answer logit is a miss
    s = contexts[0]
    logits = _KeyLookup()(s.tokens[None, :-1])
    assert answer_hits(logits, s.tokens[None], [s.answer]).item()
    bad = logits.clone()
    bad[0, s.answer[1] - 2, :] = 0.0
    bad[0, s.answer[1] - 2, (int(s.tokens[-1]) + 1) % 256] = 10.0
    assert not answer_hits(bad, s.tokens[None], [s.answer]).item()
    bad = logits.clone()
    bad[0, s.answer[0] - 1, 0] = float("nan")
    assert not answer_hits(bad, s.tokens[None], [s.answer]).item()


def test_validation_logs_the_oracles_needle_accuracy(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from diffzoo.tasks.lm import LanguageModelTask

    dm = _data(tmp_path, needle_eval=30)
    task = LanguageModelTask("lm_tiny", attn="softmax")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=1)
    task.model = _KeyLookup()
    assert trainer.validate(task, datamodule=dm, verbose=False)[0]["val/needle_acc"] == 1.0
    task.model = _KeyLookup(honest=False)
    expected = float(retrieval_hits(task.model, dm.needle_contexts("val")).float().mean())
    assert trainer.validate(task, datamodule=dm, verbose=False)[0]["val/needle_acc"] == pytest.approx(expected)
    assert expected < 1.0
    assert "30 fixed contexts of 129 tokens" in task.describe_metric("val/needle_acc", dm)


def test_fit_logs_val_needle_acc_and_writes_test_needle_acc_to_the_summary(tmp_path: Path, monkeypatch) -> None:
    from recipes.lm import cli_main

    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path / "corpus.txt")
    config = tmp_path / "lm.yaml"
    config.write_text(f"""
seed_everything: 0
model:
  model: lm_tiny
  attn: softmax
  lr: 0.003
  warmup_steps: 1
data:
  corpus: {tmp_path / 'corpus.txt'}
  cache_dir: {tmp_path / 'cache'}
  seq_len: 128
  batch_size: 4
  train_windows: 8
  val_windows: 2
  val_fraction: {VAL_FRACTION}
  test_windows: 2
  needle_fraction: 0.5
  needle_eval: 15
{QUIET_CPU_TRAINER}
""")
    cli = cli_main(["fit", "--config", str(config), "--trainer.max_epochs", "2"])
    import csv

    with open(Path(cli.trainer.log_dir, "metrics.csv")) as f:
        logged = [float(r["val/needle_acc"]) for r in csv.DictReader(f) if r.get("val/needle_acc")]
    assert len(logged) == 2 and all(0.0 <= x <= 1.0 for x in logged)  # one per validation (epoch)
    summary = json.loads(Path(cli.trainer.log_dir, "summary.json").read_text())
    assert 0.0 <= summary["metrics"]["test/needle_acc"] <= 1.0 and "test/loss" in summary["metrics"]
    # the test value is the final weights' share on the test contexts
    hits = retrieval_hits(cli.model.model, cli.datamodule.needle_contexts("test"))
    assert summary["metrics"]["test/needle_acc"] == pytest.approx(float(hits.float().mean()))
    plain = cli_main(["fit", "--config", str(config), "--trainer.max_epochs", "1", "--data.needle_eval", "0"])
    metrics = json.loads(Path(plain.trainer.log_dir, "summary.json").read_text())["metrics"]
    assert not any("needle" in k for k in metrics) and "test/loss" in metrics


def test_study_has_a_needle_row_after_the_lm() -> None:
    from diffzoo.study import plan
    from diffzoo.study.families import FAMILIES

    lm, needle = FAMILIES["lm"], FAMILIES["needle"]
    assert (needle.recipe, needle.val_metric, needle.test_metric) == (lm.recipe, "val/needle_acc", "test/needle_acc")
    assert needle.higher_is_better and needle.scale == 100.0 and needle.budget is not None
    assert needle.budget.epochs * needle.budget.steps_per_epoch == 4000  # twice the step at which V2 went flat in pilots
    args = dict(zip(needle.base_args[::2], needle.base_args[1::2]))
    assert int(args["--data.train_windows"]) == needle.budget.steps_per_epoch * int(args["--data.batch_size"])
    assert (args["--data.needle_fraction"], args["--data.needle_style"], args["--data.answer_loss"]) == (
        "1", "recall", "true") and int(args["--data.needle_eval"]) > 0
    assert lm.base_args[lm.base_args.index("--data.needle_fraction") + 1] == "0" and "--data.needle_eval" not in lm.base_args
    names = [c.name for c in plan.CELLS]
    assert names.index("needle") == names.index("lm") + 1 and "needle-2x" in names
