"""The study harness: statistics, attention variants, MQAR and cluttered-digit data, the gradient-norm
monitor, the quick modes of the new recipes and the sweep pipeline (tests check the pipeline, not the
science)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from diffzoo import stats


# -- statistics ------------------------------------------------------------------------------------
def test_exact_permutation_three_vs_three_fully_separated():
    p, exact, count = stats.permutation_p([5.0, 6.0, 7.0], [1.0, 2.0, 3.0])
    assert exact and count == 20 and p == pytest.approx(0.1)  # 2 of C(6, 3) splits are as extreme


def test_welch_and_permutation_match_scipy():
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 1.0, 6), rng.normal(0.0, 2.0, 5)
    c = stats.compare(a, b)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert c.t == pytest.approx(ref.statistic) and c.p_welch == pytest.approx(ref.pvalue)
    assert c.df == pytest.approx(ref.df) and (c.ci_low, c.ci_high) == pytest.approx((ci.low, ci.high))
    # two-sided as |difference of means| at least the observed one (scipy's "two-sided" doubles a tail)
    perm = scipy_stats.permutation_test((a, b), lambda x, y: abs(np.mean(x) - np.mean(y)), n_resamples=np.inf,
                                        alternative="greater")
    assert c.perm_exact and c.perm_count == math.comb(11, 6)
    assert c.p_perm == pytest.approx(perm.pvalue)
    assert c.mean_a == pytest.approx(a.mean()) and c.sd_b == pytest.approx(b.std(ddof=1)) and c.n_b == 5


def test_monte_carlo_permutation_beyond_the_exact_limit():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 1.0, 12), rng.normal(0.0, 1.0, 12)
    exact, _, _ = stats.permutation_p(a, b, exact_limit=3_000_000)  # all C(24, 12) = 2.7 M splits
    p1, is_exact, count = stats.permutation_p(a, b, resamples=4000, seed=1, exact_limit=1000)
    p2, _, _ = stats.permutation_p(a, b, resamples=4000, seed=1, exact_limit=1000)
    assert not is_exact and count == 4000 and p1 == p2  # seeded: reproducible
    assert p1 == pytest.approx(exact, abs=0.03)


def test_holm_by_hand_and_zero_spread():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, float("nan"), 0.01]) == pytest.approx([0.5, float("nan"), 0.02], nan_ok=True)
    w = stats.welch([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert w["p"] == 0.0 and w["ci_low"] == w["ci_high"] == 1.0
    with pytest.raises(ValueError, match="non-finite"):
        stats.compare([1.0, float("nan")], [1.0, 2.0])


def test_welch_contrast_by_hand_and_its_bad_inputs():
    rng = np.random.default_rng(5)
    groups = [rng.normal(m, s, n) for m, s, n in ((3.0, 1.0, 5), (1.0, 2.0, 6), (2.0, 0.5, 4), (0.5, 1.5, 7))]
    w = (1.0, -1.0, -1.0, 1.0)
    c = stats.welch_contrast(groups, w, confidence=0.9)
    v = [wi * wi * g.var(ddof=1) / g.size for wi, g in zip(w, groups)]
    se, df = math.sqrt(sum(v)), sum(v) ** 2 / sum(vi * vi / (g.size - 1) for vi, g in zip(v, groups))
    diff = sum(wi * g.mean() for wi, g in zip(w, groups))
    half = scipy_stats.t.ppf(0.95, df) * se
    assert c["diff"] == pytest.approx(diff) and c["df"] == pytest.approx(df) and c["t"] == pytest.approx(diff / se)
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((diff - half, diff + half))
    assert c["p"] == pytest.approx(2 * scipy_stats.t.sf(abs(diff / se), df))
    with pytest.raises(ValueError, match="3 groups and 2 weights"):
        stats.welch_contrast(groups[:3], (1.0, -1.0))
    with pytest.raises(ValueError, match="0 groups"):
        stats.welch_contrast([], [])
    one = stats.welch_contrast([[1.0], [2.0, 3.0]], (1.0, -1.0))  # one value: a difference but no interval
    assert one["diff"] == pytest.approx(-1.5) and math.isnan(one["p"]) and math.isnan(one["ci_low"])


# -- variants --------------------------------------------------------------------------------------
def _count(m):
    return sum(p.numel() for p in m.parameters())


def test_lm_variants_layer_settings_and_matched_v2():
    from diffzoo.layers import DiffAttention, DiffAttentionV2
    from diffzoo.layers.variants import VARIANTS, get_variant
    from diffzoo.models.lm import LMConfig
    from diffzoo.models.variants import build_lm

    cfg = LMConfig(dim=64, depth=2, num_heads=4, vocab_size=40)
    models = {v: build_lm(v, cfg) for v in VARIANTS}
    soft = _count(models["softmax"])
    assert _count(models["diff_v2"]) > 1.05 * soft  # the unmatched V2 carries extra query heads
    assert abs(_count(models["diff_v2_matched"]) - soft) <= 3 * 64  # within one SwiGLU unit
    assert isinstance(models["diff_v2_matched"].blocks[0].attn, DiffAttentionV2)
    assert models["softmax_wide"].blocks[0].attn.num_heads == 2 and models["softmax_wide"].blocks[0].attn.head_dim == 32
    assert _count(models["softmax_wide"]) == soft
    const = [b.attn.lambda_init for b in models["diff_const"].blocks]
    sched = [b.attn.lambda_init for b in models["diff"].blocks]
    assert const == [0.8, 0.8] and sched[0] != sched[1]
    nonorm = models["diff_nonorm"].blocks[1].attn
    assert isinstance(nonorm, DiffAttention) and isinstance(nonorm.sub_norm, torch.nn.Identity)
    x = torch.randint(0, 40, (2, 12))
    for m in models.values():
        assert m(x).shape == (2, 12, 40)
    with pytest.raises(ValueError, match="unknown attention variant 'diff3'.*softmax"):
        get_variant("diff3")


def test_no_sub_norm_leaves_the_differential_output_unscaled():
    """sub_norm=False: the output equals the plain differential map times V, projected."""
    from diffzoo.kernels import diff_attention
    from diffzoo.layers import DiffAttention

    torch.manual_seed(0)
    layer = DiffAttention(32, 2, depth=3, sub_norm=False)
    x = torch.randn(2, 5, 32)
    B, N, _ = x.shape
    q = layer.q_proj(x).view(B, N, 4, 8).transpose(1, 2)
    k = layer.k_proj(x).view(B, N, 4, 8).transpose(1, 2)
    v = layer.v_proj(x).view(B, N, 2, 16).transpose(1, 2)
    raw = diff_attention(q, k, v, layer.lambda_full())
    expected = layer.out_proj(raw.transpose(1, 2).reshape(B, N, -1))
    torch.testing.assert_close(layer(x), expected)
    assert not any("sub_norm" in n for n, _ in layer.named_parameters())


def test_vit_variants_through_timm_names():
    from diffzoo.layers.variants import VARIANTS
    from diffzoo.models.variants import build_vit, vit_create_args

    kw = dict(img_size=32, patch_size=8, in_chans=1, num_classes=10)
    soft = _count(build_vit("softmax", **kw))
    name, args = vit_create_args("diff_v2_matched", **kw)
    assert name == "diffvit_nano_patch7_28" and args["attn"] == "diff_v2_matched"
    matched = build_vit("diff_v2_matched", **kw)
    assert abs(_count(matched) - soft) <= 4 * (2 * 96 + 1)  # within one MLP unit per block
    assert build_vit("softmax_wide", **kw).blocks[0].attn.num_heads == 2
    for v in VARIANTS:
        assert build_vit(v, **kw)(torch.randn(1, 1, 32, 32)).shape == (1, 10)


# -- data ------------------------------------------------------------------------------------------
def test_mqar_layout_labels_and_knobs():
    from diffzoo.data.mqar import IGNORE, MQARSpec, make_mqar

    spec = MQARSpec(num_pairs=6, num_queries=3, seq_len=40, key_vocab=16, value_vocab=8)
    assert spec.filler == 40 - 12 - 6 and spec.vocab_size == 24 and spec.chance == pytest.approx(1 / 8)
    tokens, labels = make_mqar(spec, 50, torch.Generator().manual_seed(0))
    assert tokens.shape == labels.shape == (50, 40)
    for t, y in zip(tokens, labels):
        keys, values = t[0:12:2], t[1:12:2]
        assert len(set(keys.tolist())) == 6 and bool((keys < 16).all()) and bool((values >= 16).all())
        assert bool((t[12:34] < 16).all())  # filler from the key alphabet
        pos = (y != IGNORE).nonzero().flatten()
        assert pos.tolist() == [34, 36, 38]
        for p in pos:  # each query key is answered with the value it was paired with
            i = keys.tolist().index(int(t[p]))
            assert int(y[p]) == int(values[i]) == int(t[p + 1])
    with pytest.raises(ValueError, match="seq_len=10 is shorter"):
        MQARSpec(num_pairs=4, seq_len=10)


def _eliminate(tokens, labels, P, generator, remove=True):
    """Logits of the no-recall shortcut: at each query, a uniform pick among the pair values that no earlier
    query of the row was answered with (``remove=False``: among all pair values)."""
    from diffzoo.data.mqar import IGNORE

    logits = torch.zeros(*tokens.shape, int(tokens.max()) + 1)
    for b in range(len(tokens)):
        left = tokens[b, 1 : 2 * P : 2].tolist()
        for pos in (labels[b] != IGNORE).nonzero().flatten().tolist():
            pick = left[int(torch.randint(len(left), (1,), generator=generator))]
            logits[b, pos, pick] = 1.0
            answer = int(labels[b, pos])
            if remove and answer in left:
                left.remove(answer)
    return logits


def test_mqar_elimination_shortcut_levels_and_query_replacement():
    from diffzoo.data.mqar import MQARSpec, accuracy_by_query, elimination_accuracy, make_mqar

    g = torch.Generator().manual_seed(0)
    spec = MQARSpec(num_pairs=4, filler=4)
    assert elimination_accuracy(spec) == pytest.approx([1 / 4, 1 / 3, 1 / 2, 1.0])
    tokens, labels = make_mqar(spec, 3000, g)
    correct, total = accuracy_by_query(_eliminate(tokens, labels, 4, g), labels)
    assert total.tolist() == [3000] * 4
    # the shortcut, which never looks a key up, reaches the documented levels (52 % on average)
    assert (correct / total).tolist() == pytest.approx(elimination_accuracy(spec), abs=0.03)
    # with replacement there is nothing to eliminate: a guess among the pair values scores 1 / P at every
    # query; more queries than pairs are allowed
    rep = MQARSpec(num_pairs=4, num_queries=6, filler=4, query_replacement=True)
    tokens, labels = make_mqar(rep, 3000, g)
    assert tokens.shape[1] == 8 + 4 + 12
    qkeys = tokens[:, 12::2]
    assert bool((qkeys[:, :, None] == tokens[:, None, 0:8:2]).any(-1).all())  # every query is a pair's key
    assert bool((qkeys[:, :, None] == qkeys[:, None, :]).sum(-1).gt(1).any())  # and keys repeat
    correct, total = accuracy_by_query(_eliminate(tokens, labels, 4, g, remove=False), labels)
    assert (correct / total).tolist() == pytest.approx([1 / 4] * 6, abs=0.03)
    assert elimination_accuracy(rep) == [0.25] * 6
    perfect = torch.nn.functional.one_hot(labels.clamp(min=0), 128).float()
    assert accuracy_by_query(perfect, labels)[0].tolist() == [3000] * 6
    with pytest.raises(ValueError, match="more queries than pairs need query_replacement"):
        MQARSpec(num_pairs=4, num_queries=6)


def test_cluttered_compose_keeps_the_target_and_adds_fragments():
    from diffzoo.data.cluttered import compose

    digits = torch.zeros(3, 28, 28, dtype=torch.uint8)
    digits[0, 4:24, 4:24] = 200
    digits[1:, 4:24, 4:24] = 255
    clean = compose(digits, 0, 0, 64, 12, torch.Generator().manual_seed(0))
    assert int((clean == 200).sum()) == 400 and int((clean == 255).sum()) == 0
    noisy = compose(digits, 0, 6, 64, 12, torch.Generator().manual_seed(0))
    assert int((noisy == 255).sum()) > 0  # fragments come from the other digits only
    assert noisy.shape == (64, 64)


def test_cluttered_align_puts_digit_and_fragments_on_the_patch_grid():
    from diffzoo.data.cluttered import compose

    digits = torch.zeros(3, 28, 28, dtype=torch.uint8)
    digits[0] = 200
    digits[1:] = 255
    for seed in range(20):
        img = compose(digits, 0, 0, 56, 14, torch.Generator().manual_seed(seed), align=7)
        ys, xs = torch.nonzero(img == 200, as_tuple=True)
        assert int(ys.min()) % 7 == 0 and int(xs.min()) % 7 == 0 and len(ys) == 28 * 28
        noisy = compose(digits, 0, 5, 56, 14, torch.Generator().manual_seed(seed), align=7)
        # every 7x7 cell is all one source: nothing straddles the grid
        cells = noisy.reshape(8, 7, 8, 7).permute(0, 2, 1, 3).reshape(64, 49)
        assert bool((cells == cells[:, :1]).all())
    with pytest.raises(ValueError, match="align=5 must be 1 or divide"):
        compose(digits, 0, 1, 56, 14, torch.Generator(), align=5)


def test_cluttered_shuffled_labels_change_training_labels_only():
    from diffzoo.data.cluttered import ClutteredDigitsDataModule

    plain = ClutteredDigitsDataModule(num_val=50, num_test=50, limit_train=400)
    shuffled = ClutteredDigitsDataModule(num_val=50, num_test=50, limit_train=400, shuffle_labels=True)
    plain.setup()
    shuffled.setup()
    a, b = plain.train_set.labels, shuffled.train_set.labels
    assert sorted(a.tolist()) == sorted(b.tolist()) and float((a == b).float().mean()) < 0.3
    for name in ("val", "test"):
        assert torch.equal(plain.eval_sets[name].tensors[1], shuffled.eval_sets[name].tensors[1])


# -- monitor ---------------------------------------------------------------------------------------
def test_grad_norm_monitor_stops_a_diverging_run(tmp_path):
    import lightning.pytorch as pl

    from diffzoo.tasks.callbacks import TrainingDiverged
    from diffzoo.tasks.monitor import DIVERGENCE_FILE, GradNormMonitor

    class Boom(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def training_step(self, batch, i):
            loss = (self.w * batch[0]).sum()
            return loss * float("inf") if self.global_step >= 3 else loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(40, 3)), batch_size=2)
    trainer = pl.Trainer(max_epochs=1, default_root_dir=tmp_path, callbacks=[GradNormMonitor(every_n_steps=1)],
                         enable_progress_bar=False, enable_checkpointing=False, logger=False,
                         enable_model_summary=False)
    with pytest.raises(TrainingDiverged, match="gradient norm is (nan|inf) at step 3"):
        trainer.fit(Boom(), data)
    record = json.loads((tmp_path / DIVERGENCE_FILE).read_text())
    assert record["step"] == 3 and record["what"] == "gradient norm" and trainer.global_step == 3


# -- recipes in quick mode -------------------------------------------------------------------------
@pytest.mark.parametrize("recipe,attn,metric", [("mqar", "diff_nonorm", "test/acc"),
                                                ("cluttered_digits", "softmax_wide", "test/top1")])
def test_quick_recipes_write_summary_and_grad_norm(tmp_path, recipe, attn, metric):
    import importlib

    from diffzoo.study.runs import read_run

    mod = importlib.import_module(f"recipes.{recipe}")
    mod.cli_main(["--quick", "--model.attn", attn, "--trainer.logger.init_args.save_dir", str(tmp_path),
                  "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])
    run = read_run(tmp_path / recipe, ("train/grad_norm",))
    assert 0.0 <= run["summary"]["metrics"][metric] <= 1.0
    assert run["curves"]["train/grad_norm"] and all(math.isfinite(g) for g in run["curves"]["train/grad_norm"])


def test_mqar_queries_scores_a_run_query_by_query(tmp_path, capsys):
    from diffzoo.study.runs import read_run
    from recipes import mqar, mqar_queries

    mqar.cli_main(["--quick", "--model.attn", "softmax", "--trainer.logger.init_args.save_dir", str(tmp_path),
                   "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])
    run = tmp_path / "mqar"
    (scored,) = mqar_queries.main([str(run), str(tmp_path / "not-a-run.log"), "--out", str(tmp_path / "q.md")])
    assert len(scored["by_query"]) == 4 and scored["variant"] == "softmax"
    # the reloaded weights score what the run logged: equal counts per query, so the mean is test/acc
    test_acc = read_run(run, ())["summary"]["metrics"]["test/acc"]
    assert sum(scored["by_query"]) / 4 == pytest.approx(test_acc, abs=1e-6)
    text = (tmp_path / "q.md").read_text()
    assert "*elimination, no recall*" in text and "| 52.1 | 25.0 | 33.3 | 50.0 | 100.0 |" in text
    with pytest.raises(SystemExit):
        mqar_queries.main([str(tmp_path)])  # a folder with no version_N run
    assert "no finished run" in capsys.readouterr().err


# -- sweep pipeline --------------------------------------------------------------------------------
def _fake_run(values):
    """A stand-in for one training: val metric from ``values[(variant, lr)]`` plus the seed."""
    def run(family, out, variant, lr, seed, quick, extra, knob=None, until=None):
        from diffzoo.study.families import run_name

        base = values[(variant, lr)] + (float(knob[1]) / 100 if knob else 0.0)
        v = base + 0.01 * (seed % 5)
        metrics = {family.val_metric: v, family.test_metric: v - 0.05}
        curves = {family.val_metric: [[10, v / 2], [20, v]], "train/grad_norm": [[10, 1.0], [20, 0.5]]}
        diverged = {"step": 5} if lr == 6e-3 else None
        return {"name": run_name(variant, lr, seed, knob), "variant": variant, "lr": lr, "seed": seed,
                "knob": list(knob) if knob else None, "seconds": 1.0, "summary": {"metrics": metrics},
                "curves": curves, "diverged": diverged}
    return run


def test_sweep_picks_best_validation_lr_and_writes_stats(tmp_path, monkeypatch):
    from diffzoo.study import sweep

    values = {("softmax", 1e-3): 0.50, ("softmax", 3e-3): 0.60, ("softmax", 6e-3): 0.90,
              ("diff", 1e-3): 0.70, ("diff", 3e-3): 0.65, ("diff", 6e-3): 0.95}
    monkeypatch.setattr(sweep, "train_run", _fake_run(values))
    out = tmp_path / "sw"
    res = sweep.main(["--family", "mqar", "--variants", "softmax", "diff", "--lrs", "1e-3", "3e-3", "6e-3",
                      "--seeds", "2", "--final-seeds", "3", "--out", str(out), "--extend", "0"])
    # 6e-3 diverged for both, so it never wins despite the higher value
    assert res["best"]["softmax"]["lr"] == 3e-3 and res["best"]["diff"]["lr"] == 1e-3
    soft, diff = res["final"]["rows"]
    assert res["final"]["metric"] == "test/acc"
    assert soft["values"] == pytest.approx([55.0, 56.0, 57.0])  # final seeds 100-102, test metric
    assert diff["vs"]["diff"] == pytest.approx(10.0) and diff["vs"]["perm_exact"]
    assert diff["vs"]["p_perm"] == pytest.approx(0.1) and diff["p_holm"] == pytest.approx(0.1)
    text = (out / "sweep.md").read_text()
    for column in ("mean ± sd", "diff vs softmax [95 % CI]", "Welch t (df)", "p Welch", "p perm", "p Holm"):
        assert column in text
    assert "1 comparison(s)" in text and "Divergences / failures (4 of 18 runs)" in text
    assert (out / "curves.png").stat().st_size > 1000
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["runs"]) == 18  # 12 grid + 6 final runs, reused on the next call

    calls = []
    monkeypatch.setattr(sweep, "train_run", lambda *a, **k: calls.append(a) or _fake_run(values)(*a, **k))
    knob = sweep.main(["--family", "mqar", "--variants", "softmax", "diff", "--knob", "data.num_pairs",
                       "--values", "4", "8", "--final-seeds", "2", "--out", str(out)])
    assert knob["knob_result"]["lrs"] == {"softmax": 3e-3, "diff": 1e-3}  # taken from the sweep above
    # num_pairs 4 is the config's default: those cells are the final runs (seeds 100, 101), not trained again
    assert len(calls) == 4 and {c[5] for c in calls} == {False} and {c[-1][1] for c in calls} == {"8"}
    rows = knob["knob_result"]["rows"]
    assert [r["group"] for r in rows] == ["4", "4", "8", "8"]
    assert rows[0]["values"] == pytest.approx(soft["values"][:2]) and rows[1]["values"] == pytest.approx(diff["values"][:2])
    assert sum(1 for r in rows if "vs" in r) == 2 and "2 comparison(s)" in (out / "knob.md").read_text()
    assert (out / "knob.png").stat().st_size > 1000


def test_best_lr_ties_at_float_round_off_go_to_the_steadier_seeds_then_the_smaller_lr():
    from diffzoo.study import FAMILIES, tables

    family = FAMILIES["speech"]

    def grid(values_by_lr):
        return [{"variant": "v", "lr": lr, "seed": s, "summary": {"metrics": {family.val_metric: v}}}
                for lr, values in values_by_lr.items() for s, v in enumerate(values)]

    # the same clips right over three seeds; the means differ only in float32's last bits, and the
    # higher float mean belongs to the lr with the wider seed spread
    noisy = [0.9907407, 0.9629630, 0.9685185]
    steady = [0.9740740, 0.9722222, 0.9759259]
    assert sum(noisy) / 3 > sum(steady) / 3 and abs(sum(noisy) - sum(steady)) / 3 < 1e-6
    best = tables.best_lrs(family, grid({1e-3: noisy, 2e-3: steady}))["v"]
    assert best["lr"] == 2e-3  # the tie goes to the smaller sd, not to the rounding
    assert best["by_lr"][1e-3]["sd"] > best["by_lr"][2e-3]["sd"]
    # the listing order does not decide a tie
    assert tables.best_lrs(family, grid({2e-3: steady, 1e-3: noisy}))["v"]["lr"] == 2e-3
    # equal means and equal sds: the smaller lr
    assert tables.best_lrs(family, grid({4e-3: steady, 2e-3: list(reversed(steady))}))["v"]["lr"] == 2e-3
    # a real difference (one clip in 1,080) still wins over a steadier lr
    better = [noisy[0] + 1 / 1080, *noisy[1:]]
    assert tables.best_lrs(family, grid({1e-3: better, 2e-3: steady}))["v"]["lr"] == 1e-3
    # an lr with a diverged run loses to one without, whatever its mean
    runs = grid({1e-3: better, 2e-3: steady})
    runs[0]["diverged"] = {"step": 5}
    assert tables.best_lrs(family, runs)["v"]["lr"] == 2e-3


def test_a_crashed_run_is_trained_again_and_a_stopped_one_is_never_recorded(tmp_path, monkeypatch):
    from diffzoo.study import sweep

    crashes = {"softmax_lr0.001_seed1"}
    trained = []

    def fake_train(command, log, append=False, until=None):
        name = command[command.index("--trainer.logger.init_args.name") + 1]
        trained.append(name)
        if name in crashes:
            raise RuntimeError(f"training failed (exit 1); see {log}")
        return 1.0

    monkeypatch.setattr(sweep, "train", fake_train)
    monkeypatch.setattr(sweep, "read_run", lambda folder, curves, steps=False: {
        "summary": {"metrics": {"val/acc": 0.5}}, "curves": {}})
    argv = ["--family", "mqar", "--variants", "softmax", "--lrs", "1e-3", "--seeds", "2", "--final-seeds", "0",
            "--out", str(tmp_path / "sw")]
    res = sweep.main(argv)
    assert res["runs"]["softmax_lr0.001_seed1"]["failed"] and not res["runs"]["softmax_lr0.001_seed0"].get("failed")
    crashes.clear()
    trained.clear()
    res = sweep.main(argv)  # the crash is trained again; the finished run is not
    assert trained == ["softmax_lr0.001_seed1"] and not res["runs"]["softmax_lr0.001_seed1"].get("failed")

    # a run cut short because the study is stopping raises instead of being recorded as a failure
    crashes.add("softmax_lr0.002_seed0")
    monkeypatch.setattr(sweep, "stopping", lambda: True)
    with pytest.raises(RuntimeError):
        sweep.main([*argv, "--lrs", "2e-3", "--seeds", "1"])
    saved = json.loads((tmp_path / "sw" / "results.json").read_text())
    assert "softmax_lr0.002_seed0" not in saved["runs"] and len(saved["runs"]) == 2


def test_sweep_with_no_final_seeds_reports_the_grid_only(tmp_path, monkeypatch):
    from diffzoo.study import sweep

    monkeypatch.setattr(sweep, "train_run", _fake_run({("softmax", 1e-3): 0.5, ("diff", 1e-3): 0.7}))
    out = tmp_path / "grid"
    res = sweep.main(["--family", "mqar", "--variants", "softmax", "diff", "--lrs", "1e-3", "--seeds", "2",
                      "--final-seeds", "0", "--out", str(out)])
    text = (out / "sweep.md").read_text()
    assert "final" not in res and "Final runs" not in text and "seeds 100-99" not in text
    assert "No final runs (--final-seeds 0)" in text and "| softmax |" in text
    assert (out / "curves.png").stat().st_size > 1000  # the grid's curves


def test_sweep_paired_trains_each_variant_at_its_own_lr_in_one_call(tmp_path, monkeypatch, capsys):
    from diffzoo.study import sweep

    calls = []
    fake = _fake_run({("softmax", 4e-3): 0.5, ("diff", 1e-3): 0.7})
    monkeypatch.setattr(sweep, "train_run", lambda *a, **k: calls.append(a[2:4]) or fake(*a, **k))
    out = tmp_path / "check"
    res = sweep.main(["--family", "mqar", "--variants", "softmax", "diff", "--lrs", "4e-3", "1e-3", "--paired",
                      "--seeds", "1", "--final-seeds", "0", "--extend", "0", "--out", str(out)])
    assert sorted(calls) == [("diff", 1e-3), ("softmax", 4e-3)]  # not the 2 x 2 grid
    assert res["grid_lrs"] == {"softmax": [4e-3], "diff": [1e-3]}
    assert res["best"]["softmax"]["lr"] == 4e-3 and res["best"]["diff"]["lr"] == 1e-3
    with pytest.raises(SystemExit):
        sweep.main(["--family", "mqar", "--variants", "softmax", "diff", "--lrs", "4e-3", "--paired",
                    "--out", str(tmp_path / "bad")])
    assert "give one lr per variant" in capsys.readouterr().err


def _hold_lock_in_another_process(records):
    """A second Python process that holds ``records``' lock until its stdin closes (started, and holding, on return)."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from diffzoo.study.runs import records_lock\n"
            "with records_lock(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(records)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_one_process_at_a_time_trains_into_a_records_file(tmp_path, monkeypatch, capsys):
    pytest.importorskip("fcntl", reason="records are locked with flock (POSIX only)")
    from diffzoo.study import plan, sweep
    from diffzoo.study.runs import RecordsBusy, records_lock

    records = tmp_path / "mqar.json"  # the study's name for the mqar cell's records in the folder tmp_path
    records.write_text('{"runs": {}}')
    calls = []
    fake = _fake_run({("softmax", 1e-3): 0.5})
    monkeypatch.setattr(sweep, "train_run", lambda *a, **k: calls.append(a) or fake(*a, **k))
    argv = ["--family", "mqar", "--variants", "softmax", "--lrs", "1e-3", "--seeds", "1", "--final-seeds", "0",
            "--extend", "0", "--out", str(tmp_path / "sw"), "--results", str(records)]
    holder = _hold_lock_in_another_process(records)
    try:
        with pytest.raises(RecordsBusy, match=f"pid {holder.pid}"):
            with records_lock(records):
                pass
        with pytest.raises(SystemExit):
            sweep.main(argv)
        err = capsys.readouterr().err
        assert f"another process (pid {holder.pid})" in err and "overwrite the other's runs" in err
        assert calls == [] and records.read_text() == '{"runs": {}}'  # nothing trained, nothing written
        # the study's run command names the cell and stops before its adoption or sweep touch the records
        with pytest.raises(SystemExit, match="cell mqar: .* another process"):
            plan.main(["run", "--quick", "--cells", "mqar", "--records", str(tmp_path)])
        assert calls == [] and not (tmp_path / "runs").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    res = sweep.main(argv)  # released when its holder ended: the sweep runs
    assert len(calls) == 1 and list(res["runs"]) == ["softmax_lr0.001_seed0"]
    with records_lock(records), records_lock(records):  # nested in one process: no deadlock
        sweep.main(argv)  # and the sweep inside a held lock (the study's run command) is not refused
    holder = _hold_lock_in_another_process(records)  # the lock was released after the nested holds
    holder.stdin.close()
    holder.wait(timeout=60)


def test_sweep_refuses_to_mix_set_ups_and_takes_lrs_from_another_sweep(tmp_path, monkeypatch, capsys):
    from diffzoo.study import sweep

    values = {("softmax", 1e-3): 0.5, ("softmax", 3e-3): 0.6, ("diff", 1e-3): 0.7, ("diff", 3e-3): 0.65}
    calls = []
    monkeypatch.setattr(sweep, "train_run", lambda *a, **k: calls.append(a) or _fake_run(values)(*a, **k))
    base = ["--family", "mqar", "--variants", "softmax", "diff", "--seeds", "1", "--final-seeds", "1", "--extend", "0"]
    first = tmp_path / "first"
    sweep.main([*base, "--lrs", "1e-3", "3e-3", "--out", str(first)])
    # the same folder with another data argument: its cached runs have the same names, so it is refused
    with pytest.raises(SystemExit):
        sweep.main([*base, "--lrs", "1e-3", "3e-3", "--out", str(first), "--data.filler", "8"])
    err = capsys.readouterr().err
    assert "trained with no extra arguments, not --data.filler 8" in err and "--lrs-from" in err
    with pytest.raises(SystemExit):
        sweep.main([*base, "--lrs", "1e-3", "3e-3", "--out", str(first), "--quick"])
    assert "(--quick)" in capsys.readouterr().err
    # a new folder, knob runs at the lrs tuned in the first folder, with the extra argument
    calls.clear()
    second = tmp_path / "second"
    knob = sweep.main(["--family", "mqar", "--variants", "softmax", "diff", "--knob", "data.num_pairs",
                       "--values", "4", "--final-seeds", "1", "--lrs-from", str(first / "results.json"),
                       "--out", str(second), "--data.filler", "8"])
    assert knob["knob_result"]["lrs"] == {"softmax": 3e-3, "diff": 1e-3}
    assert len(calls) == 2 and all(c[6] == ["--data.filler", "8"] for c in calls)  # trained, not reused
    with pytest.raises(SystemExit):
        sweep.main(["--family", "mqar", "--knob", "data.num_pairs", "--values", "4", "--lrs-from",
                    str(tmp_path / "none.json"), "--out", str(tmp_path / "third")])
    assert "no such file" in capsys.readouterr().err


def test_sweep_rejects_unknown_variant_and_knob(tmp_path, capsys):
    from diffzoo.study import sweep

    with pytest.raises(SystemExit):
        sweep.main(["--family", "vit", "--variants", "bogus", "--out", str(tmp_path)])
    assert "--variants bogus: family vit accepts softmax" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--family", "mqar", "--knob", "data.k", "--values", "1", "--out", str(tmp_path)])
    assert "data.num_pairs" in capsys.readouterr().err


@pytest.mark.slow
def test_sweep_quick_end_to_end(tmp_path):
    """Real processes: the quick grid, final runs and random-init scores of MQAR."""
    from diffzoo.study import sweep

    out = tmp_path / "sw"
    res = sweep.main(["--family", "mqar", "--variants", "softmax", "diff", "--lrs", "3e-3", "--seeds", "1",
                      "--final-seeds", "2", "--jobs", "2", "--quick", "--out", str(out)])
    assert len(res["final"]["runs"]) == 4 and (out / "curves.png").is_file()
    chance = sweep.main(["--family", "mqar", "--variants", "softmax", "--chance", "2", "--quick", "--out", str(out)])
    assert {r["metric"] for r in chance["chance"]["rows"]} == {"val/acc", "test/acc"}


def test_chance_rows_report_every_logged_score_but_not_losses_or_counts():
    from diffzoo.study import FAMILIES, tables

    family = FAMILIES["clip"]
    scored = [{"variant": "softmax", "seed": s, "metrics": {
        "val/mean_recall": 0.3 + s / 100, "val/zs_top1": 0.1 + s / 100, "val/zs_pair": 0.7 + s / 10,
        "val/loss": 4.0, "val/evaluated": 300.0, "val/skipped": 0.0, "train/loss": 9.0}} for s in range(3)]
    rows = {r["metric"]: r for r in tables.chance_rows(family, scored)}
    assert set(rows) == {"val/mean_recall", "val/zs_top1 (%)", "val/zs_pair (%)"}  # the family's own metric first
    assert rows["val/zs_pair (%)"]["mean"] == pytest.approx(80.0) and rows["val/zs_pair (%)"]["n"] == 3
    assert (rows["val/mean_recall"]["min"], rows["val/mean_recall"]["max"]) == pytest.approx((30.0, 32.0))
    assert rows["val/zs_top1 (%)"]["mean"] == pytest.approx(11.0)


def test_chance_rows_keep_other_scores_as_logged_in_a_family_of_losses():
    from diffzoo.study import FAMILIES, tables

    scored = [{"variant": "softmax", "seed": s, "metrics": {"val/loss": 5.0 + s / 10, "val/ppl": 150.0 + s}}
              for s in range(2)]
    rows = {r["metric"]: r for r in tables.chance_rows(FAMILIES["lm"], scored)}
    assert set(rows) == {"val/loss", "val/ppl"}  # no "(%)": a perplexity is not a fraction
    assert rows["val/ppl"]["mean"] == pytest.approx(150.5) and rows["val/loss"]["mean"] == pytest.approx(5.05)


def test_ablation_rows_compare_each_variant_with_its_parent():
    from diffzoo.study import FAMILIES, tables

    family = FAMILIES["cluttered"]
    values = {"softmax": [0.50, 0.52, 0.54], "softmax_wide": [0.48, 0.49, 0.50], "diff": [0.40, 0.41, 0.42],
              "diff_const": [0.40, 0.41, 0.43]}
    runs = [{"variant": v, "summary": {"metrics": {"test/top1": x}}} for v, xs in values.items() for x in xs]
    rows = {r["variant"]: r for r in tables.ablation_rows(family, runs, "test/top1")}
    # pairs whose variants both ran, each against its own parent (diff_nonorm and diff_v2_matched absent)
    assert {v: r["parent"] for v, r in rows.items()} == {"softmax_wide": "softmax", "diff": "softmax_wide",
                                                        "diff_const": "diff"}
    assert rows["diff"]["vs"]["diff"] == pytest.approx(100 * (0.41 - 0.49))
    assert rows["diff"]["vs"]["p_perm"] == pytest.approx(0.1)  # 3 vs 3, fully separated
    assert rows["diff"]["p_holm"] == pytest.approx(min(1.0, 3 * 0.1))  # smallest of 3 p-values, Holm x3
    table = tables.ablation_table(list(rows.values()), 2)
    assert table.count("\n") == 4 and "| diff | softmax_wide |" in table


def test_fisher_exact_by_hand_and_bad_counts():
    # 4 of 4 against 0 of 4: with margins 4/4, only this table and its mirror are as unlikely: 2 / C(8, 4)
    assert stats.fisher_exact(4, 4, 0, 4) == pytest.approx(2 / math.comb(8, 4))
    # 2 of 8 against 7 of 8: the hypergeometric tables (9 successes in 16, 8 drawn) no likelier than k = 2
    probs = [math.comb(8, k) * math.comb(8, 9 - k) / math.comb(16, 9) for k in range(1, 9)]
    observed = probs[2 - 1]
    assert stats.fisher_exact(2, 8, 7, 8) == pytest.approx(sum(q for q in probs if q <= observed * (1 + 1e-9)))
    assert stats.fisher_exact(3, 8, 3, 8) == pytest.approx(1.0)
    for bad in ((5, 4, 0, 4), (-1, 4, 0, 4), (0, 0, 0, 4), (1.5, 4, 0, 4)):
        with pytest.raises(ValueError, match="successes"):
            stats.fisher_exact(*bad)


def test_success_rows_count_the_seeds_that_learn_and_compare_the_counts():
    from diffzoo.study import FAMILIES, tables

    family = FAMILIES["needle"]
    assert family.success == 50.0
    values = {"softmax": [0.95, 0.50, 0.97, 0.99], "diff": [0.25, 0.49, float("nan"), 0.10]}
    runs = [{"variant": v, "seed": 100 + i, "summary": {"metrics": {"test/needle_acc": x}}}
            for v, xs in values.items() for i, x in enumerate(xs)]
    rows = {r["variant"]: r for r in tables.success_rows(family, runs[::-1], "softmax", "test/needle_acc")}
    # 50.0 counts (the threshold is reached), 49.0 and a diverged run (nan) do not; values in seed order
    assert (rows["softmax"]["k"], rows["softmax"]["n"], rows["diff"]["k"], rows["diff"]["n"]) == (4, 4, 0, 4)
    assert rows["softmax"]["values"] == pytest.approx([95.0, 50.0, 97.0, 99.0])
    assert "p_fisher" not in rows["softmax"] and rows["diff"]["p_fisher"] == pytest.approx(2 / 70)
    table = tables.success_table(family, list(rows.values()), "softmax")
    assert "| softmax | 4 of 4 | 95.0, 50.0, 97.0, 99.0 | reference |" in table
    assert "| diff | 0 of 4 | 25.0, 49.0, –, 10.0 | 0.029 |" in table
    lossy = dataclasses.replace(FAMILIES["lm"], success=1.3)  # lower is better: a run reaches 1.3 or less
    losses = [{"variant": "softmax", "seed": s, "summary": {"metrics": {"test/loss": x}}}
              for s, x in enumerate((1.2, 1.3, 1.4))]
    assert tables.success_rows(lossy, losses, "softmax", "test/loss")[0]["k"] == 2
    with pytest.raises(ValueError, match="no success threshold"):
        tables.success_rows(FAMILIES["cluttered"], runs, "softmax", "test/needle_acc")


def test_the_study_library_reads_records_without_lightning_and_recipes_sweep_is_its_command_line():
    """diffzoo.study loads (and reads a record) with no Lightning import: the trainings run elsewhere."""
    import subprocess
    import sys

    code = ("import sys, json, pathlib; import diffzoo.study.sweep as s; from diffzoo.study import tables; "
            "r = json.loads(pathlib.Path('docs/results/study/vit.json').read_text()); "
            "tables.best_lrs(s.FAMILIES['vit'], list(r['runs'].values())); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    from diffzoo.study import FAMILIES, sweep
    from recipes import sweep as entry

    assert entry.main is sweep.main
    assert all(f.config.is_file() for f in FAMILIES.values())  # each recipe's default config is found


def test_progress_line_says_how_far_and_how_long_the_rest_takes():
    from diffzoo.study.runs import progress_line

    assert progress_line(3, 45, 900.0) == "progress: 3 of 45 runs, 15 min so far, about 3.5 h left at this pace"
    assert progress_line(40, 45, 6000.0) == "progress: 40 of 45 runs, 1.7 h so far, about 12 min left at this pace"
    assert progress_line(45, 45, 6000.0) == "progress: 45 of 45 runs, 1.7 h so far"  # done: nothing left to guess
    assert progress_line(1, 4, 20.0) == "progress: 1 of 4 runs, 20 s so far, about 60 s left at this pace"


def test_the_gradient_norm_curve_is_recorded_to_four_significant_digits():
    """The records keep the plotted-only gradient-norm curve short: steps as logged, values to 4 significant digits."""
    from diffzoo.study.sweep import drawn_only

    curve = [[9, 3.6937177181243896], [19, 10.921234], [29, 0.000123456]]
    assert drawn_only(curve) == [[9, 3.694], [19, 10.92], [29, 0.0001235]]


def test_a_long_gradient_norm_curve_is_thinned_to_at_most_its_cap_keeping_both_ends():
    """A 32,000-step LM run logs 3,200 gradient norms; its record keeps at most ``DRAWN_POINTS`` of them, evenly
    strided, with the first and the last step always there. A curve at or under the cap keeps every point."""
    from diffzoo.study.sweep import DRAWN_POINTS, drawn_only

    def curve(n):
        return [[10 * i + 9, 1.0 + i] for i in range(n)]

    assert drawn_only(curve(DRAWN_POINTS)) == curve(DRAWN_POINTS)  # at the cap every point stays (speech logs <= 448)
    assert drawn_only([]) == []
    for n, most in ((3200, 1000), (6400, 1000), (1001, 1000), (2000, 1000), (1999, 1000), (10, 3), (7, 3), (9, 3)):
        kept = drawn_only(curve(n), most)
        steps = [s for s, _ in kept]
        assert len(kept) <= most and kept[0] == curve(n)[0] and kept[-1] == curve(n)[-1], (n, most, len(kept))
        assert steps == sorted(set(steps)) and len(kept) >= most // 2 - 1, (n, most, len(kept))
        assert all(v == 1.0 + (s - 9) // 10 for s, v in kept)  # each point is the logged one at its step
    assert [s for s, _ in drawn_only(curve(3200))][:3] == [9, 49, 89]  # every 4th of 3,200: 801 points
    assert len(drawn_only(curve(3200))) == 801


# -- --finish-by: a study that must end by a set time ---------------------------------------------
def test_finish_by_reads_clock_times_dates_and_spans():
    import datetime as dt

    from diffzoo.study.runs import parse_finish_by

    now = dt.datetime(2026, 11, 29, 15, 20, 30)
    assert parse_finish_by("18:07", now) == dt.datetime(2026, 11, 29, 18, 7)
    assert parse_finish_by("06:00", now) == dt.datetime(2026, 11, 30, 6, 0)  # already past today: tomorrow
    assert parse_finish_by("90m", now) == now + dt.timedelta(minutes=90)
    assert parse_finish_by("1h30m", now) == parse_finish_by("90m", now) == now + dt.timedelta(hours=1.5)
    assert parse_finish_by("2h", now) == now + dt.timedelta(hours=2)
    assert parse_finish_by("2026-12-01T08:15", now) == dt.datetime(2026, 12, 1, 8, 15)
    for bad, says in (("25:00", "give a clock time"), ("soon", "give a clock time"), ("", "give a clock time"),
                      ("2026-11-28T10:00", "that time has passed")):
        with pytest.raises(ValueError, match=says):
            parse_finish_by(bad, now)


def test_expected_seconds_takes_the_longest_run_most_like_the_next_one():
    from diffzoo.study.sweep import expected_seconds

    cache = {"a": {"variant": "softmax", "lr": 1e-3, "seconds": 100.0},
             "b": {"variant": "softmax", "lr": 1e-3, "seconds": 300.0},
             "c": {"variant": "softmax", "lr": 2e-3, "seconds": 500.0},
             "d": {"variant": "diff", "lr": 1e-3, "seconds": 900.0},
             "e": {"variant": "diff", "lr": 4e-3, "failed": "exit 1", "seconds": 5000.0}}  # a crash says nothing
    assert expected_seconds(cache, "softmax", 1e-3) == pytest.approx(330.0)  # same variant and lr, + 10 %
    assert expected_seconds(cache, "softmax", 8e-3) == pytest.approx(550.0)  # same variant, any lr
    assert expected_seconds(cache, "diff_v2_matched", 1e-3) == pytest.approx(990.0)  # any run of these records
    # a guess for the variant itself beats another variant's run; one for another variant does not
    assert expected_seconds(cache, "diff_v2_matched", 1e-3, fallback={"diff_v2_matched": 2000.0}) == 2000.0
    assert expected_seconds(cache, "diff_v2_matched", 1e-3, fallback={"softmax": 2000.0}) == pytest.approx(990.0)
    assert expected_seconds(cache, "softmax", 1e-3, fallback={"softmax": 2000.0}) == pytest.approx(330.0)
    assert expected_seconds({}, "softmax", 1e-3, fallback={"*": 60.0}) == 60.0
    assert expected_seconds({}, "diff", 1e-3, fallback={"softmax": 60.0, "diff_v2_matched": 90.0}) == 90.0
    assert expected_seconds({}, "softmax", 1e-3) is None


def test_run_minutes_takes_a_time_per_variant_or_for_any():
    from diffzoo.study.sweep import run_minutes

    assert run_minutes("12.5") == ("*", 12.5) and run_minutes("diff_v2_matched=70") == ("diff_v2_matched", 70.0)
    with pytest.raises(argparse.ArgumentTypeError, match="'diff=soon': give minutes"):
        run_minutes("diff=soon")


def test_finish_by_starts_no_run_that_would_end_after_it(tmp_path, monkeypatch, capsys, deadline_reset):
    """Each run "takes" 10 minutes by its record. With 10 minutes left, the first run (nothing recorded, so of
    unknown length) starts, the second (about 11 minutes by the first) does not; the call finishes with the
    first recorded, and the same command later trains only the rest. With --run-minutes giving a first run's
    length, not even the first starts."""
    import datetime as dt

    from diffzoo.study import runs, sweep

    trained = []

    def fake(family, out, variant, lr, seed, *rest, **kw):
        trained.append(seed)
        return {**_fake_run({("softmax", 1e-3): 0.5})(family, out, variant, lr, seed, *rest, **kw), "seconds": 600.0}

    monkeypatch.setattr(sweep, "train_run", fake)
    argv = ["--family", "mqar", "--variants", "softmax", "--lrs", "1e-3", "--seeds", "3", "--final-seeds", "0",
            "--extend", "0", "--out", str(tmp_path / "sw")]
    in_10_min = (dt.datetime.now() + dt.timedelta(minutes=10)).isoformat(timespec="seconds")
    with pytest.raises(runs.Finishing, match=r"softmax_lr0.001_seed1 takes about 11 min, so it would end about "):
        sweep.main([*argv, "--finish-by", in_10_min])
    assert trained == [0] and "unknown; started anyway" in capsys.readouterr().out
    saved = json.loads((tmp_path / "sw" / "results.json").read_text())
    assert list(saved["runs"]) == ["softmax_lr0.001_seed0"]  # the run that started was recorded

    runs.finish_by(None)
    runs._FINISHING.clear()
    sweep.main(argv)  # no limit: the two runs left, and only those
    assert trained == [0, 1, 2]

    with pytest.raises(runs.Finishing, match="softmax_lr0.001_seed0 takes about 20 min"):
        sweep.main([*argv, "--out", str(tmp_path / "other"), "--finish-by", in_10_min, "--run-minutes", "20"])
    assert trained == [0, 1, 2] and not (tmp_path / "other" / "results.json").exists()
    with pytest.raises(SystemExit):
        sweep.main([*argv, "--finish-by", "whenever"])
    assert "give a clock time" in capsys.readouterr().err


def test_finish_by_ends_the_study_command_with_a_message_not_a_traceback(monkeypatch, capsys, deadline_reset):
    import datetime as dt
    import signal

    from diffzoo.study import plan, runs

    seen = []
    monkeypatch.setattr(runs, "finish_by", lambda when: seen.append(when))
    monkeypatch.setattr(plan, "finish_by", lambda when: seen.append(when))
    with pytest.raises(SystemExit):
        plan.main(["status", "--finish-by", "2h"])
    assert "limits the trainings of the run command only" in capsys.readouterr().err and not seen

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:  # main_with_signals installs the study's handlers: put pytest's back after
        runs._DEADLINE[:] = [(dt.datetime.now() + dt.timedelta(minutes=5)).timestamp()]
        with pytest.raises(SystemExit) as ended:
            runs.main_with_signals(lambda: runs.check_time_left(3600.0, "diff_lr0.002_seed100"))
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    said = str(ended.value)
    assert said.startswith("diff_lr0.002_seed100 takes about 60 min") and "after --finish-by" in said
    assert "finished the trainings that were running (recorded)" in said

    def pause():
        raise runs.Paused("cells left for later by --finish-by: speech")

    try:  # a training paused at its checkpoint: the closing line says paused, not finished and recorded
        with pytest.raises(SystemExit) as ended:
            runs.main_with_signals(pause)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    said = str(ended.value)
    assert said.startswith("cells left for later by --finish-by: speech: paused the trainings still running")
    assert "The same command resumes them" in said and "finished the trainings" not in said


def test_finish_by_goes_on_to_the_cells_after_one_that_stopped(tmp_path, monkeypatch, capsys, deadline_reset):
    """With 30 minutes left, a cell whose next run takes an hour stops; of the cells after it, its budget check
    (which needs its best lrs) and a cell whose run length nothing recorded can tell are not started, and two
    cells of short runs train. A SIGUSR1 during a cell ends the command there: no cell after it starts."""
    from diffzoo.study import plan, runs, sweep

    minutes = {"cluttered": 60.0, "cluttered-2x": 1.0, "vit-l": None, "needle": 1.0, "clip-2x": 1.0}
    trained, told = [], []

    def fake_sweep(argv):  # one run per cell, held to the limit as the sweep holds each of its runs
        name = argv[0]
        if name in told:
            runs.finish_trainings(10, None)
        runs.check_time_left(None if minutes[name] is None else 60 * minutes[name], f"{name}'s next run")
        if runs._FINISHING.is_set():  # as runs.train refuses to start a training then
            raise runs.Finishing("the study was told to finish")
        trained.append(name)

    monkeypatch.setattr(sweep, "main", fake_sweep)
    monkeypatch.setattr(plan, "cell_sweeps", lambda cell, *a: [[cell.name]])
    monkeypatch.setattr(plan, "adopt_runs", lambda *a: 0)
    monkeypatch.setattr(plan, "_variant_seconds", lambda records, cell, longest=False:
                        {} if minutes[cell.name] is None else {"softmax": 60 * minutes[cell.name]})
    argv = ["run", "--cells", *minutes, "--finish-by", "30m", "--records", str(tmp_path)]
    with pytest.raises(runs.Finishing, match="cells left for later by --finish-by: cluttered, cluttered-2x$") as left:
        plan.main(argv)
    assert trained == ["needle", "clip-2x"]
    assert not isinstance(left.value, runs.Paused)  # nothing was paused: no training was running at the limit
    out = capsys.readouterr().out
    assert "== cell cluttered stopped after" in out and "cluttered's next run takes about 60 min" in out
    assert "== cell cluttered-2x: not started, it needs cell cluttered" in out
    assert "== cell vit-l: not started after a --finish-by stop" in out

    def pausing_sweep(argv):  # needle's training was running at the limit and paused at its checkpoint
        if argv[0] == "needle":
            raise runs.Paused("needle_lr0.002_seed0 paused at --finish-by")
        fake_sweep(argv)

    trained.clear()
    monkeypatch.setattr(sweep, "main", pausing_sweep)
    with pytest.raises(runs.Paused, match="cells left for later by --finish-by: cluttered, cluttered-2x, needle$"):
        plan.main(argv)
    assert trained == ["clip-2x"]
    assert "== cell needle stopped after 0 s: needle_lr0.002_seed0 paused at --finish-by" in capsys.readouterr().out
    monkeypatch.setattr(sweep, "main", fake_sweep)

    trained.clear()
    told.append("needle")  # SIGUSR1 arrives while needle trains: finishing, not a limit
    with pytest.raises(runs.Finishing, match="^the study was told to finish$"):
        plan.main(argv)
    assert trained == [] and "== cell clip-2x" not in capsys.readouterr().out
