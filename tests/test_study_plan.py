"""The study's one recipe, its plateau rule, grid extension, records that resume across sessions, and the
headline table with one Holm correction over the whole study. The science is not tested here, the
pipeline is."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import signal
import statistics
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from diffzoo.stats import fisher_exact, holm, welch
from diffzoo.study import plan, sweep
from diffzoo.study.families import FAMILIES, GRAD_NORM, metric_value, run_name
from diffzoo.study.recipe import PLATEAU_TOL, RECIPE, Budget, lr_grid, plateau, recipe_args


def test_plateau_rule_on_rising_flat_and_loss_curves():
    steps = range(100, 1100, 100)
    # the tail starts at step 820: its start is the mean of the evaluations at 700 and 800, its end the
    # mean of the last two (900, 1000)
    rising = [[s, 0.3 + 0.05 * i] for i, s in enumerate(steps)]
    found = plateau(rising, higher_is_better=True)
    assert found is not None and not found.flat and found.start == pytest.approx(0.625)
    assert found.end == pytest.approx(0.725) and found.gain == pytest.approx(0.1)
    flat = [[s, 0.8 + 0.002 * i] for i, s in enumerate(steps)]  # +0.3 points: under both thresholds
    assert plateau(flat, higher_is_better=True).flat
    worse = [[s, 0.8 - 0.01 * i] for i, s in enumerate(steps)]  # got worse over the tail: flat
    assert plateau(worse, higher_is_better=True).flat
    loss = [[s, 2.0 - 0.05 * i] for i, s in enumerate(steps)]  # a loss falling 0.1 = 6 % of its value
    found = plateau(loss, higher_is_better=False)
    assert not found.flat and found.relative == pytest.approx(0.1 / 1.675)
    slow = [[s, 2.0 - 0.005 * i] for i, s in enumerate(steps)]  # 0.01 = 0.5 %: flat
    assert plateau(slow, higher_is_better=False).flat
    # an unbounded metric is judged relative only: a gain of 0.012 on 0.539 is 2.2 %
    assert not plateau([[s, 0.5 + 0.006 * i] for i, s in enumerate(steps)], True, bounded=False).flat
    assert plateau([[1, 0.1], [2, 0.2], [3, 0.3]], True) is None  # too few evaluations to say


def test_recipe_arguments_state_one_rule_for_every_family():
    epochs = recipe_args(Budget(epochs=40))
    steps = recipe_args(Budget(epochs=20, steps_per_epoch=100))
    assert epochs[epochs.index("--model.warmup_epochs") + 1] == "2"  # 5 % of 40 epochs
    assert steps[steps.index("--model.warmup_steps") + 1] == "100"  # 5 % of 2,000 steps
    for args in (epochs, steps):
        assert args[args.index("--trainer.gradient_clip_val") + 1] == f"{RECIPE.grad_clip:g}"
        assert args[args.index("--model.weight_decay") + 1] == f"{RECIPE.weight_decay:g}"
        assert args[args.index("--model.min_lr_ratio") + 1] == f"{RECIPE.min_lr_ratio:g}"
    for name, family in FAMILIES.items():
        assert family.budget is not None, f"{name} has no study budget"
        assert {"softmax", "diff", "diff_v2_matched"} <= set(family.variants), name
    assert lr_grid(2e-3) == [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
    for cell in plan.CELLS:  # main cells: >= 5 lrs; size-trend cells: 3 around the neighbouring size's best
        if cell.epochs_factor is not None:
            continue  # budget checks: the source cell's best lr only
        lrs = cell.lrs
        assert len(lrs) >= (5 if cell.lr_from is None else 3)
        assert max(b / a for a, b in zip(lrs, lrs[1:])) <= 2.0 + 1e-9
    checks = {c.lr_from for c in plan.CELLS if c.epochs_factor is not None}
    assert checks == {"vit", "vit-40ep", "mqar", "cluttered", "cluttered-30ep", "speech", "speech-320ep", "speech-40ep", "clip", "clip-40ep", "clip-80ep",
                      "lm", "lm-2k", "needle", "lm-xs", "speech-80ep", "lm-xs-8k", "lm-xs-16k", "cluttered-120ep", "lm-xxs", "speech-160ep",
                      "lm-xxs-32k", "speech-noisy", "speech-0db", "speech-0db-320ep"}
    by_name = {c.name: c for c in plan.CELLS}  # a budget check trains its source cell's task and size
    assert all((c.extra, c.size_args) == (by_name[c.lr_from].extra, by_name[c.lr_from].size_args)
               for c in plan.CELLS if c.epochs_factor is not None)
    sizes = [c for c in plan.CELLS if c.lr_from is not None and c.epochs_factor is None]
    assert {c.family for c in sizes} == {"vit", "lm"} and all(c.variants == plan.MAIN for c in sizes)
    # the noisiest speech (0 dB) pairs with the speech cell: same task and models, only the noise fixed, at the same
    # budget (640 epochs; 0 dB's first budget, 320, proved short for softmax), taking its 320-epoch check's runs
    noisy, speech = by_name["speech-0db"], by_name[plan.NOISY_OF["speech-0db"]]
    assert speech.name == "speech" and speech.superseded_by is None
    assert (noisy.family, noisy.size_args, noisy.variants) == (speech.family, speech.size_args, ("softmax", "diff"))
    assert noisy.extra == (*speech.extra, "--data.init_args.snr_fixed_db=0") and noisy.superseded_by is None
    assert noisy.epochs == speech.epochs == 640 and noisy.runs_from == "speech-0db-320ep-2x"
    # ... and the 320-epoch cell is history, paired with the clean cell at its own 320 epochs
    first, speech320 = by_name["speech-0db-320ep"], by_name[plan.NOISY_OF["speech-0db-320ep"]]
    assert (first.superseded_by, speech320.name, first.epochs, speech320.epochs) == ("speech-0db", "speech-320ep", 320, 320)
    assert (first.extra, first.variants) == (noisy.extra, noisy.variants)
    # ... each budget check trains the cell's own two variants, at 0 dB, three grid seeds, twice the epochs
    for name, source in (("speech-0db-320ep-2x", first), ("speech-0db-2x", noisy)):
        check = by_name[name]
        assert (check.variants, check.extra, check.check_seeds) == (noisy.variants, noisy.extra, 3)
        assert plan.cell_epochs(check) == 2 * source.epochs
    # the first noisy level, -10 dB, is history: replaced by the 0 dB cell, still paired with the clean cell at its
    # own 320 epochs, its check (640 epochs, three seeds) kept
    old, speech = by_name["speech-noisy"], by_name[plan.NOISY_OF["speech-noisy"]]
    assert (old.superseded_by, speech.name, speech.superseded_by) == ("speech-0db", "speech-320ep", "speech")
    assert (old.family, old.epochs, old.size_args, old.variants) == (speech.family, speech.epochs, speech.size_args,
                                                                    noisy.variants)
    assert old.extra == (*speech.extra, "--data.init_args.snr_fixed_db=-10")
    check = by_name["speech-noisy-2x"]
    assert (check.variants, check.extra, check.check_seeds) == (old.variants, old.extra, 3)
    assert plan.cell_epochs(check) == 2 * old.epochs
    # the clean cell's check as well: all three variants, three grid seeds, 640 epochs
    check = by_name["speech-320ep-2x"]
    assert (check.variants, check.extra, check.check_seeds) == (speech.variants, speech.extra, 3)
    assert plan.cell_epochs(check) == 2 * speech.epochs == 640
    # ... which is the task's budget now: the speech cell takes that check's runs, and has a check of its own
    task = by_name["speech"]
    assert (task.epochs, task.runs_from, task.variants, task.extra) == (640, check.name, plan.MAIN, speech.extra)
    assert plan.cell_epochs(task) == plan.cell_epochs(check)
    assert (by_name["speech-2x"].check_seeds, plan.cell_epochs(by_name["speech-2x"])) == (3, 1280)
    earlier = [c for c in plan.CELLS if c.family == "speech" and c.superseded_by]
    # every earlier speech budget is shorter than the task's; the one cell replaced at the same budget changed the
    # task instead (the -10 dB cell, by the milder 0 dB one)
    assert all(by_name[c.superseded_by].epochs > (c.epochs or 0) for c in earlier if c.name != "speech-noisy")
    assert {c.name for c in earlier if by_name[c.superseded_by].extra != c.extra} == {"speech-noisy"}


def _fake(values, calls):
    def run(family, out, variant, lr, seed, quick, extra, knob=None, until=None):
        calls.append((variant, lr, seed))
        v = values(variant, lr) + 0.001 * seed
        metrics = {family.val_metric: v, family.test_metric: v - 0.05}
        curve = [[10 * i, v * (1 - 0.5 ** i)] for i in range(1, 11)]
        return {"name": run_name(variant, lr, seed), "variant": variant, "lr": lr, "seed": seed, "knob": None,
                "seconds": 1.0, "summary": {"metrics": metrics}, "curves": {family.val_metric: curve},
                "diverged": None}
    return run


def test_grid_extends_past_an_edge_and_resumes_from_its_records(tmp_path, monkeypatch):
    # softmax improves up to 4e-3 and falls at 8e-3; diff keeps improving as the lr falls
    def values(variant, lr):
        return 0.9 - abs(math.log2(lr / 4e-3)) * 0.05 if variant == "softmax" else 0.5 - 10 * lr

    calls: list = []
    monkeypatch.setattr(sweep, "train_run", _fake(values, calls))
    records = tmp_path / "records" / "mqar.json"
    argv = ["--family", "mqar", "--variants", "softmax", "diff", "--lrs", "1e-3", "2e-3", "4e-3", "--seeds", "2",
            "--final-seeds", "3", "--out", str(tmp_path / "out"), "--results", str(records), "--extend", "2"]
    res = sweep.main(argv)
    assert res["grid_lrs"]["softmax"] == [1e-3, 2e-3, 4e-3, 8e-3]  # one step past the edge, then inside
    assert res["grid_lrs"]["diff"] == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]  # two steps down, then the limit
    assert res["best"]["softmax"]["lr"] == 4e-3 and res["best"]["diff"]["lr"] == 2.5e-4
    grid = [c for c in calls if c[2] < sweep.FINAL_SEED]
    assert len(grid) == 2 * (4 + 5) and len(set(grid)) == len(grid)  # every grid run trained once
    assert {c[:2] for c in calls if c[2] >= sweep.FINAL_SEED} == {("softmax", 4e-3), ("diff", 2.5e-4)}
    saved = json.loads(records.read_text())
    mqar = FAMILIES["mqar"]
    assert len(saved["runs"]) == 18 + 6 and saved["fixed"] == [*mqar.base_args, *recipe_args(mqar.budget)]
    calls.clear()
    records.write_text(json.dumps({**saved, "seconds": 1000.0}))  # earlier sessions took 1000 s
    again = sweep.main(argv)  # another session: everything is in the records, nothing is trained
    assert calls == [] and again["best"]["diff"]["lr"] == 2.5e-4
    assert 1000.0 < again["seconds"] < 1100.0  # the records' wall time sums every call, not just the last
    saved["fixed"] = ["--something", "else"]
    records.write_text(json.dumps(saved))
    with pytest.raises(SystemExit):  # records made with other fixed arguments are refused, not mixed
        sweep.main(argv)


def _record(family_name, best, finals):
    family = FAMILIES[family_name]
    runs = {}
    for variant, values in finals.items():
        for i, v in enumerate(values):
            seed = sweep.FINAL_SEED + i
            curve = [[s, v / family.scale] for s in range(10, 110, 10)]
            runs[run_name(variant, best[variant], seed)] = {
                "name": run_name(variant, best[variant], seed), "variant": variant, "lr": best[variant],
                "seed": seed, "knob": None, "seconds": 60.0, "curves": {family.val_metric: curve},
                "summary": {"metrics": {family.test_metric: v / family.scale, family.val_metric: v / family.scale}}}
    return {"best": {v: {"lr": lr} for v, lr in best.items()}, "runs": runs}


def test_headline_applies_one_holm_over_every_cell(tmp_path):
    best = {"softmax": 2e-3, "diff": 1e-3, "diff_v2_matched": 2e-3}
    mqar = _record("mqar", best, {"softmax": [50, 51, 52, 53, 54, 55, 56, 57], "diff": [60, 61, 62, 63, 64, 65, 66, 67],
                                  "diff_v2_matched": [50.5, 51.5, 52.5, 53.5, 54.5, 55.5, 56.5, 57.5]})
    lm = _record("lm", best, {"softmax": [1.40, 1.41, 1.42, 1.43, 1.44, 1.45, 1.46, 1.47],
                              "diff": [1.50, 1.51, 1.52, 1.53, 1.54, 1.55, 1.56, 1.57],
                              "diff_v2_matched": [1.39, 1.40, 1.41, 1.42, 1.45, 1.46, 1.47, 1.48]})
    cluttered = _record("cluttered", best, {"softmax": [50, 51, 52], "diff": [60, 61, 62]})  # 3 of 8 seeds so far
    (tmp_path / "mqar.json").write_text(json.dumps(mqar))
    (tmp_path / "lm.json").write_text(json.dumps(lm))
    (tmp_path / "cluttered.json").write_text(json.dumps(cluttered))
    (tmp_path / "lm-2k.json").write_text(json.dumps(lm))  # the LM at its earlier budget: not in the family
    cells = [c for c in plan.CELLS if c.name in ("mqar", "lm", "vit", "cluttered", "lm-2k")]
    result = plan.headline(tmp_path, cells)
    assert result["cells"]["vit"] is None and result["comparisons"] == 4  # a cell half-way compares nothing
    assert result["earlier"] == ["lm-2k"] and result["comparisons_earlier"] == 2
    earlier = [r for r in result["cells"]["lm-2k"]["rows"] if "vs" in r]  # a Holm of its own, over its 2 rows
    assert [r["p_holm_study"] for r in earlier] == pytest.approx(holm([r["vs"]["p_perm"] for r in earlier]))
    rows = [r for c in ("mqar", "lm") for r in result["cells"][c]["rows"] if "vs" in r]
    assert [r["p_holm_study"] for r in rows] == pytest.approx(holm([r["vs"]["p_perm"] for r in rows]))
    # Holm over 4 comparisons is stricter than Holm within one table of 2
    assert min(r["p_holm_study"] for r in rows) == pytest.approx(4 * min(r["vs"]["p_perm"] for r in rows))
    table = plan.headline_table(result)
    assert "| vit | not run yet |" in table and "+10.00 [" in table and "+0.100 [" in table
    assert "lm-2k" not in table and "| lm-2k (test/loss) |" in plan.headline_table(result, earlier=True)
    block = plan.earlier_block(result)
    assert block.startswith(plan.EARLIER_TITLE) and "\n\n2 comparisons; p Holm here" in block
    # the cells one task change replaced are named in one sentence, the replacing cell and its arguments once
    changed = {**result, "task_changed": {"clip-40ep": ("clip", ["--x", "1"], []), "clip-80ep": ("clip", ["--x", "1"], []),
                                          "cluttered-30ep": ("cluttered", ["--data.k", "2"], []),
                                          "speech-noisy": ("speech-0db", ["--y", "0"], ["--y", "-10"])},
               "replaced_by": {"speech-noisy": "speech-0db"}}
    block = plan.earlier_block(changed)
    assert ("`clip` also changed the task (it trains with `--x 1`, `clip-40ep` and `clip-80ep` did not); "
            "`cluttered` also changed the task (it trains with `--data.k 2`, `cluttered-30ep` did not); "
            "`speech-0db` also changed the task (it trains with `--y 0`, `speech-noisy` with `--y -10`)") in block
    assert block.count("`clip` also changed") == 1
    # a row replaced by a cell that does not carry the task's name says which
    assert "the row above with the task's name replaced it, `speech-noisy`'s the row `speech-0db`; `clip`" in block
    assert "| 24, 0.4 | `python -m recipes.study run --cells lm` |" in table  # each row: its runs, hours, command
    assert "| cluttered | running: 6 runs recorded, 6 of 24 main final runs |" in table
    assert all(p["flat"] for r in rows for p in r["plateau"])


def test_report_counts_the_needle_seeds_that_retrieve_once_a_variant_has_its_final_seeds(tmp_path):
    best = {"softmax": 2e-3, "diff": 1e-3, "diff_v2_matched": 2e-3}
    finals = {"softmax": [95, 96, 24, 97, 25, 98, 94, 95], "diff": [25, 24, 96, 10, 25, 26, 24, 25],
              "diff_v2_matched": [96, 97]}  # V2: 2 of 8 final seeds so far, not shown
    (tmp_path / "needle.json").write_text(json.dumps(_record("needle", best, finals)))
    cells = [c for c in plan.CELLS if c.name in ("needle", "needle-2x", "vit")]
    text = plan.report_markdown(tmp_path, cells, plan.headline(tmp_path, cells), tmp_path)
    assert text.count("### How many final seeds learn the task") == 1 and "(`needle`)" in text
    assert "| softmax | 6 of 8 | 95.0, 96.0, 24.0, 97.0, 25.0, 98.0, 94.0, 95.0 | reference |" in text
    assert f"| diff | 1 of 8 | 25.0, 24.0, 96.0, 10.0, 25.0, 26.0, 24.0, 25.0 | {plan.fmt_p(fisher_exact(1, 8, 6, 8))} |" in text
    assert "| diff_v2_matched |" not in text.split("### How many final seeds")[1]
    (tmp_path / "needle.json").unlink()
    empty = plan.report_markdown(tmp_path, cells, plan.headline(tmp_path, cells), tmp_path)
    assert "How many final seeds" not in empty  # no final runs: no section


def test_gap_table_pairs_the_cells_of_one_task_at_each_budget(tmp_path):
    best = {"softmax": 2e-3, "diff": 1e-3, "diff_v2_matched": 2e-3}
    soft = [90.0, 90.5, 91.0, 91.5, 92.0, 92.5, 93.0, 93.5]
    short = _record("vit", best, {"softmax": soft, "diff": [x - 2.0 for x in soft], "diff_v2_matched": soft})
    long = _record("vit", best, {"softmax": soft, "diff": [x - 0.5 for x in soft], "diff_v2_matched": soft})
    (tmp_path / "vit-40ep.json").write_text(json.dumps(short))
    (tmp_path / "vit.json").write_text(json.dumps(long))
    (tmp_path / "lm.json").write_text(json.dumps(_record("lm", best, {v: [1.4, 1.5, 1.6] for v in best})))
    (tmp_path / "clip-40ep.json").write_text(json.dumps(short))  # one budget of a task: no pair, no row
    cells = [c for c in plan.CELLS if c.name in ("vit", "vit-40ep", "lm", "lm-2k", "clip-40ep", "vit-l")]
    rows = plan.gap_by_budget(plan.headline(tmp_path, cells), cells)
    assert [(r["cell"], r["budget"]) for r in rows] == [("vit-40ep", "40 epochs"), ("vit", "80 epochs")]
    assert [r["vs"]["diff"]["diff"] for r in rows] == pytest.approx([-2.0, -0.5])
    table = plan.gap_table(rows)
    assert "| vit (test/top1) | vit-40ep | 40 epochs | -2.00 [" in table and "| vit | 80 epochs | -0.50 [" in table
    assert [plan.budget_words(c) for c in plan.CELLS if c.name in ("lm", "lm-2k")] == ["4,000 steps", "2,000 steps"]


def test_noise_gaps_compare_the_gap_at_a_fixed_noise_with_the_tasks_own(tmp_path):
    best = {"softmax": 2e-3, "diff": 2e-3, "diff_v2_matched": 8e-3}
    soft = [50.0, 51.5, 49.0, 53.0, 52.5, 48.0, 50.5, 51.0]
    noisy_v1 = [x - 4.0 + 0.5 * (i % 3) for i, x in enumerate(soft)]
    cells = [c for c in plan.CELLS if c.name in ("speech-320ep", "speech-noisy")]
    # the task's cell with no spread: the change's interval, df and p are Welch's between the noisy cell's groups
    (tmp_path / "speech-320ep.json").write_text(json.dumps(_record("speech", best, {
        "softmax": [90.0] * 8, "diff": [89.0] * 8, "diff_v2_matched": [90.5] * 8})))
    (tmp_path / "speech-noisy.json").write_text(json.dumps(_record("speech", best, {"softmax": soft, "diff": noisy_v1})))
    [row] = plan.noise_gaps(tmp_path, cells)
    w = welch(noisy_v1, soft)
    assert (row["cell"], row["clean"], row["variant"], row["n"]) == ("speech-noisy", "speech-320ep", "diff", [8, 8, 8, 8])
    assert row["change"]["diff"] == pytest.approx(w["diff"] + 1.0)
    assert row["change"]["ci_low"] == pytest.approx(w["ci_low"] + 1.0)
    assert row["change"]["p"] == pytest.approx(2 * scipy_stats.t.sf(abs(w["diff"] + 1.0) / (w["diff"] / w["t"]), w["df"]))
    assert row["change"]["df"] == pytest.approx(w["df"]) and row["gap_clean"]["diff"] == pytest.approx(-1.0)
    # both cells spread: the standard error adds the four groups' variances of the mean
    clean_soft = [90.0, 91.0, 89.5, 92.0, 90.5, 88.0, 91.5, 90.0]
    (tmp_path / "speech-320ep.json").write_text(json.dumps(_record("speech", best, {
        "softmax": clean_soft, "diff": [x - 1.0 for x in reversed(clean_soft)], "diff_v2_matched": clean_soft})))
    [row] = plan.noise_gaps(tmp_path, cells)
    se = math.sqrt(sum(statistics.variance(g) / 8 for g in (soft, noisy_v1, clean_soft, clean_soft)))
    half = row["change"]["ci_high"] - row["change"]["diff"]
    assert row["change"]["diff"] == pytest.approx(w["diff"] + 1.0) and 2.0 * se < half < 2.1 * se  # t(0.975, ~28)
    text = plan.report_markdown(tmp_path, cells, plan.headline(tmp_path, cells), tmp_path)
    assert "### Does the gap change with noise?" in text and "| speech (test/top1) | diff - softmax | speech-320ep (320 epochs): -1.00 [" in text
    assert "| speech-noisy (320 epochs): -3.56 [" in text  # each cell with its budget
    # a variant half-way through its final seeds at the fixed noise: no row, no section
    (tmp_path / "speech-noisy.json").write_text(json.dumps(_record("speech", best, {"softmax": soft, "diff": soft[:5]})))
    assert plan.noise_gaps(tmp_path, cells) == []
    assert "### Does the gap change" not in plan.report_markdown(tmp_path, cells, plan.headline(tmp_path, cells), tmp_path)
    # the 320-epoch 0 dB cell paired with the task's final cell, each at its own budget, as the table says
    cells = [c for c in plan.CELLS if c.name in ("speech", "speech-0db-320ep")]
    (tmp_path / "speech.json").write_text(json.dumps(_record("speech", best, {
        "softmax": clean_soft, "diff": [x - 1.0 for x in reversed(clean_soft)], "diff_v2_matched": clean_soft})))
    (tmp_path / "speech-0db-320ep.json").write_text(json.dumps(_record("speech", best, {"softmax": soft, "diff": noisy_v1})))
    with pytest.MonkeyPatch.context() as mp:  # as it did before the 0 dB budget became 640 epochs
        mp.setitem(plan.NOISY_OF, "speech-0db-320ep", "speech")
        [row] = plan.noise_gaps(tmp_path, cells)
    assert (row["cell"], row["clean"], row["budget_noisy"], row["budget_clean"]) == ("speech-0db-320ep", "speech",
                                                                                   "320 epochs", "640 epochs")
    assert row["change"]["diff"] == pytest.approx(w["diff"] + 1.0)
    table = plan.noise_table([row])
    assert "| speech (640 epochs): -1.00 [" in table and "| speech-0db-320ep (320 epochs): -3.56 [" in table


def test_status_says_how_long_a_started_cell_has_left(tmp_path):
    cell = plan.cell_named("clip")
    runs = {f"softmax_lr0.001_seed{i}": {"name": f"softmax_lr0.001_seed{i}", "variant": "softmax", "lr": 1e-3,
                                          "seed": i, "seconds": 360.0} for i in range(9)}
    (tmp_path / "clip.json").write_text(json.dumps({"runs": runs}))
    line, total = plan.status_lines(tmp_path, [cell])
    left = plan.planned_runs(cell) - 9
    each = plan.planned_runs(cell) // 3
    # only softmax has run and no other clip cell is recorded: V1 and V2 are timed by softmax's runs, and say so
    assert f"0.90 CPU-thread hours, about {left * 0.1:.1f} hours left ({left} runs: softmax {each - 9} x 6.0 min, " \
           f"diff {each} x 6.0 min, diff_v2_matched {each} x 6.0 min; diff, diff_v2_matched timed from other " \
           "runs)" in line
    assert total == f"left in all: about {left * 0.1:.1f} CPU-thread hours (about {left * 0.05:.1f} hours of wall " \
                    "time at --jobs 2 on 2 cores)"
    (tmp_path / "clip.json").write_text(json.dumps({"runs": runs, "quick": True}))
    assert plan.status_lines(tmp_path, [cell]) == [plan.status_lines(tmp_path, [cell])[0]]  # nothing said of the rest
    assert "left" not in plan.status_lines(tmp_path, [cell])[0]  # a quick run's records say nothing of the full cell
    # a grid extended at an edge (one more lr for V1): 3 more grid runs planned, and counted in what is left
    grown = {v: list(cell.lrs) for v in cell.variants}
    grown["diff"].append(2 * cell.lrs[-1])
    (tmp_path / "clip.json").write_text(json.dumps({"runs": runs, "grid_lrs": grown}))
    assert plan.planned_runs(cell, {"grid_lrs": grown}) == plan.planned_runs(cell) + 3 == 72
    assert "(planned about 72 runs)" in plan.status_lines(tmp_path, [cell])[0]
    assert f"({72 - 9} runs: softmax {each - 9} x 6.0 min, diff {each + 3} x 6.0 min" in plan.status_lines(tmp_path, [cell])[0]


def test_status_estimates_the_final_runs_left_per_variant(tmp_path):
    """With every variant's lr chosen, what is left is final seeds of known variants: each is timed by its own
    variant's final runs (the latest, on the machine as it is now), else by its grid runs, not by the cell's mean."""
    cell = plan.cell_named("speech")
    runs = {}
    for v, grid_secs, final_secs, finals in (("softmax", 600.0, 700.0, cell.final_seeds),
                                            ("diff", 900.0, 1200.0, cell.final_seeds - 3),
                                            ("diff_v2_matched", 1500.0, None, 0)):
        for i in range(3):
            runs[f"{v}_grid{i}"] = {"variant": v, "lr": 1e-3, "seed": i, "seconds": grid_secs}
        for i in range(finals):
            runs[f"{v}_final{i}"] = {"variant": v, "lr": 2e-3, "seed": plan.FINAL_SEED + i, "seconds": final_secs}
    best = {v: {"lr": 2e-3} for v in cell.variants}
    (tmp_path / "speech.json").write_text(json.dumps({"runs": runs, "best": best}))
    line, total = plan.status_lines(tmp_path, [cell])
    hours = (3 * 1200 + cell.final_seeds * 1500) / 3600
    assert f"about {hours:.1f} hours left ({3 + cell.final_seeds} final runs: diff 3 x 20.0 min, " \
           f"diff_v2_matched {cell.final_seeds} x 25.0 min so far)" in line
    assert total.startswith(f"left in all: about {hours:.1f} CPU-thread hours")
    del best["diff_v2_matched"]  # a variant's grid still open: each variant timed by all its runs so far
    (tmp_path / "speech.json").write_text(json.dumps({"runs": runs, "best": best}))
    assert "softmax 12 x 11.2 min, diff 15 x 18.1 min, diff_v2_matched 20 x 25.0 min so far)" in plan.status_lines(tmp_path, [cell])[0]


def test_status_estimates_an_unstarted_cell_from_one_of_the_same_size(tmp_path):
    """An unstarted cell takes its time per run from a cell of the same family and size, scaled by the epochs; a
    model size with no runs anywhere gets no estimate, and the total says so."""
    cells = {c.name: c for c in plan.CELLS}
    runs = {f"softmax_lr0.001_seed{i}": {"variant": "softmax", "lr": 1e-3, "seed": i, "seconds": 120.0}
            for i in range(3)}
    (tmp_path / "vit-40ep.json").write_text(json.dumps({"runs": runs}))  # 40 epochs, 2 min a run
    wanted = [cells[n] for n in ("vit", "vit-2x", "vit-l")]
    vit, check, big, total = plan.status_lines(tmp_path, wanted)
    assert plan.cell_epochs(cells["vit"]) == 80 and plan.cell_epochs(cells["vit-2x"]) == 160
    assert "about 9.2 hours left (138 runs: softmax 23 x 4.0 min, diff 23 x 4.0 min" in vit
    assert "(planned about 3 runs)" in check and "about 0.4 hours left (3 runs: softmax 1 x 8.0 min" in check
    assert "left" not in big  # vit-l's model size has no runs yet
    assert total == ("left in all: about 9.6 CPU-thread hours (about 4.8 hours of wall time at --jobs 2 on 2 cores); "
                     "no estimate yet for vit-l")
    # of two cells of that size, the one whose budget is nearest: vit-2x (160 epochs) is estimated from vit-40ep-2x
    # (80 epochs, 5 min a run: 10 min at 160), not from vit-40ep (2 min at 40: 8 min)
    (tmp_path / "vit-40ep-2x.json").write_text(json.dumps({"runs": {k: {**r, "seconds": 300.0} for k, r in runs.items()}}))
    assert "(3 runs: softmax 1 x 10.0 min, diff 1 x 10.0 min, diff_v2_matched 1 x 10.0 min; softmax, diff, " \
           "diff_v2_matched timed from other runs)" in plan.status_lines(tmp_path, [cells["vit-2x"]])[0]


def test_status_times_a_variant_not_run_yet_by_its_ratio_to_one_that_has(tmp_path):
    """vit-l has only softmax runs (30 min): V1 is timed by its ratio to softmax in the vit cell (twice as long
    there), V2, which no vit cell ran, by the mean of those two; ``--finish-by`` gets the cell's longest runs
    instead, times the same ratio of the means (a longest run is one slow session, no measure of the variant)."""
    cells = {c.name: c for c in plan.CELLS}
    small = {f"{v}_lr0.001_seed{i}": {"variant": v, "lr": 1e-3, "seed": i, "seconds": secs + 60 * i}
             for v, secs in (("softmax", 180.0), ("diff", 420.0)) for i in range(3)}  # means 4 and 8 min
    (tmp_path / "vit.json").write_text(json.dumps({"runs": small}))
    big = {f"softmax_lr0.001_seed{i}": {"variant": "softmax", "lr": 1e-3, "seed": i, "seconds": 1800.0 + 600 * i}
           for i in range(2)}  # mean 35 min, longest 40
    (tmp_path / "vit-l.json").write_text(json.dumps({"runs": big}))
    each = plan.planned_runs(cells["vit-l"]) // 3
    line = plan.status_lines(tmp_path, [cells["vit-l"]])[0]
    assert f"softmax {each - 2} x 35.0 min, diff {each} x 70.0 min, diff_v2_matched " \
           f"{each} x 52.5 min; diff, diff_v2_matched timed from other runs)" in line
    longest = plan._variant_seconds(tmp_path, cells["vit-l"], longest=True)  # vit's longest: 5 and 9 min
    assert longest == pytest.approx({"softmax": 2400.0, "diff": 2400.0 * 2, "diff_v2_matched": (2400.0 + 4800.0) / 2})


def test_a_cell_with_runs_times_its_other_variants_by_its_own_runs_and_the_median_ratio(tmp_path):
    """vit-2x ran only softmax (10 min a run). Its same-size cell vit ran V1 on a slow day (30 min at half the
    epochs): scaled by the epochs that says 60 min. Its own softmax runs times the median V1/softmax ratio of
    the family's cells (2, 1.5 and 1.3 in vit, vit-40ep and vit-l) say 15 min, which is what it gets."""
    cells = {c.name: c for c in plan.CELLS}

    def write(name, secs):
        runs = {f"{v}_lr0.001_seed{i}": {"variant": v, "lr": 1e-3, "seed": i, "seconds": s}
                for v, s in secs.items() for i in range(2)}
        (tmp_path / f"{name}.json").write_text(json.dumps({"runs": runs}))

    write("vit", {"softmax": 900.0, "diff": 1800.0})
    write("vit-40ep", {"softmax": 100.0, "diff": 150.0})
    write("vit-l", {"softmax": 100.0, "diff": 130.0})
    write("vit-2x", {"softmax": 600.0})
    assert plan._variant_seconds(tmp_path, cells["vit-2x"]) == pytest.approx(
        {"softmax": 600.0, "diff": 900.0, "diff_v2_matched": 750.0})
    (tmp_path / "vit-2x.json").unlink()  # no runs of its own: all from vit, scaled by the epochs
    assert plan._variant_seconds(tmp_path, cells["vit-2x"]) == pytest.approx(
        {"softmax": 1800.0, "diff": 3600.0, "diff_v2_matched": 2700.0})


def test_the_study_pipeline_runs_resumes_and_reports(tmp_path, capsys):
    records = tmp_path / "records"
    plan.main(["run", "--quick", "--cells", "mqar", "mqar-2x", "--jobs", "2", "--records", str(records)])
    check = json.loads((records / "mqar-2x.json").read_text())  # seed 0 of both variants at their best lrs
    assert sorted(check["runs"]) == sorted(run_name(v, b["lr"], 0) for v, b in check["best"].items())
    saved = json.loads((records / "mqar.json").read_text())
    assert {v: b["lr"] for v, b in check["best"].items()} == {v: b["lr"] for v, b in saved["best"].items()}
    assert len(saved["runs"]) == 6 and saved["quick"]  # 2 variants x (1 grid + 2 final seeds)
    # the trainings log beside these records, never in the study's own run folders
    assert {p.name for p in (records / "runs" / "mqar" / "runs").iterdir() if p.is_dir()} >= set(saved["runs"])
    assert plan.run_folder(plan.CELLS[0], plan.RECORDS) == Path("outputs/study") / plan.CELLS[0].name
    grid = [r for r in saved["runs"].values() if r["seed"] < sweep.FINAL_SEED]
    final = [r for r in saved["runs"].values() if r["seed"] >= sweep.FINAL_SEED]
    assert all("test/acc" not in r["summary"]["metrics"] for r in grid)  # the grid never scores the test set
    assert all("test/acc" in r["summary"]["metrics"] for r in final)
    capsys.readouterr()
    plan.main(["status", "--cells", "mqar", "--records", str(records)])
    assert "grid   2, final   4" in capsys.readouterr().out
    plan.main(["status", "--cells", "lm", "mqar", "--records", str(records)])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["lm", "mqar"]  # the order given
    assert lines[2:] == ["left in all: no estimate yet for lm"]  # no lm run anywhere; a quick run estimates nothing
    plan.main(["report", "--cells", "mqar", "mqar-2x", "--records", str(records)])
    assert "| mqar (test/acc) |" in (records / "table.md").read_text()
    assert (records / "mqar_curves.png").stat().st_size > 1000  # validation metric and gradient norm
    assert (records / "mqar_grid.png").stat().st_size > 1000  # validation metric against the lr
    table = (records / "table.md").read_text()
    assert "](headline.png)" in table and "### Budget check" in table and "| mqar | softmax |" in table
    assert "### Ablations" not in table  # the quick pipeline trains no ablation
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text(f"# Results\n\n{plan.PAGE_START}\n{plan.PAGE_END}\n\nprose\n")
    plan.main(["report", "--records", str(records), "--page", str(page)])
    assert "](../records/headline.png)" in page.read_text()  # the page links the plots from where it is
    assert "| mqar (test/acc) |" in plan.page_table(page) and page.read_text().endswith("\nprose\n")
    with pytest.raises(SystemExit):
        plan.main(["run", "--quick", "--cells", "mqar"])  # smoke records never go into the study's folder


def test_size_trend_centres_each_variant_on_the_neighbour_and_interpolates_parameters(tmp_path):
    xs = plan.cell_named("vit-xs")
    with pytest.raises(SystemExit, match="run that cell first"):
        plan.cell_sweeps(xs, tmp_path, 2, False, False)
    best = {"softmax": 4e-3, "diff": 1e-3, "diff_v2_matched": 2e-3}
    sizes = {"vit-xs": (40_000, {"softmax": 80.0, "diff": 78.0, "diff_v2_matched": 79.0}),
             "vit": (300_000, {"softmax": 90.0, "diff": 86.0, "diff_v2_matched": 89.0}),
             "vit-l": (1_800_000, {"softmax": 95.0, "diff": 92.0, "diff_v2_matched": 94.0})}
    for name, (params, means) in sizes.items():
        seeds = plan.cell_named(name).final_seeds
        rec = _record("vit", best, {v: [m - 0.5, m + 0.5] * (seeds // 2) + [m] * (seeds % 2) for v, m in means.items()})
        for r in rec["runs"].values():
            r["summary"]["parameters"] = params
        (tmp_path / f"{name}.json").write_text(json.dumps(rec))
    sweeps = plan.cell_sweeps(xs, tmp_path, 2, False, False)
    assert [a[a.index("--variants") + 1] for a in sweeps] == list(plan.MAIN)  # one sweep per variant
    diff = sweeps[1]
    assert diff[diff.index("--lrs") + 1:diff.index("--lrs") + 4] == ["0.0005", "0.001", "0.002"]
    assert diff[-2:] == list(xs.size_args) and diff[diff.index("--final-seeds") + 1] == "5"
    assert "--epochs" not in diff  # the family's budget
    assert diff[diff.index("--extend") + 1] == "4"  # a size's best lr may lie several steps from its neighbour's
    half = plan.cell_sweeps(plan.cell_named("vit-40ep"), tmp_path, 2, False, False)[0]
    assert half[half.index("--epochs") + 1] == "40"  # a cell with a budget of its own
    (tmp_path / "vit-40ep.json").write_text((tmp_path / "vit.json").read_text())
    check = plan.cell_sweeps(plan.cell_named("vit-40ep-2x"), tmp_path, 2, False, False)[0]
    assert check[check.index("--epochs") + 1] == "80"  # its check doubles the cell's budget, not the family's
    trend = plan.size_trend(tmp_path, plan.CELLS)
    assert set(trend) == {"vit"} and len(trend["vit"]) == 9  # three sizes x three variants
    # softmax's 90.0 at 300 k: V1 reaches it between 300 k (86) and 1.8 M (92), two thirds of the way in log
    need = plan.parameters_for(trend["vit"], "diff", 90.0, True)
    assert need == pytest.approx(math.exp(math.log(3e5) + 2 / 3 * math.log(6)))
    assert plan.parameters_for(trend["vit"], "diff", 99.0, True) is None  # beyond the largest size
    table = plan.size_table(trend)
    assert "| vit-l | 1,800,000 | 95.00 ± 0.50 (n=5) |" in table and "outside the sizes run" in table
    plan.plot_size_trend(trend, tmp_path / "trend.png")
    assert (tmp_path / "trend.png").stat().st_size > 1000
    # a size whose budget proved too short (lm-xs, then lm-xs-8k) gives way to the cell that replaced it, once
    # that cell has its final runs
    assert plan.cell_named("lm-xs").superseded_by == "lm-xs-8k"
    assert plan.cell_named("lm-xs-8k").superseded_by == "lm-xs-16k"
    for name, loss in (("lm", 1.2), ("lm-xs", 1.4), ("lm-xs-8k", 1.3)):
        (tmp_path / f"{name}.json").write_text(json.dumps(_record("lm", best, {v: [loss] * 8 for v in best})))
    lm = plan.size_trend(tmp_path, plan.CELLS)["lm"]  # lm-xs-16k has no runs yet: lm-xs-8k stands for the size
    assert {p["cell"] for p in lm} == {"lm", "lm-xs-8k"} and {p["mean"] for p in lm} == {1.2, 1.3}
    half = _record("lm", best, {"softmax": [1.25] * 8, "diff": [1.25] * 8})  # V2's final runs missing
    (tmp_path / "lm-xs-16k.json").write_text(json.dumps(half))
    assert {p["cell"] for p in plan.size_trend(tmp_path, plan.CELLS)["lm"]} == {"lm", "lm-xs-8k"}
    (tmp_path / "lm-xs-16k.json").write_text(json.dumps(_record("lm", best, {v: [1.25] * 8 for v in best})))
    lm = plan.size_trend(tmp_path, plan.CELLS)["lm"]
    assert {p["cell"] for p in lm} == {"lm", "lm-xs-16k"} and {p["mean"] for p in lm} == {1.2, 1.25}


def test_clip_reports_retrieval_and_zero_shot_from_the_same_final_runs(tmp_path):
    best = {"softmax": 2e-3, "diff": 1e-3, "diff_v2_matched": 2e-3}
    rec = _record("clip", best, {"softmax": [60, 61, 62] * 3, "diff": [63, 64, 65] * 3,
                                 "diff_v2_matched": [59, 60, 61] * 3})
    for r in rec["runs"].values():  # zero-shot top-1 of the same runs: 3 % for every run
        r["summary"]["metrics"]["test/zs_top1"] = 0.03
    (tmp_path / "clip.json").write_text(json.dumps(rec))
    result = plan.headline(tmp_path, [c for c in plan.CELLS if c.name == "clip"])
    assert set(result["cells"]) == {"clip", "clip (test/zs_top1)"} and result["comparisons"] == 4
    assert result["cells"]["clip"]["metric"] == "test/mean_recall"
    zs = {r["variant"]: r for r in result["cells"]["clip (test/zs_top1)"]["rows"]}
    assert zs["diff"]["mean"] == pytest.approx(3.0) and zs["diff"]["vs"]["diff"] == pytest.approx(0.0)
    rows = [line.split(" | ")[0] for line in plan.headline_table(result).splitlines()[2:]]
    assert rows == ["| clip (test/mean_recall)", "| clip (test/zs_top1)"]  # each metric named once


def test_budget_check_trains_seed_0_twice_as_long_and_compares_it(tmp_path):
    check = plan.cell_named("mqar-2x")
    best = {"softmax": 4e-3, "diff": 1e-3, "diff_v2_matched": 2e-3}
    src = _record("mqar", best, {v: [90.0] for v in best})
    for v, lr in best.items():  # the grid's seed-0 run at the best lr, with a flat curve
        src["runs"][run_name(v, lr, 0)] = {**src["runs"][run_name(v, lr, sweep.FINAL_SEED)], "seed": 0}
    (tmp_path / "mqar.json").write_text(json.dumps(src))
    (argv,) = plan.cell_sweeps(check, tmp_path, 2, False, False)  # one sweep: both job slots stay busy
    lrs = argv.index("--lrs")
    assert argv[argv.index("--variants") + 1:lrs] == list(plan.MAIN) and "--paired" in argv
    assert argv[lrs + 1:lrs + 4] == ["0.004", "0.001", "0.002"]  # each variant's own best lr, in their order
    assert argv[argv.index("--epochs") + 1] == "20"  # 2 x 10 epochs
    assert all(argv.count(o) == 1 for o in ("--seeds", "--final-seeds", "--extend", "--epochs"))  # each said once
    assert argv[argv.index("--final-seeds") + 1] == "0" and argv[argv.index("--seeds") + 1] == "1"
    assert argv[argv.index("--extend") + 1] == "0"  # one lr per variant, never grown
    longer = _record("mqar", best, {v: [95.0] for v in best})
    longer["runs"] = {run_name(v, lr, 0): {**r, "seed": 0} for (v, lr), r in
                      zip(best.items(), longer["runs"].values())}
    rising = longer["runs"][run_name("diff", 1e-3, 0)]["curves"]["val/acc"]  # V1 still climbing at 2x
    rising[-3:] = [[s, v - 0.05 + 0.025 * i] for i, (s, v) in enumerate(rising[-3:])]
    (tmp_path / "mqar-2x.json").write_text(json.dumps(longer))
    rows = plan.budget_checks(tmp_path, [check])
    assert [r["variant"] for r in rows] == list(plan.MAIN)
    assert all(r["budget"] == pytest.approx(90.0) and r["longer"] == pytest.approx(95.0) for r in rows)
    assert "| mqar | softmax | 0.004 | 0 | val/acc | 90.00 | 2x | 95.00 | +5.00 | yes | yes |" in plan.budget_table(rows)
    assert [r["flat_longer"] for r in rows] == [True, False, True]
    assert "| mqar | diff | 0.001 | 0 | val/acc | 90.00 | 2x | 95.00 | +5.00 | yes | no |" in plan.budget_table(rows)


def test_budget_check_over_several_seeds_pairs_each_seed_with_its_own_grid_run(tmp_path):
    """A check with 3 seeds trains grid seeds 0-2 longer and compares the means over the seeds both cells have,
    each seed against its own run at the budget; a seed not run yet at the longer budget is left out of both."""
    check = dataclasses.replace(plan.cell_named("mqar-2x"), check_seeds=3)
    best = {"softmax": 4e-3, "diff": 1e-3, "diff_v2_matched": 2e-3}

    def run(v: str, seed: int, acc: float, rising: bool = False) -> dict:  # rising: +5 points over the tail
        curve = [[s, (acc - (5 if rising and s < 90 else 0)) / 100] for s in range(10, 110, 10)]
        return {"name": run_name(v, best[v], seed), "variant": v, "lr": best[v], "seed": seed, "knob": None,
                "seconds": 60.0, "curves": {"val/acc": curve}, "summary": {"metrics": {"val/acc": acc / 100}}}

    src = _record("mqar", best, {v: [90.0] for v in best})
    for v in best:  # grid seeds 0-2 at the best lr: 80, 84, 88 %; seed 2 still rising, except softmax's
        src["runs"].update({run_name(v, best[v], s): run(v, s, 80 + 4 * s, s == 2 and v != "softmax")
                            for s in range(3)})
    (tmp_path / "mqar.json").write_text(json.dumps(src))
    (argv,) = plan.cell_sweeps(check, tmp_path, 2, False, False)
    assert argv.count("--seeds") == 1 and argv[argv.index("--seeds") + 1] == "3"
    assert plan.planned_runs(check) == 9
    # longer: every seed 2 points up and flat; softmax's seed 2 not run yet
    longer = {"runs": {run_name(v, best[v], s): run(v, s, 82 + 4 * s) for v in best
                       for s in range(2 if v == "softmax" else 3)}}
    (tmp_path / "mqar-2x.json").write_text(json.dumps(longer))
    assert "done" not in plan.status_lines(tmp_path, [check])[0] and "(1 runs: softmax 1 x" in plan.status_lines(tmp_path, [check])[0]
    rows = {r["variant"]: r for r in plan.budget_checks(tmp_path, [check])}
    assert rows["softmax"]["seeds"] == [0, 1] and rows["diff"]["seeds"] == [0, 1, 2]
    assert rows["softmax"]["budget"] == pytest.approx(82.0) and rows["softmax"]["longer"] == pytest.approx(84.0)
    assert rows["diff"]["budget"] == pytest.approx(84.0) and rows["diff"]["longer"] == pytest.approx(86.0)
    assert (rows["diff"]["flat"], rows["diff"]["flat_n"], rows["diff"]["flat_longer_n"]) == (False, 2, 3)
    table = plan.budget_table(list(rows.values()))
    assert "| mqar | diff | 0.001 | 0, 1, 2 | val/acc | 84.00 | 2x | 86.00 | +2.00 | 2 of 3 | 3 of 3 |" in table
    assert "| mqar | softmax | 0.004 | 0, 1 | val/acc | 82.00 | 2x | 84.00 | +2.00 | 2 of 2 | 2 of 2 |" in table


def _records(name: str) -> dict:
    """The records in the repository of the study's cell ``name``."""
    root = Path(__file__).resolve().parents[1]
    return plan.load(root / plan.RECORDS, plan.cell_named(name))


def _final_losses(name: str, variants: tuple[str, ...] = plan.MAIN) -> dict[str, list[float]]:
    """Test loss of each variant's final seeds in cell ``name``'s records in the repository."""
    runs = _records(name)["runs"].values()
    return {v: [r["summary"]["metrics"]["test/loss"] for r in runs if r["seed"] >= plan.FINAL_SEED and r["variant"] == v]
            for v in variants}


def _check_rows(name: str) -> dict[str, dict]:
    """The study's budget check ``name`` as the report gives it (its rows by variant), from the records in the
    repository."""
    root = Path(__file__).resolve().parents[1]
    return {r["variant"]: r for r in plan.budget_checks(root / plan.RECORDS, [c for c in plan.CELLS if c.name == name])}


def _speech_0db() -> tuple[dict, list[dict], dict[str, list[float]], dict[str, dict], bool]:
    """The 0 dB cell at 320 epochs (`speech-0db-320ep`) from the records in the repository: V1's test voices
    bootstrap against softmax, the final runs' records, each variant's final test top-1 (%), its 640-epoch check's
    rows (`speech-0db-320ep-2x`, by variant) and whether that check has all its runs."""
    root = Path(__file__).resolve().parents[1]
    boot = next(r for r in plan.cell_voice_stats(root / plan.RECORDS, plan.cell_named("speech-0db-320ep"))["rows"]
                if r["variant"] == "diff")["bootstrap"]
    finals = [r for r in _records("speech-0db-320ep")["runs"].values() if r["seed"] >= plan.FINAL_SEED]
    top1 = {v: [100 * r["summary"]["metrics"]["test/top1"] for r in finals if r["variant"] == v]
            for v in ("softmax", "diff")}
    check = _check_rows("speech-0db-320ep-2x")
    done = set(check) == {"softmax", "diff"} and all(r["seeds"] == [0, 1, 2] for r in check.values())
    return boot, finals, top1, check, done


def _check_per_seed(name: str) -> dict[str, list[tuple[float, float]]]:
    """The budget check ``name``'s (budget, longer) validation values of each seed in, by variant, recovered from
    the report's means over seeds below 1, 2, ... (the report pairs each seed with its own shorter run)."""
    root = Path(__file__).resolve().parents[1]
    cell = plan.cell_named(name)
    out: dict[str, list[tuple[float, float]]] = {}
    for n in range(1, cell.check_seeds + 1):
        for r in plan.budget_checks(root / plan.RECORDS, [dataclasses.replace(cell, check_seeds=n)]):
            got = out.setdefault(r["variant"], [])
            k = len(r["seeds"])
            if k > len(got):  # seed n - 1 is in: its values are k times the mean less the earlier seeds'
                got.append((k * r["budget"] - sum(g[0] for g in got), k * r["longer"] - sum(g[1] for g in got)))
    return out


def test_results_page_quotes_the_finished_cells_from_their_records():
    """Every finished cell's row on docs/results.md is recomputed here from the records in the repository."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "results.md").read_text()
    # the prose below the generated table, as words whatever its line breaks (the table repeats the means)
    page = " ".join(text.split("<!-- study-table: end -->", 1)[1].split())
    # the cells the page's prose quotes: digits of its means (None: not quoted) and of its differences
    quoted = {"vit-40ep": (2, 2), "vit": (2, 2), "cluttered-30ep": (2, 2), "speech-40ep": (2, 2), "speech-80ep": (2, 2), "mqar": (None, 1), "lm-2k": (3, 3), "lm": (3, 3), "clip-40ep": (2, 2),
              "clip-40ep (test/zs_top1)": (2, 2), "clip-80ep": (2, 2), "clip-80ep (test/zs_top1)": (2, 2),
              "clip": (2, 2), "clip (test/zs_top1)": (2, 2), "cluttered-120ep": (2, 2),
              "cluttered": (2, 2), "speech-160ep": (2, 2), "speech-320ep": (2, 2), "speech-0db-320ep": (2, 2)}
    result = plan.headline(root / plan.RECORDS, plan.CELLS)  # the whole study: its Holm is what the page says
    for name, (mean_digits, digits) in quoted.items():
        cell = result["cells"][name]
        assert cell is not None, f"the {name} cell's records lost their final runs"
        for r in cell["rows"]:
            if mean_digits is not None:
                assert f"{r['mean']:.{mean_digits}f} ± {r['sd']:.{mean_digits}f}" in page, (name, r["variant"])
            if "vs" in r:
                c = r["vs"]
                ci = f"{c['diff']:+.{digits}f} [{c['ci_low']:+.{digits}f}, {c['ci_high']:+.{digits}f}]"
                assert ci in page, (name, r["variant"], ci)
                p = c["p_perm"]
                assert (f"p {p:.3f}" if p >= 1e-3 else f"p {p:.1e}") in page, (name, r["variant"])
    # cluttered digits at 120 epochs: V1's deficit survives the earlier budgets' Holm, as the page says, and V2's
    # interval spans zero
    clut = {r["variant"]: r for r in result["cells"]["cluttered-120ep"]["rows"]}
    holm = clut["diff"]["p_holm_study"]
    assert holm < 0.05 and f"significant after Holm's correction over the earlier-budget rows ({holm:.3f};" in page
    v2 = clut["diff_v2_matched"]["vs"]
    assert v2["ci_low"] < 0 < v2["ci_high"]  # "no difference found"
    # the ablations of the decoder (MQAR) and the encoder (ViT digits) against the variant each one changes, as
    # the prose quotes them; their study Holm lives in the generated table (it rises as the family grows), and
    # the prose's reading of it holds: all three of MQAR's survive it, none of the ViT's
    for name, d in (("mqar", 1), ("vit", 2)):
        ablations = result["cells"][name]["ablations"]
        assert len(ablations) == 3  # finished: they may not vanish from the records
        for a in ablations:
            c = a["vs"]
            quote = f"{c['diff']:+.{d}f} [{c['ci_low']:+.{d}f}, {c['ci_high']:+.{d}f}]"
            quote += f", p {c['p_perm']:.3f}" if c["p_perm"] >= 1e-3 else f", p {c['p_perm']:.1e}"
            assert quote in page, (name, a["variant"], a["parent"], quote)
            assert (a["p_holm_study"] < 0.05) == (name == "mqar"), (name, a["variant"], a["p_holm_study"])
    vit_const = next(r for r in result["cells"]["vit"]["rows"]
                     if r.get("kind") == "ablation vs softmax" and r["variant"] == "diff_const")
    assert vit_const["vs"]["p_perm"] < 0.05 <= vit_const["p_holm_study"]  # "p 0.006, which does not survive"
    def budget_check(name: str, digits: int) -> tuple[dict, str]:
        """A budget check's rows by variant, and the page's phrase of each variant's change at twice the budget."""
        rows = _check_rows(name)
        assert len(rows) == 3, name
        ch = {v: f"{r['longer'] - r['budget']:+.{digits}f}" for v, r in rows.items()}
        return rows, f"{ch['softmax']} (softmax), {ch['diff']} (V1) and {ch['diff_v2_matched']} (V2)"

    # the LM's budget checks: the change of each variant's validation loss at twice the steps
    for check, worse in (("lm-2k-2x", None), ("lm-2x", True)):
        rows, phrase = budget_check(check, 3)
        assert phrase in page, (check, phrase)
        assert worse is None or all(r["longer"] > r["budget"] for r in rows.values())  # "made validation loss worse"
    # CLIP's budget check: the gain of each variant's validation mean recall at twice the epochs
    rows, phrase = budget_check("clip-40ep-2x", 2)
    assert all(r["flat_longer"] for r in rows.values())  # "all three 80-epoch curves were flat"
    assert f"{phrase} points" in page, phrase
    # speech's 160-epoch check: softmax gains the most at 320, V2 the least; every 320-epoch curve flat by the rule
    rows, phrase = budget_check("speech-160ep-2x", 2)
    assert f"gained {phrase} points" in page, phrase
    gain = {v: r["longer"] - r["budget"] for v, r in rows.items()}
    assert gain["softmax"] > gain["diff"] > gain["diff_v2_matched"] > 0 and all(r["flat_longer"] for r in rows.values())
    assert sum(r["flat"] for r in rows.values()) == 2  # "two of the three 160-epoch ones"
    at_320 = ", ".join(f"{name} {rows[v]['longer']:.2f}" for v, name in sorted(
        (("softmax", "softmax"), ("diff", "V1"), ("diff_v2_matched", "V2")), key=lambda x: -rows[x[0]]["longer"]))
    assert f"(at 320, seed 0: {at_320})" in page, at_320
    # the 240-epoch cluttered cell's check, three seeds per variant: V1 alone gains beyond the rule's 1-point
    # tolerance although its 240-epoch runs all met the rule; its validation gap to softmax shrinks by about a third
    rows, phrase = budget_check("cluttered-2x", 2)
    assert all(r["seeds"] == [0, 1, 2] for r in rows.values())
    assert f"changed validation top-1 by {phrase} points over the three seeds" in page, phrase
    assert [r["longer"] - r["budget"] > 1 for r in rows.values()] == [False, True, False] and rows["diff"]["flat_n"] == 3
    flats = [f"{', '.join(str(rows[v][k]) for v in plan.MAIN[:2])} and {rows['diff_v2_matched'][k]} of 3"
             for k in ("flat_n", "flat_longer_n")]
    assert "(flat by the rule at 240 epochs: {}; at 480: {})".format(*flats) in page, flats
    gaps = {v: [rows[v][k] - rows["softmax"][k] for k in ("budget", "longer")] for v in ("diff", "diff_v2_matched")}
    assert "V1's validation gap to softmax went from {:+.2f} to {:+.2f} points, V2's from {:+.2f} to {:+.2f}".format(
        *gaps["diff"], *gaps["diff_v2_matched"]) in page, gaps
    assert 0.25 < 1 - gaps["diff"][1] / gaps["diff"][0] < 0.42  # "shrank V1's deficit by about a third"
    # the 320-epoch speech cell's check, three seeds per variant, part-way: the page names the runs in (so each
    # run that lands makes the page's reading and this test change together), the mean changes over them, each
    # seed's change where a variant has more than one, and seed 0's reading (V1's gain beyond the rule's 1-point
    # tolerance, softmax's a loss, V1's gap to softmax narrowing)
    cell = plan.cell_named("speech-320ep-2x")
    assert cell.check_seeds == 3
    rows, phrase = budget_check("speech-320ep-2x", 2)
    assert f"validation top-1 changed by {phrase} points" in page, phrase
    def words(xs: list[str]) -> str:
        return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]
    label = {"softmax": "softmax", "diff": "V1", "diff_v2_matched": "V2"}
    seeds = {v: rows[v]["seeds"] for v in plan.MAIN}
    runs_in = words([f"{label[v]}'s seed{'s' if len(s) > 1 else ''} {words([str(x) for x in s])}"
                     for v, s in seeds.items()])
    assert sum(map(len, seeds.values())) == 9 and f"has all 9 of its runs in: {runs_in}." in page, runs_in
    root = Path(__file__).resolve().parents[1]
    seed0 = {r["variant"]: r for r in plan.budget_checks(root / plan.RECORDS, [dataclasses.replace(cell, check_seeds=1)])}
    change = {v: [lo - b for b, lo in values] for v, values in _check_per_seed("speech-320ep-2x").items()}
    several = [f"{label[v]} {words([f'{c:+.2f}' for c in change[v]])}" for v in plan.MAIN if len(seeds[v]) > 1]
    if several:
        assert f"(per seed: {'; '.join(several)};" in page, several
    # softmax's three seeds all moved by less than the rule's tolerance: "had finished fitting at 320 epochs"
    soft = rows["softmax"]
    assert soft["seeds"] == [0, 1, 2] and all(abs(c) < 1 for c in change["softmax"])
    assert (soft["flat_longer_n"], soft["flat_n"]) == (2, 3)  # "two of its three 640-epoch runs ..., all three ..."
    assert "two of its three 640-epoch runs met the rule as well, all three of its 320-epoch ones" in page
    assert change["diff"][0] > 1 > 0 > change["softmax"][0]
    assert seed0["diff"]["flat"] and seed0["diff"]["flat_longer"]  # "although its 320-epoch run met the rule"
    gap = {k: seed0["diff"][k] - seed0["softmax"][k] for k in ("budget", "longer")}
    assert f"(seed 0 alone: narrowed from {gap['budget']:+.2f} to {gap['longer']:+.2f} points)" in page, gap
    # V1's three seeds: their mean change beyond the tolerance (the rule's reading: 320 epochs is short for V1),
    # two of the three seeds beyond it on their own, every 320-epoch run flat; the paired gap over the three seeds
    assert seeds["diff"] == [0, 1, 2] and rows["diff"]["flat_n"] == 3
    mean = statistics.mean(change["diff"])
    assert mean > 1 and [c > 1 for c in change["diff"]] == [True, True, False]
    assert (f"V1's, {mean:+.2f} points, is beyond the tolerance (two of its seeds gained more than a point, the third "
            f"{change['diff'][2]:+.2f})") in page
    all3 = {k: rows["diff"][k] - rows["softmax"][k] for k in ("budget", "longer")}
    assert f"on seeds 0, 1 and 2 V1's gap to softmax in validation top-1 narrowed from {all3['budget']:+.2f} to " \
           f"{all3['longer']:+.2f} points" in page, all3
    assert "So 320 epochs is short for V1 on speech" in page
    # V2's three seeds: their mean change within the tolerance (the rule's reading: 320 epochs is enough for V2),
    # how many moved by more than a point on their own, and its paired gap over the three seeds
    v2 = change["diff_v2_matched"]
    v2_mean = statistics.mean(v2)
    assert seeds["diff_v2_matched"] == [0, 1, 2] and abs(v2_mean) <= 1
    gap3 = {k: rows["diff_v2_matched"][k] - rows["softmax"][k] for k in ("budget", "longer")}
    assert all(abs(c) < 1 for c in v2)  # "none of its seeds moved by more than a point"
    assert (f"V2's mean change over its three seeds, {v2_mean:+.2f} points, is within the tolerance "
            f"(none of its seeds moved by more than a point), and over seeds 0, 1 and 2 its gap "
            f"to softmax went from {gap3['budget']:+.2f} to {gap3['longer']:+.2f} points: by the rule 320 epochs is "
            "enough for V2") in page, gap3
    # so the task's budget doubled: the speech cell trains 640 epochs and takes the check's nine runs; what is left
    # of it, timed by those runs
    task = plan.cell_named("speech")
    check_runs = list(_records("speech-320ep-2x")["runs"].values())
    left = plan.planned_runs(task) - len(check_runs)
    minutes = [r["seconds"] / 60 for r in check_runs]
    assert (left, task.final_seeds) == (60, 24 // 3) and plan.planned_runs_of(task)["softmax"] == 5 * 3 + 8
    assert (f"takes this check's nine runs as its grid runs at the three chosen lrs; {left - 3 * task.final_seeds} grid "
            f"runs and {3 * task.final_seeds} final seeds are left, about {round(left * statistics.mean(minutes) / 600) * 10} "
            f"CPU-thread hours at the check's {min(minutes):.0f}-{max(minutes):.0f} minutes a run") in page
    assert "at 640, seed 0: softmax {:.2f}, V1 {:.2f}, V2 {:.2f} %".format(
        *(seed0[v]["longer"] for v in plan.MAIN)) in page
    # the -10 dB cell's check: softmax's change, far beyond the rule's 1-point tolerance and unlike clean
    # speech's; V1's, about half of it; and V1's validation gap to softmax at both budgets over the same seeds
    noisy2x = _check_rows("speech-noisy-2x")
    assert {v: r["seeds"] for v, r in noisy2x.items()} == {"softmax": [0, 1, 2], "diff": [0, 1, 2]}
    assert "All 6 of its runs are in: softmax's and V1's seeds 0-2." in " ".join(page.split())
    took = [r["seconds"] / 60 for r in _records("speech-noisy-2x")["runs"].values() if r["variant"] == "softmax"]
    assert f"{min(took):.0f}-{max(took):.0f} minutes a softmax run on one thread beside another training" in page
    soft = noisy2x["softmax"]
    b, lo = (list(x) for x in zip(*_check_per_seed("speech-noisy-2x")["softmax"]))
    assert (f"changed by {soft['longer'] - soft['budget']:+.2f} (softmax) points (per seed: softmax "
            f"{lo[0] - b[0]:+.2f}, {lo[1] - b[1]:+.2f} and {lo[2] - b[2]:+.2f}; from {b[0]:.2f}, {b[1]:.2f} and "
            f"{b[2]:.2f} % at 320 epochs to {lo[0]:.2f}, {lo[1]:.2f} and {lo[2]:.2f} % at 640)") in page
    assert soft["longer"] - soft["budget"] > 10 and soft["flat_longer_n"] == 1  # "short ... by far", "two of three still fail"
    assert soft["flat_n"] == 2 and f"{min(x - y for x, y in zip(lo, b)) - 0.05:.1f}" == "9.7"  # "... still gained at least 9.7"
    assert ("two of softmax's three 320-epoch runs met the rule, yet at 640 epochs every one of the three seeds gained "
            "at least 9.7 points") in " ".join((root / "docs" / "study.md").read_text().split())  # the same, as the method says it
    v1 = noisy2x["diff"]
    b1, lo1 = (list(x) for x in zip(*_check_per_seed("speech-noisy-2x")["diff"]))
    took = [r["seconds"] / 60 for r in _records("speech-noisy-2x")["runs"].values() if r["variant"] == "diff"]
    gain, soft_gain = v1["longer"] - v1["budget"], soft["longer"] - soft["budget"]
    assert 0.5 < gain / soft_gain < 0.6 and gain > 1  # "a little over half", "far beyond the 1-point tolerance"
    assert v1["flat_longer_n"] == 3 and v1["flat_n"] == 0  # "all three ... meet", "none of its 320-epoch runs did"
    gap = [v1[k] - soft[k] for k in ("budget", "longer")]
    assert " ".join(f"""V1 changed by {gain:+.2f} points (per seed: {lo1[0] - b1[0]:+.2f}, {lo1[1] - b1[1]:+.2f}
        and {lo1[2] - b1[2]:+.2f}; from {b1[0]:.2f}, {b1[1]:.2f} and {b1[2]:.2f} % to {lo1[0]:.2f}, {lo1[1]:.2f} and
        {lo1[2]:.2f} %, {min(took):.0f}-{max(took):.0f} minutes a run), a little over half of softmax's gain""".split()) \
        in " ".join(page.split())
    assert (f"V1's mean validation lead over the three seeds, {gap[0]:+.2f} points at 320 epochs, became {gap[1]:+.2f} "
            "at 640") in " ".join(page.split())
    assert gap[0] > 0 > gap[1]  # a lead at 320 epochs, softmax ahead at 640
    # what a budget that lets -10 dB flatten would cost (twice the check's mean run for each of the 40 runs a
    # 1,280-epoch cell would train beyond the check's 6), and the pilots of a milder level, 0 dB: softmax's gain from
    # 320 to 640 epochs within the tolerance, both runs flat, against seed 0's gain at -10 dB
    joined = " ".join(page.split())
    noisy_cell = plan.cell_named("speech-noisy")
    mean_min = statistics.mean(r["seconds"] / 60 for r in _records("speech-noisy-2x")["runs"].values())
    left = plan.planned_runs(noisy_cell) - 6
    assert (f"about {2 * mean_min:.0f} minutes a run at the check's pace and about "
            f"{round(left * 2 * mean_min / 60 / 5) * 5} CPU-thread hours for the cell's {left} runs beyond the check's") \
        in joined
    pilots = json.loads((root / plan.RECORDS / "pilots" / "speech_0db.json").read_text())["runs"]
    p320, p640 = (pilots[f"0db_{ep}ep/softmax_lr0.002_seed0"] for ep in (320, 640))

    def epochs_of(run: dict) -> str:  # the epochs a pilot's command line trained
        return run["fixed"][run["fixed"].index("--trainer.max_epochs") + 1]

    assert p320["extra"] == p640["extra"] == ["--data.init_args.snr_fixed_db=0"]
    assert [epochs_of(p) for p in (p320, p640)] == ["320", "640"]
    v320, v640 = (100 * p["summary"]["metrics"]["val/top1"] for p in (p320, p640))
    assert 0 < v640 - v320 < 1 and p320["plateau"]["flat"] and p640["plateau"]["flat"]
    assert (f"reached {v320:.2f} % validation top-1 at 320 epochs ({p320['seconds'] / 60:.0f} minutes) and {v640:.2f} % "
            f"at 640 ({p640['seconds'] / 60:.0f} minutes), a gain of {v640 - v320:+.2f} points") in joined
    assert f"where at -10 dB its seed 0 gained {lo[0] - b[0]:+.2f}" in page
    v1_0db = pilots["0db_320ep/diff_lr0.002_seed0"]
    assert v1_0db["extra"] == p320["extra"] and epochs_of(v1_0db) == "320"
    v1_flat = v1_0db["plateau"]["flat"]
    assert (f"V1's run at 320 epochs (the same lr and seed) reached {100 * v1_0db['summary']['metrics']['val/top1']:.2f} % "
            f"({v1_0db['seconds'] / 60:.0f} minutes) and "
            + ("met the plateau rule" if v1_flat else "did not meet the plateau rule (+{:.2f} points over its last "
               "fifth)".format(100 * v1_0db["plateau"]["gain"]))) in joined
    # ... and at 640: within the tolerance too, so the noisy cell became speech-0db at 320 epochs (now
    # speech-0db-320ep), with its cost
    v1_640 = pilots["0db_640ep/diff_lr0.002_seed0"]
    assert v1_640["extra"] == p320["extra"] and epochs_of(v1_640) == "640"
    w320, w640 = (100 * p["summary"]["metrics"]["val/top1"] for p in (v1_0db, v1_640))
    assert abs(w640 - w320) < 1 and v1_640["plateau"]["flat"]
    assert (f"and at 640 epochs {w640:.2f} % ({v1_640['seconds'] / 60:.0f} minutes), {w640 - w320:+.2f} points, within "
            "the tolerance too, and met the rule again. So the noisy cell became `speech-0db`") in joined.replace("**", "")
    zero = plan.cell_named("speech-0db-320ep")
    assert plan.cell_epochs(zero) == 320 and plan.planned_runs(zero) == 46
    m640 = statistics.mean(p["seconds"] / 60 for p in (p640, v1_640))
    # the cell's cost, restated from its grid once the grid was in: 30 runs, the 16 final seeds timed by variant
    grid = [r for r in _records("speech-0db-320ep")["runs"].values() if r["seed"] < plan.FINAL_SEED]
    assert len(grid) == 2 * 5 * plan.GRID_SEEDS
    took = {v: [r["seconds"] / 60 for r in grid if r["variant"] == v] for v in ("softmax", "diff")}
    grid_h = sum(map(sum, took.values())) / 60
    left_h = zero.final_seeds * sum(statistics.mean(m) for m in took.values()) / 60
    assert (f"46 runs, about {grid_h + left_h:.0f} CPU-thread hours (the grid's 30 runs took "
            f"{min(map(min, took.values())):.0f}-{max(map(max, took.values())):.0f} minutes each, "
            f"{statistics.mean(took['softmax']):.1f} softmax and {statistics.mean(took['diff']):.1f} V1 on average, "
            f"{grid_h:.1f} CPU-thread hours in all;") in joined
    assert f"(`speech-0db-320ep-2x`, 6 runs, about {6 * m640 / 60:.0f} CPU-thread hours)" in joined
    assert abs(rows["softmax"]["longer"] - rows["softmax"]["budget"]) < 1  # clean speech over the same seeds
    assert f"where on clean speech it had finished ({rows['softmax']['longer'] - rows['softmax']['budget']:+.2f} points" in page
    # CLIP's 320-epoch (three-digit) check: changes of both signs, each under 1.5 points, every curve flat
    rows, phrase = budget_check("clip-2x", 2)
    assert f"moved validation mean recall by {phrase} points" in page, phrase
    gain = [r["longer"] - r["budget"] for r in rows.values()]
    assert min(gain) < 0 < max(gain) and max(map(abs, gain)) < 1.5
    assert all(r["flat"] and r["flat_longer"] for r in rows.values())
    # CLIP's 80-epoch check: every curve flat by the rule at both budgets, yet softmax gains the most at 160
    rows, phrase = budget_check("clip-80ep-2x", 2)
    assert f"gained {phrase} points" in page, phrase
    assert all(r["flat"] and r["flat_longer"] for r in rows.values())
    gain = {v: r["longer"] - r["budget"] for v, r in rows.items()}
    assert gain["softmax"] > gain["diff"] > gain["diff_v2_matched"] > 0  # "softmax gains the most"
    for v, at_80, at_160, said in (("diff_v2_matched", "+9.8", "+1.6", "from +9.8 points at 80 epochs to +1.6 at 160"),
                                   ("diff", "+3.9", "-1.7", "from +3.9 to -1.7")):  # seed 0's gaps, as the page says them
        assert f"{rows[v]['budget'] - rows['softmax']['budget']:+.1f}" == at_80, v
        assert f"{rows[v]['longer'] - rows['softmax']['longer']:+.1f}" == at_160, v
        assert said in page, said
    # cluttered's budget check: the gains at twice the epochs, and softmax / V1 still rising there
    rows, phrase = budget_check("cluttered-30ep-2x", 2)
    assert f"{phrase} points" in page, phrase
    assert not rows["softmax"]["flat_longer"] and not rows["diff"]["flat_longer"]
    # cluttered's pilot at 4x: the gains at 120 epochs; V1 and V2 flat there, softmax not
    rows, phrase = budget_check("cluttered-30ep-4x", 2)
    assert f"gained {phrase} points" in page, phrase
    assert not rows["softmax"]["flat_longer"] and rows["diff"]["flat_longer"] and rows["diff_v2_matched"]["flat_longer"]
    # cluttered's (final-budget) check over its three seeds: the changes at 240 epochs, every run flat there, the
    # flat counts at 120, and the V1 and V2 gaps at 120 and 240 epochs, as the page says them
    rows, phrase = budget_check("cluttered-120ep-2x", 2)
    assert all(r["seeds"] == [0, 1, 2] and r["flat_longer_n"] == 3 for r in rows.values())
    assert f"validation top-1 changed by {phrase} points at 240 epochs, every run flat there (at 120: " \
           f"{rows['softmax']['flat_n']}, {rows['diff']['flat_n']} and {rows['diff_v2_matched']['flat_n']} of 3)" in page
    gap = {v: [f"{rows[v][k] - rows['softmax'][k]:+.2f}" for k in ("budget", "longer")] for v in plan.MAIN[1:]}
    assert "shrinks V1's mean gap from {} to {} points and leaves V2's at {} and {}".format(
        *gap["diff"], *gap["diff_v2_matched"]) in page, gap
    # the ViT's check: under a point for each variant, every curve flat at both budgets
    rows, phrase = budget_check("vit-2x", 2)
    assert f"gained {phrase} points" in page, phrase
    assert all(r["flat"] and r["flat_longer"] and abs(r["longer"] - r["budget"]) < 1.0 for r in rows.values())
    # speech's 40-epoch check: the gains at 80 epochs; V1 flat there, softmax and V2 not
    rows, phrase = budget_check("speech-40ep-2x", 2)
    assert f"gained {phrase} points" in page, phrase
    assert rows["diff"]["flat_longer"] and not rows["softmax"]["flat_longer"] and not rows["diff_v2_matched"]["flat_longer"]
    # speech's 80-epoch check: the gains at 160 epochs, every curve flat there; seed 0's gaps as the page says them
    rows, phrase = budget_check("speech-80ep-2x", 2)
    assert f"gained {phrase} points" in page, phrase
    assert all(r["flat_longer"] for r in rows.values())
    for v, at_80, at_160, said in (("diff_v2_matched", "+3.06", "+1.39", "from +3.06 points at 80 epochs to +1.39 at 160"),
                                   ("diff", "+0.83", "+1.67", "from +0.83 to +1.67")):
        assert f"{rows[v]['budget'] - rows['softmax']['budget']:+.2f}" == at_80, v
        assert f"{rows[v]['longer'] - rows['softmax']['longer']:+.2f}" == at_160, v
        assert said in page, said
    # speech at 80 epochs, test voices resampled and the SNR interaction, as the page reads them: V2's interval
    # includes zero, neither slope differs from softmax's, V2's gain is smallest in the noisiest third
    from diffzoo.study import tables

    speech = tables.speech_voice_stats(_records("speech-80ep"))
    by = {r["variant"]: r for r in speech["rows"]}
    for variant, label in (("diff", "V1"), ("diff_v2_matched", "V2")):
        b, i = by[variant]["bootstrap"], by[variant]["interaction"]
        assert f"{label} {b['diff']:+.2f} [{b['ci_low']:+.2f}, {b['ci_high']:+.2f}], p {b['p']:.3f}" in page, variant
        assert f"{label} {i['diff']:+.4f} [{i['ci_low']:+.4f}, {i['ci_high']:+.4f}], p {i['p_perm']:.3f}" in page, variant
        assert i["p_perm"] >= 0.05  # "neither variant's logit slope per dB of SNR differs from softmax's"
    gaps = [g["diff"] for g in by["diff_v2_matched"]["interaction"]["gap_by_bin"]]
    assert gaps[0] == min(gaps) and "{:+.2f}, {:+.2f} and {:+.2f} points".format(*gaps) in page  # "smallest where the noise is worst"
    assert by["diff_v2_matched"]["bootstrap"]["ci_low"] < 0 < by["diff_v2_matched"]["bootstrap"]["ci_high"]
    # ... and at 160 epochs, V1 (the variants with all their final seeds): the voice-resampled interval includes
    # zero, V1's slope is lower than softmax's, and its gap is largest in the cleanest third
    speech_cell = plan.cell_named("speech-160ep")
    by = {r["variant"]: r for r in plan.cell_voice_stats(root / plan.RECORDS, speech_cell)["rows"]}
    b, i = by["diff"]["bootstrap"], by["diff"]["interaction"]
    assert f"({b['diff']:+.2f} [{b['ci_low']:+.2f}, {b['ci_high']:+.2f}], p boot {b['p']:.3f};" in page
    assert b["ci_low"] < 0 < b["ci_high"]  # "the interval includes zero"
    assert f"({i['diff']:+.4f} [{i['ci_low']:+.4f}, {i['ci_high']:+.4f}], permutation p {i['p_perm']:.3f}" in page
    assert i["ci_high"] < 0  # "V1's logit slope per dB of SNR is lower than softmax's"
    gaps = [g["diff"] for g in i["gap_by_bin"]]
    assert gaps[-1] == min(gaps) and "{:+.2f}, {:+.2f} and {:+.2f} points".format(*gaps) in page  # cleanest third
    # ... and at 320 epochs (the `speech-320ep` cell), softmax's and V1's finished columns: both at 2e-3, V1's seed
    # interval below zero but not after Holm or with the voices resampled, no SNR interaction, its gap largest
    # in the noisiest third; the gradient-norm ratio and plateau counts the page gives
    sp = {r["variant"]: r for r in result["cells"]["speech-320ep"]["rows"]}
    for v in plan.MAIN:
        assert sp[v]["n"] == 8 and sp[v]["lr"] == (8e-3 if v == "diff_v2_matched" else 2e-3), v
    assert ("Test top-1 (8 final seeds): softmax {:.2f} ± {:.2f} % (lr 2e-3), V1 {:.2f} ± {:.2f} (lr 2e-3), V2 matched "
            "{:.2f} ± {:.2f} (lr 8e-3).").format(*(sp[v][k] for v in plan.MAIN for k in ("mean", "sd"))) in page
    c = sp["diff"]["vs"]
    assert (f"V1 - softmax {c['diff']:+.2f} [{c['ci_low']:+.2f}, {c['ci_high']:+.2f}] points (Welch 95 % CI), exact "
            f"permutation p {c['p_perm']:.3f}, which survives neither Holm's correction over the earlier-budget rows "
            f"({sp['diff']['p_holm_study']:.3f}; the earlier-budgets table above)") in page
    assert "speech-320ep" in result["earlier"]
    assert c["ci_high"] < 0 and c["p_perm"] < 0.05 <= sp["diff"]["p_holm_study"] and -3.5 < c["ci_low"] < -3.35
    by = {r["variant"]: r for r in plan.cell_voice_stats(root / plan.RECORDS, plan.cell_named("speech-320ep"))["rows"]}
    b, i = by["diff"]["bootstrap"], by["diff"]["interaction"]
    assert f"({b['diff']:+.2f} [{b['ci_low']:+.2f}, {b['ci_high']:+.2f}], p boot {b['p']:.3f};" in page
    assert b["ci_low"] < 0 < b["ci_high"] and i["ci_low"] < 0 < i["ci_high"]
    assert f"by {i['diff']:+.4f} [{i['ci_low']:+.4f}, {i['ci_high']:+.4f}] (permutation p {i['p_perm']:.3f})" in page
    gaps = [g["diff"] for g in i["gap_by_bin"]]
    assert gaps[0] == min(gaps) and "{:+.2f}, {:+.2f} and {:+.2f} points".format(*gaps) in page  # noisiest third
    # V2 matched at 8e-3: no difference, with the seed and voice intervals, the SNR slope and the gap per third
    c2, b2, i2 = sp["diff_v2_matched"]["vs"], by["diff_v2_matched"]["bootstrap"], by["diff_v2_matched"]["interaction"]
    assert (f"V2 matched - softmax {c2['diff']:+.2f} [{c2['ci_low']:+.2f}, {c2['ci_high']:+.2f}] points (Welch 95 % "
            f"CI), exact permutation p {c2['p_perm']:.3f}; with the test voices resampled {b2['diff']:+.2f} "
            f"[{b2['ci_low']:+.2f}, {b2['ci_high']:+.2f}], p boot {b2['p']:.3f}. **No difference found**") in page
    assert -1.5 < c2["ci_low"] < -1.45 < 0 < 1.75 < c2["ci_high"] < 1.85 and b2["ci_low"] < 0 < b2["ci_high"]
    assert i2["ci_low"] < 0 < i2["ci_high"]  # "Nor does V2's gap move with the noise"
    assert f"by {i2['diff']:+.4f} [{i2['ci_low']:+.4f}, {i2['ci_high']:+.4f}] (permutation p {i2['p_perm']:.3f})" in page
    assert "noisiest first, is {:+.2f}, {:+.2f} and {:+.2f} points".format(
        *(g["diff"] for g in i2["gap_by_bin"])) in page
    old = {r["variant"]: r for r in result["cells"]["speech-160ep"]["rows"]}["diff_v2_matched"]["vs"]
    v2_80 = {r["variant"]: r for r in result["cells"]["speech-80ep"]["rows"]}["diff_v2_matched"]["vs"]
    assert (f"V2 was {v2_80['diff']:+.2f} points ahead of softmax at 80 epochs and {old['diff']:+.2f} "
            f"[{old['ci_low']:+.2f}, {old['ci_high']:+.2f}] from it at 160") in page
    speech_finals = [r for r in _records("speech-320ep")["runs"].values() if r["seed"] >= plan.FINAL_SEED]
    norm = {v: statistics.median(statistics.median(x[1] for x in r["curves"][GRAD_NORM])
                                 for r in speech_finals if r["variant"] == v) for v in plan.MAIN}
    assert f"softmax {norm['softmax']:.2f}, V1 {norm['diff']:.2f} ({norm['diff'] / norm['softmax']:.2f} times" in page
    v2_norm = norm["diff_v2_matched"]
    assert f"V2 {v2_norm:.2f} ({v2_norm / norm['softmax']:.2f} times softmax's, at four times its lr)" in page
    flat = [sum(1 for p in sp[v]["plateau"] if p and p["flat"]) for v in plan.MAIN]
    assert flat == [6, 8, 7] and "6 of softmax's 8 final runs, all 8 of V1's and 7 of V2's met the plateau rule" in page
    machines: dict[bool, set] = {}
    for r in _records("speech-320ep")["runs"].values():
        machines.setdefault(r["seed"] >= plan.FINAL_SEED, set()).add((r["code"]["cpu_model"].split()[0], r["code"]["cpu"]))
    assert machines == {True: {("AMD", "AVX512")}, False: {("Intel(R)", "AVX512")}}  # "the same kind of machine"
    assert "(AMD EPYC, AVX512, as their records say), every grid run on another (Intel Xeon, AVX512)" in page
    val_gap = [statistics.mean(100 * r["summary"]["metrics"]["val/top1"] for r in speech_finals if r["variant"] == v)
               - sp[v]["mean"] for v in plan.MAIN]
    assert all(7.5 <= g < 9.5 for g in val_gap), val_gap  # "about 8-9 points below the validation voices"
    # speech at -10 dB (`speech-noisy`), both columns finished: no difference with the seeds or the voices
    # resampled, the gap's change from the clean cell's spans zero and excludes a widening of more than 0.9
    # points, the gradient-norm ratio, plateau counts and largest tail gains, and every final on one machine kind
    sn = {r["variant"]: r for r in result["cells"]["speech-noisy"]["rows"]}
    assert [sn[v]["n"] for v in ("softmax", "diff")] == [8, 8] and (sn["softmax"]["lr"], sn["diff"]["lr"]) == (2e-3, 4e-3)
    assert ("Test top-1 (8 final seeds): softmax {:.2f} ± {:.2f} % (lr 2e-3), V1 {:.2f} ± {:.2f} (lr 4e-3).").format(
        *(sn[v][k] for v in ("softmax", "diff") for k in ("mean", "sd"))) in page
    cn = sn["diff"]["vs"]
    bn = next(r for r in plan.cell_voice_stats(root / plan.RECORDS, plan.cell_named("speech-noisy"))["rows"]
             if r["variant"] == "diff")["bootstrap"]
    assert (f"V1 - softmax {cn['diff']:+.2f} [{cn['ci_low']:+.2f}, {cn['ci_high']:+.2f}] points (Welch 95 % CI), exact "
            f"permutation p {cn['p_perm']:.3f}; with the test voices resampled as clusters {bn['diff']:+.2f} "
            f"[{bn['ci_low']:+.2f}, {bn['ci_high']:+.2f}], p boot {bn['p']:.3f}. **No difference found at -10 dB") in page
    assert cn["ci_low"] < 0 < cn["ci_high"] and bn["ci_low"] < 0 < bn["ci_high"]
    gaps = {g["cell"]: g for g in plan.noise_gaps(root / plan.RECORDS, plan.CELLS)}  # by noisy cell
    gap = gaps["speech-noisy"]
    ch = gap["change"]
    assert (gap["cell"], gap["clean"], gap["variant"]) == ("speech-noisy", "speech-320ep", "diff")
    said = f"{ch['diff']:+.2f} points [{ch['ci_low']:+.2f}, {ch['ci_high']:+.2f}]"
    assert f"is {said} (p {ch['p']:.3f};" in page and f"it moves by {said} from the clean cell's" in page
    assert ch["diff"] > 0 and -0.9 < ch["ci_low"] < 0 < ch["ci_high"]  # "trails by less, not more ... excludes"
    noisy_finals = [r for r in _records("speech-noisy")["runs"].values() if r["seed"] >= plan.FINAL_SEED]
    norm = {v: statistics.median(statistics.median(x[1] for x in r["curves"][GRAD_NORM])
                                 for r in noisy_finals if r["variant"] == v) for v in ("softmax", "diff")}
    assert (f"softmax {norm['softmax']:.2f}, V1 {norm['diff']:.2f} ({norm['diff'] / norm['softmax']:.2f} times "
            "softmax's, at twice its") in page
    flat = [sum(1 for p in sn[v]["plateau"] if p and p["flat"]) for v in ("softmax", "diff")]
    tail = [max(100 * r["plateau"]["gain"] for r in noisy_finals if r["variant"] == v) for v in ("softmax", "diff")]
    assert f"{flat[0]} of softmax's 8 final runs and {flat[1]} of V1's met the plateau rule" in page
    assert f"gained up to {tail[0]:.1f} (softmax) and {tail[1]:.1f} (V1) points" in page
    assert sum(flat) == 8 and "half of the final runs were still improving" in page
    assert all(r["seeds"] == [0, 1, 2] for r in noisy2x.values())  # "(three seeds each)"
    assert ("at twice the epochs softmax gained {:.0f} points of validation top-1 and V1 {:.0f} (three seeds "
            "each)").format(*(noisy2x[v]["longer"] - noisy2x[v]["budget"] for v in ("softmax", "diff"))) \
        in " ".join(page.split())
    assert {(r["code"]["cpu_model"].split()[0], r["code"]["cpu"]) for r in noisy_finals} == {("AMD", "AVX512")}
    secs = {v: [r["seconds"] for r in noisy_finals if r["variant"] == v] for v in ("softmax", "diff")}
    assert "({:,.0f}-{:,.0f} s for softmax, {:,.0f}-{:,.0f} for V1,".format(
        min(secs["softmax"]), max(secs["softmax"]), min(secs["diff"]), max(secs["diff"])) in page
    val = [statistics.mean(100 * r["summary"]["metrics"]["val/top1"] for r in noisy_finals if r["variant"] == v)
           for v in ("softmax", "diff")]
    assert all(14.5 <= v - sn[k]["mean"] < 16 for v, k in zip(val, ("softmax", "diff")))  # "about 15 points below"
    assert "(validation top-1 {:.2f} and {:.2f} %)".format(*val) in page
    # "In short": five tasks' cells have all three variants' 8 final seeds, and no final row survives the study's
    # Holm; the sixth, speech, is being trained at its new budget (its check at 640 gained V1 beyond the tolerance)
    assert ("On five of the six tasks, each finished at its final budget (ViT digits, MQAR, cluttered digits, CLIP, "
            "the byte-level LM), no gap") in page
    for name in ("vit", "mqar", "cluttered", "clip", "lm"):
        assert [r["n"] for r in result["cells"][name]["rows"] if r["variant"] in plan.MAIN] == [8, 8, 8], name
    assert not result["cells"].get("speech") and plan.cell_named("speech").epochs == 640
    sp2 = _check_rows("speech-320ep-2x")
    v1_gain = sp2["diff"]["longer"] - sp2["diff"]["budget"]
    assert v1_gain > 1 and (f"but at twice the epochs V1 gained {v1_gain:.2f} points of validation top-1 over three "
                            "seeds, beyond the study's tolerance, so speech's budget became 640 epochs, the sixth "
                            "task's final budget, which is being trained") in " ".join(page.split())
    # ... and no final row survives the study's Holm; V1's gap at 0 dB and 320 epochs, worse than softmax with every
    # V1 seed below every softmax seed, is an earlier budget since its check found softmax still gaining at 640
    assert [(name, r["variant"]) for name, c in result["cells"].items() if c and name not in result["earlier"]
            for r in c["rows"] if "vs" in r and r["p_holm_study"] < 0.05] == []
    assert "So no gap at a final budget survives the study's Holm correction so far." in joined
    assert "speech-0db-320ep" in result["earlier"] and not result["cells"].get("speech-0db")
    assert plan.cell_named("speech-0db").epochs == 640 and "(`speech-0db`, being trained)" in joined
    z = {r["variant"]: r for r in result["cells"]["speech-0db-320ep"]["rows"]}
    zc = z["diff"]["vs"]
    zb, zero, zt, zk, check_done = _speech_0db()
    assert zc["ci_high"] < 0 and zb["ci_high"] < 0 and z["diff"]["p_holm_study"] < 0.05
    assert (f"seeds trail softmax's by {-zc['diff']:.2f} points of test top-1 [{zc['ci_low']:.2f}, {zc['ci_high']:.2f}] "
            f"(exact permutation p {zc['p_perm']:.1e}; with the test voices "
            f"resampled [{zb['ci_low']:.2f}, {zb['ci_high']:.2f}]), every V1 seed below every softmax seed, a gap that "
            "survived the study's Holm correction while this was the final 0 dB cell and survives the one over the "
            "earlier-budget rows") in joined
    assert len(zt["softmax"]) == len(zt["diff"]) == 8 and max(zt["diff"]) < min(zt["softmax"])
    # at the same 320 epochs, the 0 dB gap against clean speech's (the noise table's row for the two cells)
    g0 = gaps["speech-0db-320ep"]
    assert (g0["clean"], g0["variant"], g0["budget_noisy"], g0["budget_clean"]) == ("speech-320ep", "diff",
                                                                                  "320 epochs", "320 epochs")
    c0 = g0["change"]
    assert c0["ci_low"] < 0 < c0["ci_high"]  # "an interval that covers zero"
    said0 = f"{c0['diff']:+.2f} points [{c0['ci_low']:+.2f}, {c0['ci_high']:+.2f}] (p {c0['p']:.3f})"
    assert f"At the same 320 epochs V1's gap moves by {said0} from clean speech to 0 dB" in joined
    assert ("V1's gap moves from {:.2f} points on clean speech to {:.2f} at 0 dB, a change of {:+.2f} [{:+.2f}, {:+.2f}] "
            "(Welch-Satterthwaite 95 % CI, p {:.3f}, outside").format(
        g0["gap_clean"]["diff"], g0["gap_noisy"]["diff"], c0["diff"], c0["ci_low"], c0["ci_high"], c0["p"]) in joined
    # the 640-epoch cell: its grid starts from the check's six runs; what is left, at the check's pace
    z640 = _records("speech-0db")["runs"]
    assert sorted(z640) == sorted(_records("speech-0db-320ep-2x")["runs"])
    assert {r["adopted_from"] for r in z640.values()} == {"speech-0db-320ep-2x"}
    left = plan.planned_runs(plan.cell_named("speech-0db")) - len(z640)
    pace = statistics.mean(r["seconds"] for r in z640.values())
    assert (f"{len(z640)} runs taken in as its grid runs at their lrs, {left} runs left (24 grid, 16 final seeds), about "
            f"{left * pace / 3600:.0f} CPU-thread hours at the check's {pace / 60:.0f} minutes a run") in joined
    # its check at 640 epochs: V1 finished by 320 (within the 1-point tolerance), softmax not, so V1's validation
    # deficit on the check's seeds grew; the seeds, run times and per-seed changes the paragraph quotes
    assert check_done
    zg = {v: zk[v]["longer"] - zk[v]["budget"] for v in ("softmax", "diff")}
    assert abs(zg["diff"]) <= 1 < zg["softmax"]
    zgap = [zk["diff"][k] - zk["softmax"][k] for k in ("budget", "longer")]
    assert zgap[1] < zgap[0] < 0
    assert (f"found V1 finished by 320 epochs ({zg['diff']:+.2f} points of validation top-1 over the three seeds) while "
            f"softmax still gained {zg['softmax']:.2f}, beyond the study's 1-point tolerance, so on those seeds V1's "
            f"validation deficit grew from {-zgap[0]:.2f} to {-zgap[1]:.2f} points") in joined
    zs2 = list(_records("speech-0db-320ep-2x")["runs"].values())
    assert sorted((r["variant"], r["seed"]) for r in zs2) == [(v, s) for v in ("diff", "softmax") for s in (0, 1, 2)]
    assert {r["code"]["threads"] for r in zs2} == {1} and not any(r["code"]["changed"] for r in zs2)
    assert "6 runs of {:,.0f}-{:,.0f} s on one thread".format(min(r["seconds"] for r in zs2),
                                                              max(r["seconds"] for r in zs2)) in joined
    zseeds = _check_per_seed("speech-0db-320ep-2x")  # (320, 640 epochs) per seed
    zper = {v: [lo - b for b, lo in x] for v, x in zseeds.items()}
    assert ("V1's validation top-1 changed by {:+.2f} points over the three seeds (per seed {:+.2f}, {:+.2f} and {:+.2f}; "
            "all six of its runs met the plateau rule)").format(zg["diff"], *zper["diff"]) in joined
    assert zk["diff"]["flat_n"] == zk["diff"]["flat_longer_n"] == 3
    assert "while softmax's changed by {:+.2f} ({:+.2f}, {:+.2f} and {:+.2f}), beyond the 1-point tolerance".format(
        zg["softmax"], *zper["softmax"]) in joined
    assert zk["softmax"]["flat_n"] == zk["softmax"]["flat_longer_n"] == 2  # "two of its three ... at each budget"
    assert (f"V1 trailed softmax on validation by {-zgap[0]:.2f} points at 320 epochs and by {-zgap[1]:.2f} at 640"
            in joined)
    assert (f"found 320 epochs to be V1's plateau there ({zg['diff']:+.2f} points over seeds 0-2 at its best lr) but not "
            f"softmax's ({zg['softmax']:+.2f} at its own)") in " ".join((root / "docs" / "study.md").read_text().split())
    # "again": the check's seed 0 scored, at 320 and at 640 epochs, what V1's two pilots had (read from both records)
    assert [f"{x:.2f}" for x in zseeds["diff"][0]] == [f"{w320:.2f}", f"{w640:.2f}"]
    assert "V1's seed 0 gave its pilot's figures again ({:.2f} % at 320 epochs, {:.2f} % at 640)".format(
        *zseeds["diff"][0]) in joined
    # the 0 dB cell's own paragraph: seeds, lrs, the voices' bootstrap, validation, gradient norms, plateaus, times
    assert "V1 - softmax {:.2f} [{:.2f}, {:.2f}] points (Welch 95 % CI), exact permutation p {:.1e}, the smallest p".format(
        zc["diff"], zc["ci_low"], zc["ci_high"], zc["p_perm"]) in page
    assert zc["p_perm"] == pytest.approx(2 / math.comb(16, 8))  # "the smallest p that 8 seeds a side can give"
    assert (z["softmax"]["lr"], z["diff"]["lr"]) == (4e-3, 2e-3)
    assert "softmax {:.2f} ± {:.2f} % (lr 4e-3), V1 {:.2f} ± {:.2f} % (lr 2e-3)".format(
        *(z[v][k] for v in ("softmax", "diff") for k in ("mean", "sd"))) in page
    assert ("(every V1 seed scored below every softmax seed: {:.2f}-{:.2f} against {:.2f}-{:.2f} %), significant after "
            "Holm's correction over the earlier-budget rows (their table's p Holm; while this was the final 0 dB cell it "
            "survived the study's correction as well)").format(
        min(zt["diff"]), max(zt["diff"]), min(zt["softmax"]), max(zt["softmax"])) in joined
    assert f"with the test voices resampled as clusters {zb['diff']:.2f} [{zb['ci_low']:.2f}, {zb['ci_high']:.2f}], p boot" \
        f" {zb['p']:.3f}" in joined
    zv = {v: statistics.mean(100 * r["summary"]["metrics"]["val/top1"] for r in zero if r["variant"] == v)
          for v in ("softmax", "diff")}
    assert "{:.2f} % softmax, {:.2f} % V1 (V1 {:.2f} points)".format(zv["softmax"], zv["diff"], zv["diff"] - zv["softmax"]) \
        in page and zv["diff"] - zv["softmax"] > zc["diff"]  # "on the validation voices the gap is smaller"
    assert "score {:.1f} (softmax) and {:.1f} (V1) points below the validation voices".format(
        zv["softmax"] - z["softmax"]["mean"], zv["diff"] - z["diff"]["mean"]) in page
    zn = {v: statistics.median(statistics.median(x[1] for x in r["curves"][GRAD_NORM]) for r in zero if r["variant"] == v)
          for v in ("softmax", "diff")}
    assert "softmax {:.2f}, V1 {:.2f} ({:.2f} times softmax's, at half its lr)".format(
        zn["softmax"], zn["diff"], zn["diff"] / zn["softmax"]) in page and 2 * z["diff"]["lr"] == z["softmax"]["lr"]
    zflat = {v: sum(1 for r in zero if r["variant"] == v and r["plateau"]["flat"]) for v in ("softmax", "diff")}
    zgain = {v: max(100 * r["plateau"]["gain"] for r in zero if r["variant"] == v) for v in ("softmax", "diff")}
    assert (f"{zflat['softmax']} of softmax's 8 final runs and {zflat['diff']} of V1's met the plateau rule; the others "
            f"still gained up to {zgain['softmax']:.1f} (softmax) and {zgain['diff']:.1f} (V1) points") in page
    zs = {v: [r["seconds"] for r in zero if r["variant"] == v] for v in ("softmax", "diff")}
    assert "A run took {:,.0f}-{:,.0f} s (softmax) and {:,.0f}-{:,.0f} s (V1) on one thread".format(
        min(zs["softmax"]), max(zs["softmax"]), min(zs["diff"]), max(zs["diff"])) in page
    assert {r["code"]["threads"] for r in zero} == {1} and not any(r["code"]["changed"] for r in zero)
    assert f"V1's 8 final seeds trail softmax's by {-c['diff']:.2f} points of test top-1" in page
    assert (f"and V2's are level with softmax's ({c2['diff']:+.2f} points [{c2['ci_low']:+.2f}, {c2['ci_high']:+.2f}]); "
            "but at twice the epochs V1 gained") in " ".join(page.split())
    assert (f"At -10 dB V1 is level with softmax too ({cn['diff']:+.2f} points [{cn['ci_low']:+.2f}, {cn['ci_high']:+.2f}]): "
            f"its gap does not grow with the noise (it moves by {said} from the clean cell's)") in page
    def size_cell(name: str, digits: int, unit: str) -> list[dict]:
        """A size cell's final runs, after checking the prose's means ± sd, Welch intervals and exact permutation
        p (as the study's tables compute them) against them."""
        cell = plan.cell_named(name)
        family = FAMILIES[cell.family]
        runs = plan.complete_final_runs(plan.load(root / plan.RECORDS, cell), cell)[0]
        rows = {r["variant"]: r for r in tables.comparison_rows(family, runs, "softmax", family.test_metric)}
        assert [rows[v]["n"] for v in plan.MAIN] == [5, 5, 5], name
        assert "softmax {0} ± {0}{1}, V1 {0} ± {0}, V2 {0} ± {0}".format(f"{{:.{digits}f}}", unit).format(
            *(rows[v][k] for v in plan.MAIN for k in ("mean", "sd"))) in page, name
        for v, label in (("diff", "V1"), ("diff_v2_matched", "V2")):
            c = rows[v]["vs"]
            said = "{} - softmax {:+.{d}f} [{:+.{d}f}, {:+.{d}f}], p {:.3f}".format(
                label, c["diff"], c["ci_low"], c["ci_high"], c["p_perm"], d=digits)
            assert said in page, (name, said)
        return runs

    # the size trend's small ViT: each variant's test top-1, its gap to softmax (Welch interval, exact permutation p;
    # descriptive, outside the Holm family), every final run flat, and each variant's gain up to the middle size
    xs_runs = size_cell("vit-xs", 2, " %")
    assert all(r["plateau"]["flat"] for r in xs_runs)
    trend = {(p["cell"], p["variant"]): p for p in plan.size_trend(root / plan.RECORDS, plan.CELLS)["vit"]}
    gains = [trend["vit", v]["mean"] - trend["vit-xs", v]["mean"] for v in plan.MAIN]
    assert "softmax gained {:+.2f} points, V1 {:+.2f} and V2 {:+.2f}".format(*gains) in page
    # the smallest LM at 4,000 steps: final runs flat per variant, and its budget check's seed-0 losses
    lm_xs = size_cell("lm-xs", 3, " nats")
    flat = {v: sum(r["plateau"]["flat"] for r in lm_xs if r["variant"] == v) for v in plan.MAIN}
    assert "4 of softmax's 5 final runs met the plateau rule, 2 of V2's and none of V1's" in page
    assert flat == {"softmax": 4, "diff": 0, "diff_v2_matched": 2}, flat

    def quoted_check(cell: str) -> dict[str, dict]:
        """``cell``'s budget check per variant; the page quotes its means ("from a to b for softmax, ...")."""
        check = {r["variant"]: r for r in plan.budget_checks(root / plan.RECORDS, plan.CELLS) if r["cell"] == cell}
        said = "from {:.3f} to {:.3f} for softmax, {:.3f} to {:.3f} for V1 and {:.3f} to {:.3f} for V2".format(
            *(check[v][k] for v in plan.MAIN for k in ("budget", "longer")))
        assert said in page, said
        return check

    def quoted_v1_moves(cell: str) -> tuple[list[float], dict, list[str]]:
        """V1's validation-loss move, seed by seed (0-2), from its run in ``cell`` to the same seed's in ``cell``'s
        check (the page quotes them), with the check's records and the runs' names."""
        record = _records(f"{cell}-2x")
        source = _records(cell)
        runs = [run_name("diff", source["best"]["diff"]["lr"], s) for s in range(3)]
        moved = [plan.metric_value(record["runs"][n], "val/loss") - plan.metric_value(source["runs"][n], "val/loss")
                 for n in runs]
        assert "V1's seeds moved by {:+.3f}, {:+.3f} and {:+.3f}".format(*moved) in page
        return moved, record, runs

    check = quoted_check("lm-xs")
    assert all(check[v]["flat_longer"] for v in plan.MAIN)
    # the smallest LM at 8,000 steps: flat counts, and its three-seed check (means, each seed paired with its own
    # grid run; V1's per-seed changes)
    lm_xs_8k = size_cell("lm-xs-8k", 3, " nats")
    flat = {v: sum(r["plateau"]["flat"] for r in lm_xs_8k if r["variant"] == v) for v in plan.MAIN}
    assert flat == {"softmax": 3, "diff": 0, "diff_v2_matched": 0} and "Only 3 of softmax's 5 final runs" in page
    check = quoted_check("lm-xs-8k")
    assert all(check[v]["seeds"] == [0, 1, 2] for v in plan.MAIN)
    gains = {v: check[v]["budget"] - check[v]["longer"] for v in plan.MAIN}
    tolerance = PLATEAU_TOL * check["diff"]["budget"]  # "V1 gains twice the rule's tolerance and the other two do not"
    assert gains["diff"] > 2 * tolerance - 0.001 and gains["softmax"] < tolerance and gains["diff_v2_matched"] < tolerance
    quoted_v1_moves("lm-xs-8k")
    # the smallest LM at 16,000 steps: no final run flat, the mean tail gains at 16,000 and 8,000 steps, and what
    # doubling the steps did to each variant's mean test loss
    lm_xs_16k = size_cell("lm-xs-16k", 3, " nats")
    assert not any(r["plateau"]["flat"] for r in lm_xs_16k) and "None of the 15 final runs met the plateau rule" in page

    def per_variant(runs: list[dict], value) -> dict[str, float]:
        return {v: sum(x := [value(r) for r in runs if r["variant"] == v]) / len(x) for v in plan.MAIN}

    tail = {n: per_variant(runs, lambda r: r["plateau"]["gain"]) for n, runs in (("8k", lm_xs_8k), ("16k", lm_xs_16k))}
    assert "fell by {:.3f} (softmax), {:.3f} (V1) and {:.3f} (V2) nats on average".format(
        *(tail["16k"][v] for v in plan.MAIN)) in page
    assert "no less than at 8,000 steps ({:.3f}, {:.3f}, {:.3f})".format(*(tail["8k"][v] for v in plan.MAIN)) in page
    assert all(tail["16k"][v] >= tail["8k"][v] for v in plan.MAIN)  # "no less than"
    test = {n: per_variant(runs, lambda r: plan.metric_value(r, "test/loss"))
            for n, runs in (("8k", lm_xs_8k), ("16k", lm_xs_16k))}
    assert "Doubling the steps moved test loss by {:+.3f} (softmax), {:+.3f} (V1) and {:+.3f} (V2) nats".format(
        *(test["16k"][v] - test["8k"][v] for v in plan.MAIN)) in page
    # ... and its three-seed check at 32,000 steps: means (each seed paired with its own run at 16,000), no mean gain
    # of the tolerance, V1's per-seed moves, and one flat run of three per variant
    check = quoted_check("lm-xs-16k")
    assert all(check[v]["seeds"] == [0, 1, 2] and check[v]["flat_longer_n"] == 1 for v in plan.MAIN)
    gains = {v: check[v]["budget"] - check[v]["longer"] for v in plan.MAIN}
    assert all(g < PLATEAU_TOL * check[v]["budget"] for v, g in gains.items())  # "No variant's mean improved by the tolerance"
    assert gains["softmax"] > 0 >= max(gains["diff"], gains["diff_v2_matched"])  # "only softmax's improved at all"
    assert "by {:+.3f} (softmax), {:+.3f} (V1) and {:+.3f} (V2) nats".format(*(-gains[v] for v in plan.MAIN)) in (
        root / "docs" / "study.md").read_text()
    moved, record, runs = quoted_v1_moves("lm-xs-16k")
    assert record["runs"][runs[2]]["plateau"]["flat"] and f"settled {moved[2]:.3f} nats worse" in page
    # the smallest LM (10 k): no final run flat, the mean tail gains, and the size trend's reading of the LM: each
    # variant's test loss per size, the gaps to softmax, and the parameters each needs for softmax's smallest loss
    lm_xxs = size_cell("lm-xxs", 3, " nats")
    assert not any(r["plateau"]["flat"] for r in lm_xxs)  # "None of the 15 final runs met the plateau rule"
    xxs_tail = per_variant(lm_xxs, lambda r: r["plateau"]["gain"])
    assert "fell over the last fifth of the steps by {:.3f} nats for softmax, {:.3f} for V1 and {:.3f} for V2".format(
        *(xxs_tail[v] for v in plan.MAIN)) in page
    # ... and its three-seed check at 32,000 steps: means (each seed paired with its own run), no run flat, V1's gain
    # just over the tolerance (from two of three seeds) and the others' none, the validation deficits to softmax, and
    # the cell that the check moved the size to
    check = quoted_check("lm-xxs")
    assert all(check[v]["seeds"] == [0, 1, 2] and check[v]["flat_longer_n"] == 0 for v in plan.MAIN)
    gains = {v: check[v]["budget"] - check[v]["longer"] for v in plan.MAIN}
    assert PLATEAU_TOL <= gains["diff"] / check["diff"]["budget"] < 1.05 * PLATEAU_TOL  # "1.03 %, just over ... 1 %"
    assert f"V1's gain is {100 * gains['diff'] / check['diff']['budget']:.2f} % of its loss" in page
    assert max(gains["softmax"], gains["diff_v2_matched"]) < 0.001
    moved, _, _ = quoted_v1_moves("lm-xxs")
    assert sum(m < 0 for m in moved) == 2  # "it comes from two of its three seeds"
    deficit = {k: {v: check[v][k] - check["softmax"][k] for v in ("diff", "diff_v2_matched")}
               for k in ("budget", "longer")}
    assert "V1's validation deficit to softmax fell from {:.3f} to {:.3f} nats, V2's stayed at {:.3f}-{:.3f}".format(
        deficit["budget"]["diff"], deficit["longer"]["diff"], *sorted(deficit[k]["diff_v2_matched"]
                                                                     for k in ("budget", "longer"))) in page
    assert plan.cell_named("lm-xxs").superseded_by == "lm-xxs-32k"
    # ... and the same size at 32,000 steps (`lm-xxs-32k`), complete: each variant's grid means (its best inside,
    # V2's grown once at the lower edge by a margin of 0.0001 nats), the finals' means, intervals and permutation p,
    # the change from 16,000 steps per variant, the plateau counts and tail gains, and what its own runs took
    prose = " ".join(page.split())
    xxs32 = _records("lm-xxs-32k")
    lm_xxs32 = size_cell("lm-xxs-32k", 3, " nats")
    best = xxs32["best"]
    assert {v: best[v]["lr"] for v in plan.MAIN} == {"softmax": 0.064, "diff": 0.064, "diff_v2_matched": 0.016}
    lrs = {v: sorted(best[v]["by_lr"], key=float) for v in plan.MAIN}
    assert lrs["softmax"] == lrs["diff"] == ["0.032", "0.064", "0.128"]
    assert lrs["diff_v2_matched"] == ["0.008", "0.016", "0.032", "0.064"] and xxs32["grid_lrs"]["diff_v2_matched"][0] == 0.008
    assert all(g["n"] == 3 for v in plan.MAIN for g in best[v]["by_lr"].values())
    assert all(lrs[v][0] != str(best[v]["lr"]) != lrs[v][-1] for v in plan.MAIN)  # "all inside their grids"
    grid32 = {v: " / ".join(f"{best[v]['by_lr'][lr]['mean']:.3f}" for lr in lrs[v]) for v in plan.MAIN}
    assert " ".join(f"""softmax {grid32['softmax']} at 3.2e-2 / 6.4e-2 / 1.28e-1, V1 {grid32['diff']} at the same lrs,
        V2 {grid32['diff_v2_matched']} at 8e-3 / 1.6e-2 / 3.2e-2 / 6.4e-2""".split()) in prose
    v2_means = {lr: g["mean"] for lr, g in best["diff_v2_matched"]["by_lr"].items()}
    assert f"{v2_means['0.032'] - v2_means['0.016']:.4f}" == "0.0001"  # "ahead of 3.2e-2 by 0.0001 nats"
    v1_v2 = next(r["vs"] for r in tables.comparison_rows(FAMILIES["lm"], lm_xxs32, "diff", "test/loss")
                 if r["variant"] == "diff_v2_matched")
    assert "V2 - V1 {:+.3f} [{:+.3f}, {:+.3f}], p {:.3f}".format(
        v1_v2["diff"], v1_v2["ci_low"], v1_v2["ci_high"], v1_v2["p_perm"]) in prose
    finals32, finals16 = _final_losses("lm-xxs-32k"), _final_losses("lm-xxs")
    moved = [statistics.mean(finals32[v]) - statistics.mean(finals16[v]) for v in plan.MAIN]
    assert "test loss moved by {:+.3f} (softmax), {:+.3f} (V1) and {:+.3f} (V2) nats".format(*moved) in prose
    gap = {(n, v): welch(f[v], f["softmax"]) for n, f in (("16k", finals16), ("32k", finals32))
           for v in ("diff", "diff_v2_matched")}
    assert all(gap["16k", v]["ci_low"] > 0 for v in ("diff", "diff_v2_matched"))  # "both intervals above zero"
    assert all(gap["32k", v]["ci_low"] < 0 < gap["32k", v]["ci_high"] for v in ("diff", "diff_v2_matched"))
    assert ("at twice the steps the differential variants' deficit at 10 k shrank from {:+.3f} (V1) and {:+.3f} (V2) "
            "to {:+.3f} and {:+.3f}, and neither interval excludes zero now").format(
        gap["16k", "diff"]["diff"], gap["16k", "diff_v2_matched"]["diff"], gap["32k", "diff"]["diff"],
        gap["32k", "diff_v2_matched"]["diff"]) in prose
    flat = {v: sum(r["plateau"]["flat"] for r in lm_xxs32 if r["variant"] == v) for v in plan.MAIN}
    assert flat == {"softmax": 0, "diff": 0, "diff_v2_matched": 1}  # "Only 1 of the 15 final runs (one of V2's)"
    tail32 = per_variant(lm_xxs32, lambda r: r["plateau"]["gain"])
    assert "validation loss still fell by {:.3f} (softmax), {:.3f} (V1) and {:.3f} (V2) nats on average".format(
        *(tail32[v] for v in plan.MAIN)) in prose
    assert all(abs(tail32[v] - xxs_tail[v]) < 0.006 for v in ("softmax", "diff"))  # "about as much as at 16,000 steps"
    own = [r for r in xxs32["runs"].values() if not r.get("adopted_from")]
    adopted = [r["adopted_from"] for r in xxs32["runs"].values() if r.get("adopted_from")]
    assert len(own) == 36 and adopted == ["lm-xxs-2x"] * 9  # "45 runs, 9 of them `lm-xxs-2x`'s"
    took = {v: [r["seconds"] / 60 for r in lm_xxs32 if r["variant"] == v] for v in plan.MAIN}
    assert (f"other 36 took {sum(r['seconds'] for r in own) / 3600:.1f} CPU-thread hours, "
            f"{min(r['seconds'] for r in own) / 60:.0f}-{max(r['seconds'] for r in own) / 60:.0f} minutes each (final "
            "runs: softmax {:.0f}-{:.0f}, V1 {:.0f}-{:.0f}, V2 {:.0f}-{:.0f})".format(
                *(f(took[v]) for v in plan.MAIN for f in (min, max)))) in prose
    # its own check at 64,000 steps, complete: the means over seeds 0-2 (each paired with its own run at 32,000), no
    # mean lower than at 32,000 steps, no 64,000-step run flat and their tail gains, what the runs took and where
    check = quoted_check("lm-xxs-32k")
    assert all(check[v]["seeds"] == [0, 1, 2] and check[v]["flat_longer_n"] == 0 for v in plan.MAIN)
    assert all(check[v]["longer"] > check[v]["budget"] for v in plan.MAIN)  # "No variant's mean improved at all"
    assert f"(softmax's by {100 * (check['softmax']['longer'] / check['softmax']['budget'] - 1):.0f} %)" in prose
    assert f"{PLATEAU_TOL * min(check[v]['budget'] for v in plan.MAIN):.3f}" == "0.016"  # "(1 %, about 0.016 nats)"
    runs64 = list(_records("lm-xxs-32k-2x")["runs"].values())
    tails = [r["plateau"]["gain"] for r in runs64]
    assert len(runs64) == 9 and not any(r["plateau"]["flat"] for r in runs64)
    assert f"validation loss still fell by {min(tails):.3f}-{max(tails):.3f} nats over their last fifth" in prose
    minutes = [r["seconds"] / 60 for r in runs64]
    assert (f"(9 runs, {sum(r['seconds'] for r in runs64) / 3600:.1f} CPU-thread hours, {min(minutes):.0f}-"
            f"{max(minutes):.0f} minutes each,") in prose
    machines = {v: {r["code"]["cpu_model"].split()[0] for r in runs64 if r["variant"] == v} for v in plan.MAIN}
    assert machines == {"softmax": {"Intel(R)"}, "diff": {"Intel(R)"}, "diff_v2_matched": {"AMD"}}
    assert "softmax's and V1's on Intel Xeon, V2's on AMD EPYC" in prose
    assert plan.cell_epochs(plan.cell_named("lm-xxs-32k-2x")) == 16 * plan.cell_epochs(plan.cell_named("lm"))
    assert "passes over the corpus sixteen times as often as the task's 4,000 steps do" in prose
    assert "its check at 64,000 (`lm-xxs-32k-2x`) lowered no variant's mean validation loss, so that point stands" in prose
    # needle's softmax grid as far as the in-progress paragraph quotes it: every seed's validation exact match per
    # lr (seeds 0 / 1 / 2) and the lrs' means, as the study's lr selection computes them from the records
    needle = _records("needle")
    def grid(name: str) -> dict:
        """Cell ``name``'s grid in its records, per variant as the study's lr selection gives it: its best lr and,
        per lr, every seed's validation score (by seed) and their mean."""
        cell = plan.cell_named(name)
        runs = sorted((r for r in _records(name)["runs"].values() if r["seed"] < plan.FINAL_SEED), key=lambda r: r["seed"])
        return tables.best_lrs(FAMILIES[cell.family], runs)

    needle_grids = grid("needle")
    words = " ".join(page.split())  # the page's prose with its line breaks as spaces

    def needle_grid(variant: str) -> dict:
        """``variant``'s grid in needle's records, per lr."""
        return needle_grids[variant]["by_lr"]

    def means(grid: dict, lrs: list[float]) -> str:
        """``grid``'s means at ``lrs`` as the page writes them: "a / b / c", one decimal."""
        return " / ".join(f"{grid[lr]['mean']:.1f}" for lr in lrs)

    def grid_means(grid: dict) -> str:
        """The page's "(grid means ... %)" for ``grid`` over the quoted lrs."""
        return f"(grid means {means(grid, quoted_lrs)} %)"

    success = FAMILIES["needle"].success
    by_lr = needle_grid("softmax")
    quoted_lrs = [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
    for lr in quoted_lrs:
        assert by_lr[lr]["n"] == 3 and "{:.1f} / {:.1f} / {:.1f}".format(*by_lr[lr]["values"]) in page, lr
    assert grid_means(by_lr) in page
    v1_grid = needle_grid("diff")
    assert "V1's grid so far: {:.1f} / {:.1f} / {:.1f} % at 5e-4, {:.1f} / {:.1f} / {:.1f} at 1e-3".format(
        *v1_grid[5e-4]["values"], *v1_grid[1e-3]["values"]) in page
    assert max(x for lr in (5e-4, 1e-3) for x in v1_grid[lr]["values"]) < success  # "none retrieving"
    at_2e3 = v1_grid[2e-3]["values"]
    assert sum(x >= success for x in at_2e3) == 2  # "two of the three" retrieve
    assert "{:.1f} / {:.1f} / {:.1f} at 2e-3, the first V1 runs to retrieve (two of the three)".format(*at_2e3) in page
    assert "{:.1f} / {:.1f} / {:.1f} at 4e-3 and {:.1f} / {:.1f} / {:.1f} at 8e-3".format(
        *v1_grid[4e-3]["values"], *v1_grid[8e-3]["values"]) in page
    assert grid_means(v1_grid) in page
    assert max(v1_grid, key=lambda lr: v1_grid[lr]["mean"]) == 2e-3  # "its best lr is 2e-3, inside the grid"
    v2_grid = needle_grid("diff_v2_matched")
    assert [sum(x >= success for x in v2_grid[lr]["values"]) for lr in quoted_lrs] == [0, 2, 0, 0, 1]
    assert all(v2_grid[lr]["n"] == 3 for lr in quoted_lrs)
    assert ("V2's grid is complete: {:.1f} / {:.1f} / {:.1f} % at 5e-4 (none retrieving), {:.1f} / {:.1f} / {:.1f} at 1e-3 "
            "(two of the three retrieve), {:.1f} / {:.1f} / {:.1f} at 2e-3 and {:.1f} / {:.1f} / {:.1f} at 4e-3 (none) and "
            "{:.1f} / {:.1f} / {:.1f} at 8e-3 (one)").format(*(x for lr in quoted_lrs for x in v2_grid[lr]["values"])) in page
    assert grid_means(v2_grid) in page
    assert max(v2_grid, key=lambda lr: v2_grid[lr]["mean"]) == 1e-3  # "its best lr is 1e-3, inside the grid"
    assert max(by_lr, key=lambda lr: by_lr[lr]["mean"]) == 1e-3  # softmax's finals at "its best lr, 1e-3"
    def needle_finals(variant: str, lr: float) -> str:
        """``variant``'s final seeds in needle's records, all at ``lr`` and seeds 100-107: their test scores as the
        page quotes them ("a / b / ... %"), after checking that a given number of them retrieve."""
        runs = sorted((r for r in needle["runs"].values() if r["variant"] == variant and r["seed"] >= plan.FINAL_SEED),
                      key=lambda r: r["seed"])
        assert {r["lr"] for r in runs} == {lr} and [r["seed"] for r in runs] == list(range(100, 108)), variant
        scores = [FAMILIES["needle"].scale * metric_value(r, FAMILIES["needle"].test_metric) for r in runs]
        assert sum(x >= success for x in scores) == retrieving[variant]
        return " / ".join(f"{x:.1f}" for x in scores)

    retrieving = {"softmax": 3, "diff": 2, "diff_v2_matched": 1}  # "three of the eight", "two", "one"
    assert f"test exact match {needle_finals('softmax', 1e-3)} % (seeds 100-107)" in page
    assert sum(x >= success for x in by_lr[1e-3]["values"]) == 1  # "close to the one seed in three of its grid"
    assert f"V1's eight at its best lr, 2e-3: {needle_finals('diff', 2e-3)} % (seeds 100-107)" in page
    assert f"V2's eight at its best lr, 1e-3: {needle_finals('diff_v2_matched', 1e-3)} % (seeds 100-107)" in page
    # the row's two readings as the prose gives them: counts with Fisher's p, means with Welch's CI and the exact
    # permutation p, neither surviving the study's Holm; and the flat counts behind "a longer budget"
    needle_rows = {r["variant"]: r for r in result["cells"]["needle"]["rows"]}
    counts = {v: sum(x >= success for x in needle_rows[v]["values"]) for v in plan.MAIN}
    assert counts == retrieving
    assert "softmax 3, V1 2 and V2 1 of 8, Fisher's exact p {:.3f} (V1) and {:.3f} (V2)".format(
        *(fisher_exact(counts[v], 8, counts["softmax"], 8) for v in ("diff", "diff_v2_matched"))) in words
    assert [fisher_exact(k, 8, 3, 8) < 0.05 for k in range(9)] == [False] * 8 + [True]  # "only ... all 8 seeds"
    v1_vs, v2_vs = (needle_rows[v]["vs"] for v in ("diff", "diff_v2_matched"))
    assert ("V1 - softmax {:+.1f} [{:+.1f}, {:+.1f}] points (Welch 95 % CI), exact permutation p {:.3f}, and V2 - softmax "
            "{:+.1f} [{:+.1f}, {:+.1f}], p {:.3f}, neither surviving").format(
        *(x for c in (v1_vs, v2_vs) for x in (c["diff"], c["ci_low"], c["ci_high"], c["p_perm"]))) in words
    assert all(needle_rows[v]["p_holm_study"] >= 0.05 for v in plan.MAIN[1:])
    flat = [sum(x["flat"] for x in needle_rows[v]["plateau"]) for v in plan.MAIN]
    assert f"only {sum(flat)} of the 24 final runs met the plateau rule (softmax {flat[0]}, V1 {flat[1]} and V2 {flat[2]} of 8" in words
    assert [sum(x >= success for x in needle_grid(v)[lr]["values"]) for v, lr in
            (("softmax", 1e-3), ("diff", 2e-3), ("diff_v2_matched", 1e-3))] == [1, 2, 2]  # "2 of 3 each ... 1 of 3"
    # needle's budget check: seed 0 per variant at 8,000 steps, each against its own grid run (validation exact match
    # at both budgets), all six flat; when every take-off happened, and the check's floor runs staying on the floor
    check = _check_rows("needle-2x")
    scale = FAMILIES["needle"].scale
    assert all(check[v]["seeds"] == [0] and check[v]["flat_n"] == check[v]["flat_longer_n"] == 1
               for v in plan.MAIN)
    assert "from {:.1f} to {:.1f} % for softmax (on the floor at both budgets), from {:.1f} to {:.1f} for V1 (retrieving at " \
           "4,000 steps, on the floor at 8,000) and from {:.1f} to {:.1f} for V2 (the reverse)".format(
               *(check[v][k] for v in plan.MAIN for k in ("budget", "longer"))) in words
    assert [(check[v]["budget"] >= success, check[v]["longer"] >= success) for v in plan.MAIN] == [
        (False, False), (True, False), (False, True)]  # "changed which seed retrieved, not how many"
    needle_2x = _records("needle-2x")
    curves = [r["curves"]["val/needle_acc"] for rec in (needle, needle_2x) for r in rec["runs"].values()]
    take_offs = [next(step + 1 for step, x in curve if x >= success / scale) for curve in curves
                 if any(x >= success / scale for _, x in curve)]
    first, last = min(take_offs), max(take_offs)
    assert f"{len(take_offs)} runs of {len(curves)}) came between step {first:,} and step {last:,}" in words
    for v in ("softmax", "diff"):
        floor = needle_2x["runs"][run_name(v, check[v]["lr"], 0)]["curves"]["val/needle_acc"]
        assert max(x for step, x in floor if step + 1 >= 2000) < 0.3 and floor[-1][0] + 1 == 8000, v  # "stayed there"
    # the 320-epoch speech cell's grids as far as the page quotes them: each lr's mean over its 3 seeds, best 2e-3
    speech_grid = grid("speech-320ep")
    for v, label in (("softmax", "softmax"), ("diff", "V1")):
        by = speech_grid[v]["by_lr"]
        assert [by[lr]["n"] for lr in quoted_lrs] == [3] * 5 and speech_grid[v]["lr"] == 2e-3, v
        assert f"{label} {means(by, quoted_lrs)}" in words
    v2_speech = speech_grid["diff_v2_matched"]["by_lr"]  # "V2's grid ... best at 8e-3 inside it"
    v2_lrs = [*quoted_lrs, 1.6e-2]
    assert sorted(v2_speech) == v2_lrs and [v2_speech[lr]["n"] for lr in v2_lrs] == [3] * 6
    assert max(quoted_lrs, key=lambda lr: v2_speech[lr]["mean"]) == 8e-3  # best at the first five's edge
    assert speech_grid["diff_v2_matched"]["lr"] == 8e-3
    assert f"V2's grid, {means(v2_speech, v2_lrs)} % at 5e-4 / 1e-3 / 2e-3 / 4e-3 / 8e-3 / 1.6e-2" in words
    noisy_softmax = grid("speech-noisy")["softmax"]  # "-10 dB ... softmax's grid is complete ... best at 2e-3"
    assert sorted(noisy_softmax["by_lr"]) == quoted_lrs
    assert [noisy_softmax["by_lr"][lr]["n"] for lr in quoted_lrs] == [3] * 5
    assert noisy_softmax["lr"] == 2e-3 == speech_grid["softmax"]["lr"]
    assert (f"softmax's grid is complete: {means(noisy_softmax['by_lr'], quoted_lrs)} % at 5e-4 / 1e-3 / 2e-3 / 4e-3 / "
            "8e-3, best at 2e-3") in words
    noisy_v1 = grid("speech-noisy")["diff"]  # "V1's grid is complete too ... best at 4e-3 inside it"
    assert sorted(noisy_v1["by_lr"]) == quoted_lrs and [noisy_v1["by_lr"][lr]["n"] for lr in quoted_lrs] == [3] * 5
    assert noisy_v1["lr"] == 4e-3 == 2 * speech_grid["diff"]["lr"]
    assert f"V1's grid is complete too: {means(noisy_v1['by_lr'], quoted_lrs)} % at the same lrs, best at 4e-3" in words
    # the LM's size trend with the 10 k point at 32,000 steps: each variant's loss per size, every gap to softmax
    # (only V1's at 111 k with a Welch interval above zero), their range, and the parameters each variant needs
    # for softmax's loss at the two smaller sizes
    lm_sizes = ("lm-xxs-32k", "lm-xs-16k", "lm")
    lm_trend = plan.size_trend(root / plan.RECORDS, plan.CELLS)["lm"]
    assert {p["cell"] for p in lm_trend} == set(lm_sizes)
    by_size = {(p["cell"], p["variant"]): p for p in lm_trend}
    for v, label in (("softmax", "Softmax"), ("diff", "V1"), ("diff_v2_matched", "V2")):
        losses = " / ".join(f"{by_size[c, v]['mean']:.3f}" for c in lm_sizes)
        assert f"{label} {losses}" in page, (v, losses)
    gaps = {v: [by_size[c, v]["mean"] - by_size[c, "softmax"]["mean"] for c in lm_sizes] for v in ("diff", "diff_v2_matched")}
    assert "V1 by {:+.3f}, {:+.3f} and {:+.3f} nats, V2 by {:+.3f}, {:+.3f} and {:+.3f} at 10 k / 32 k / 111 k".format(
        *gaps["diff"], *gaps["diff_v2_matched"]) in words
    every = [g for v in gaps for g in gaps[v]]
    assert min(every) > 0 and f"trail softmax by {min(every):.3f}-{max(every):.3f} nats" in words
    above = {(c, v) for c in lm_sizes for v in ("diff", "diff_v2_matched")
             if welch(*(_final_losses(c, (v, "softmax")).values()))["ci_low"] > 0}
    assert above == {("lm", "diff")}  # "only V1's at 111 k ... has an interval above zero"
    def needs(cell: str) -> tuple[list[float], int]:
        """The parameters V1 and V2 need for softmax's loss at ``cell``'s size, and softmax's parameters there."""
        n = by_size[cell, "softmax"]["parameters"]
        x = [plan.parameters_for(lm_trend, v, by_size[cell, "softmax"]["mean"], False) for v in ("diff", "diff_v2_matched")]
        assert all(x) and all(k > n for k in x), (cell, x)
        return x, n

    (v1_n, v2_n), n = needs("lm-xxs-32k")
    assert (f"V1 needs about {v1_n / 1e3:.1f} k parameters and V2 about {v2_n / 1e3:.1f} k for the loss softmax "
            f"reaches with 10 k ({v1_n / n:.2f}x and {v2_n / n:.2f}x)") in words
    (v1_n, v2_n), n = needs("lm-xs-16k")
    assert f"and at 32 k {v1_n / n:.2f}x and {v2_n / n:.2f}x" in words
    # the largest ViT (1.8 M): every final run flat, V2 against V1, and the size trend's reading of the ViT (each
    # variant's top-1 per size and its gain from the middle size to the largest)
    vit_l = size_cell("vit-l", 2, " %")
    assert all(r["plateau"]["flat"] for r in vit_l)  # "All 15 final runs met the plateau rule"
    vit = FAMILIES["vit"]
    c = next(r["vs"] for r in tables.comparison_rows(vit, vit_l, "diff", vit.test_metric)
             if r["variant"] == "diff_v2_matched")
    assert "V2 - V1 {:+.2f} [{:+.2f}, {:+.2f}], p {:.3f}".format(
        c["diff"], c["ci_low"], c["ci_high"], c["p_perm"]) in page
    vit_trend = {(p["cell"], p["variant"]): p for p in plan.size_trend(root / plan.RECORDS, plan.CELLS)["vit"]}
    for v, label in (("softmax", "Softmax"), ("diff", "V1"), ("diff_v2_matched", "V2")):
        tops = " / ".join(f"{vit_trend[c, v]['mean']:.2f}" for c in ("vit-xs", "vit", "vit-l"))
        assert f"{label} {tops}" in page, (v, tops)
    gains = [vit_trend["vit-l", v]["mean"] - vit_trend["vit", v]["mean"] for v in plan.MAIN]
    assert "softmax gained {:+.2f} points, V1 {:+.2f} and V2 {:+.2f}".format(*gains) in page
    # the cells whose first final softmax run was trained again with today's code, every metric identical
    verified = json.loads((root / plan.RECORDS / "verify.json").read_text())

    def verified_rows(named: list[str], variant: str, day: str = "2026-12-02") -> tuple[list[dict], str]:
        """verify.json's rows of ``variant``'s first final run in each named cell, trained again on ``day`` (an
        entry kept from another machine counts), and the page's list of the cells."""
        rows = []
        for name in named:
            record = _records(name)
            first = min((r for r in plan.final_runs(record) if r["variant"] == variant), key=lambda r: r["seed"])
            rows += next(e for e in plan.verify_entries(verified[name][first["name"]])
                         if e["when"].startswith(day))["rows"]
        return rows, f"`{'`, `'.join(named[:-1])}` and `{named[-1]}`"

    named = ["lm", "mqar", "vit", "vit-40ep", "lm-2k", "cluttered-30ep"]  # trained again on 2026-12-02, identical
    rows, listed = [], ""
    for variant in plan.MAIN:  # each variant's first final run in each named cell (a KeyError if one is missing)
        found, listed = verified_rows(named, variant)
        rows += found
    assert f"{listed}: every validation and test metric of all {3 * len(named)} runs" in page
    assert all(r["identical"] for r in rows) and f"({len(rows)} metrics;" in page
    for name in ("clip", "speech-40ep"):  # trained again the same day, not identical: the page says how many were
        rows = [r for variant in plan.MAIN for r in verified_rows([name], variant)[0]]
        assert f"`{name}`: {sum(r['identical'] for r in rows)} of {len(rows)} metrics identical" in page
    # trained again on 2026-12-03 on another machine: what the page says of each cell, from verify.json
    again = {name: [r for variant in plan.MAIN for r in verified_rows([name], variant, "2026-12-03")[0]]
             for name in ("vit-xs", "mqar", "lm", "vit")}
    assert all(r["identical"] for r in again["vit-xs"]) and f"`vit-xs`: all {len(again['vit-xs'])} metrics identical" in page
    for name in ("mqar", "lm", "vit"):
        same = sum(r["identical"] for r in again[name])
        assert f"`{name}`: {same} of {len(again[name])} " in page, name
    moved = {(r["run"].split("_lr")[0], r["metric"]): r for name in ("mqar", "lm") for r in again[name]}
    soft = moved["softmax", "test/acc"]
    assert f"test accuracy {100 * soft['now']:.2f} %) where its record stayed on the 52 % shortcut ({100 * soft['recorded']:.2f} %)" in page
    v1 = moved["diff", "test/loss"]
    assert f"V1's by {v1['now'] - v1['recorded']:+.4f} ({v1['recorded']:.4f} -> {v1['now']:.4f})" in page
    vit_moved = {r["run"].split("_lr")[0]: r for r in again["vit"] if r["metric"] == "test/top1"}
    soft_vit = vit_moved["softmax"]
    assert (f"Test top-1 moved by {100 * (soft_vit['now'] - soft_vit['recorded']):+.2f} points (softmax, "
            f"{100 * soft_vit['recorded']:.2f} -> {100 * soft_vit['now']:.2f} %), "
            f"{100 * (vit_moved['diff']['now'] - vit_moved['diff']['recorded']):+.2f} (V1) and "
            f"{100 * (vit_moved['diff_v2_matched']['now'] - vit_moved['diff_v2_matched']['recorded']):+.2f} (V2)") in page
    vit_sds = " and ".join(f"{r['sd']:.2f}" for v in plan.MAIN for r in result["cells"]["vit"]["rows"] if r["variant"] == v)
    assert f"against sds of {vit_sds.replace(' and ', ', ', 1)} over each variant's 8 final seeds" in page
    lm_cell = result["cells"]["lm"]
    v1_sd = next(r["sd"] for r in lm_cell["rows"] if r["variant"] == "diff")
    assert f"sd of V1's 8 final seeds ({v1_sd:.3f})" in page and 2.5 < (v1["now"] - v1["recorded"]) / v1_sd < 3.5
    # the two kinds of machine the page names, both within vit-l's and lm-xxs's records
    for name in ("vit-l", "lm-xxs"):
        record = _records(name)
        models = {(r.get("code") or {}).get("cpu_model") for r in record["runs"].values()}
        assert {"AMD EPYC", "Intel(R) Xeon(R) Processor"} <= models, (name, models)
    # what the prose says survives Holm: exactly these comparisons, each in its own family (study or earlier budgets)
    survives = {(name, r["variant"]) for name, c in result["cells"].items() if c for r in c["rows"]
                if r.get("p_holm_study", 1.0) < 0.05}
    earlier_survivors = {("lm-2k", "diff"), ("cluttered-30ep", "diff"), ("cluttered-120ep", "diff"),
                         ("speech-0db-320ep", "diff")}
    assert survives == earlier_survivors, survives
    assert " ".join(page.split()).count("significant after Holm's correction over the earlier-budget rows") == 4
    assert all(name in result["earlier"] for name, _ in earlier_survivors)
    # ... and none of the study's family, as the prose says
    assert "the one gap in the study's family" not in page
    assert "no gap at a final budget survives the study's Holm correction so far" in " ".join(page.split())
    # the family grows as cells finish, so the prose gives neither its present size nor a present Holm from it
    # ("the study's Holm (0.134 over 24 comparisons)" went stale when the needle row landed): the generated table does
    assert not re.findall(r"study's Holm[^.]*?\((?:\d\.\d{3} over )?\d+ comparisons\)", page)
    # speech at 80 and at 160 epochs, now earlier budgets: V2's Holm at 80 and V1's at 160 over that table's rows
    speech_v2 = next(r for r in result["cells"]["speech-80ep"]["rows"] if r["variant"] == "diff_v2_matched")
    assert f"over the earlier-budget rows ({speech_v2['p_holm_study']:.3f};" in page
    speech_v1 = next(r for r in result["cells"]["speech-160ep"]["rows"] if r["variant"] == "diff")
    assert f"over the earlier-budget rows ({speech_v1['p_holm_study']:.3f};" in page
    # MQAR's prose counts the final seeds that solved the task (>= 95 % test accuracy)
    mqar = {r["variant"]: r for r in result["cells"]["mqar"]["rows"]}
    solved = {v: sum(x >= 95.0 for x in mqar[v]["values"]) for v in plan.MAIN}
    assert f"softmax solved {solved['softmax']} of 8" in page
    assert f"V1 {solved['diff']} of 8 above 95 %" in page and solved["diff_v2_matched"] == 8
    assert FAMILIES["mqar"].success == 95.0  # the report's count uses the prose's threshold
    p_v1, p_v2 = (fisher_exact(solved[v], 8, solved["softmax"], 8) for v in ("diff", "diff_v2_matched"))
    assert (f"V1's {solved['diff']} of 8 against softmax's {solved['softmax']} of 8 gives p {p_v1:.3f} and V2's "
            f"8 of 8 p {p_v2:.3f}") in page


def test_results_page_table_is_what_the_records_give():
    """The headline table on docs/results.md is regenerated here from the records in the repository."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    on_page = plan.page_table(root / "docs" / "results.md")
    assert on_page, "docs/results.md lost its study-table markers"
    records = root / plan.RECORDS
    result = plan.headline(records, plan.CELLS)
    assert on_page == plan.report_markdown(records, plan.CELLS, result, root / "docs"), (
        "docs/results.md's table differs from the records: python -m recipes.study report --page docs/results.md")


def test_every_recorded_best_lr_is_inside_its_grid():
    """The study's records: each variant's chosen lr has a grid point on both sides (the sweep extends a grid
    whose best lands on an edge, up to its cell's limit; a best still at an edge means that limit was too low)."""
    from pathlib import Path

    records = Path(__file__).resolve().parents[1] / plan.RECORDS
    at_edge = []
    for cell in plan.CELLS:
        if cell.epochs_factor is not None:  # budget checks train one lr per variant, the best of another cell
            continue
        record = plan.load(records, cell)
        for variant, best in (record.get("best") or {}).items():
            lrs = sorted(record["grid_lrs"][variant])
            if best["lr"] is not None and best["lr"] in (lrs[0], lrs[-1]):
                at_edge.append(f"{cell.name} {variant}: {best['lr']:g} on {lrs}")
    assert not at_edge, "best lr at a grid edge: " + "; ".join(at_edge)


def test_the_tie_the_selection_docs_quote_is_speechs_record():
    """docs/study.md's example of a tie in the lr selection: V1's two speech lrs, their mean and sds, and the lr
    the selection takes, as ``best_lrs`` computes them from the speech records."""
    from diffzoo.study import tables

    root = Path(__file__).resolve().parents[1]
    record = plan.load(root / plan.RECORDS, plan.cell_named("speech"))
    grid = [r for r in record["runs"].values() if r["seed"] < plan.FINAL_SEED]
    best = tables.best_lrs(FAMILIES["speech"], grid)["diff"]
    a, b = best["by_lr"][1e-3], best["by_lr"][2e-3]
    assert math.isclose(a["mean"], b["mean"], rel_tol=tables.TIE_REL) and best["lr"] == 2e-3 and b["sd"] < a["sd"]
    assert best["lr"] == record["best"]["diff"]["lr"]
    said = (f"On `speech` V1's 1e-3 and 2e-3 tie at {a['mean']:.2f} % (sd {a['sd']:.2f} and {b['sd']:.2f} points), "
            "and 2e-3 is the choice.")
    assert said in " ".join((root / "docs" / "study.md").read_text().split())


def test_results_page_prose_quotes_a_study_holm_only_as_history():
    """The study's Holm family grows as cells finish, so a Holm value over a family size written into the prose
    goes stale: the prose quotes one only for a cell that has since been replaced ("while this was the final ...
    cell"); a current cell's reading points to the table's p Holm."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text()
    prose = " ".join(text.split("<!-- study-table: end -->", 1)[1].split())
    quotes = list(re.finditer(r"over (?:the study's )?(\d+) comparisons", prose))
    assert quotes, "no historical Holm quotes left: this test's pattern no longer finds what it checks"
    for m in quotes:
        clause = prose[max(0, m.start() - 200):m.start()]
        assert "while this was the final" in clause.rsplit("(", 1)[-1], prose[m.start() - 200:m.end()]


def test_readme_summary_is_what_the_records_give():
    """The README's short table is regenerated here from the records, and its reading of it still holds."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    on_page = plan.page_table(root / "README.md", (plan.SUMMARY_START, plan.SUMMARY_END))
    result = plan.headline(root / plan.RECORDS, plan.CELLS)
    assert on_page and on_page == plan.summary_block(result), (
        "README.md's study summary differs from the records: python -m recipes.study report --page docs/results.md "
        "--summary README.md")
    final = {(name, r["variant"]): r for name, c in result["cells"].items() if c and name not in result["earlier"]
             for r in c["rows"] if "vs" in r}
    words = " ".join(readme.split())
    # what it says survives the study's Holm: nothing so far; V1 at 0 dB and 320 epochs, behind softmax beyond its
    # seeds and its voices, survives the earlier-budget rows' Holm and is trained again at 640 epochs
    assert "No difference between a differential variant and softmax survives the study's Holm correction" in words
    assert [k for k, r in final.items() if r["p_holm_study"] < 0.05] == []
    z320 = next(r for r in result["cells"]["speech-0db-320ep"]["rows"] if r["variant"] == "diff")
    zc = z320["vs"]
    zb, _, zt, zk, check_done = _speech_0db()
    assert "speech-0db-320ep" in result["earlier"] and zc["ci_high"] < 0 and zb["ci_high"] < 0
    assert ("V1 is {:.2f} points of test top-1 behind softmax [{:.2f}, {:.2f}] (Holm over the earlier-budget rows "
            "{:.3f}; with the test voices resampled [{:.2f}, {:.2f}]), every V1 seed below every softmax seed").format(
        -zc["diff"], zc["ci_low"], zc["ci_high"], z320["p_holm_study"], zb["ci_low"], zb["ci_high"]) in words
    assert max(zt["diff"]) < min(zt["softmax"]) and z320["p_holm_study"] < 0.05
    assert ("by the study's rule the 0 dB task is being trained again at 640 epochs (`speech-0db`)" in words
            and not result["cells"].get("speech-0db"))
    # "its check at 640 epochs is being trained" until all its runs are in
    assert check_done != ("its check at 640 epochs is being trained" in words), "the 0 dB check's summary is stale"
    zg = {v: zk[v]["longer"] - zk[v]["budget"] for v in ("softmax", "diff")}
    assert abs(zg["diff"]) <= 1 < zg["softmax"]  # "V1 finished by 320 ... so a short budget does not explain the gap"
    assert (f"its check at 640 epochs found V1 finished by 320 ({zg['diff']:+.2f} points of validation top-1 over three "
            f"seeds) while softmax still gained {zg['softmax']:.2f}, so a short budget does not explain the gap") in words
    earlier = {r["variant"]: r for r in result["cells"]["cluttered-120ep"]["rows"]}
    clut, clut_v2 = earlier["diff"], earlier["diff_v2_matched"]["vs"]
    said = "V1 is {:.2f} points of test top-1 behind softmax [{:+.2f}, {:+.2f}] (Holm over the earlier-budget rows {:.3f}),"
    said = said.format(-clut["vs"]["diff"], clut["vs"]["ci_low"], clut["vs"]["ci_high"], clut["p_holm_study"])
    assert "cluttered-120ep" in result["earlier"] and said in words, said
    assert "V2 is level with it ({:+.2f} [{:+.2f}, {:+.2f}])".format(
        clut_v2["diff"], clut_v2["ci_low"], clut_v2["ci_high"]) in words and clut_v2["ci_low"] < 0 < clut_v2["ci_high"]
    flat = sum(1 for p in clut["plateau"] if p and p["flat"])  # the row's final runs, as the table counts them
    assert flat == 4 and "half of V1's final runs had not flattened" in words  # 4 of V1's 8
    check = _check_rows("cluttered-120ep-2x")
    assert check["diff"]["seeds"] == check["softmax"]["seeds"] == [0, 1, 2]
    gap = [f"{check['diff'][k] - check['softmax'][k]:+.2f}" for k in ("budget", "longer")]
    assert "V1's validation gap over three seeds shrank from {} to {} points".format(*gap) in words, gap
    # cluttered at its final budget, 240 epochs: V1 and V2 against softmax as the README reads them
    clut240 = {r["variant"]: r.get("vs") for r in result["cells"]["cluttered"]["rows"]}
    said = ("V1, with all 8 final seeds in, is {:+.2f} points of test top-1 from softmax [{:+.2f}, {:+.2f}] and V2 is "
            "{:+.2f} [{:+.2f}, {:+.2f}], no difference found for either")
    assert said.format(*(clut240[v][k] for v in ("diff", "diff_v2_matched") for k in ("diff", "ci_low", "ci_high"))) \
        in words
    assert all(clut240[v]["ci_low"] < 0 < clut240[v]["ci_high"] for v in ("diff", "diff_v2_matched"))
    check = _check_rows("cluttered-2x")  # its own check, at 480 epochs
    assert all(r["seeds"] == [0, 1, 2] for r in check.values()) and check["diff"]["longer"] - check["diff"]["budget"] > 1
    gap = [f"{check['diff'][k] - check['softmax'][k]:+.2f}" for k in ("budget", "longer")]
    assert "found V1 still fitting there: its validation gap to softmax shrank from {} to {} points".format(*gap) \
        in words, gap
    # speech at 160 epochs, now an earlier budget: V1's interval excludes zero, its Holm does not, as the README says
    speech = next(r for r in result["cells"]["speech-160ep"]["rows"] if r["variant"] == "diff")
    assert "speech-160ep" in result["earlier"]
    said = ("There V1, with all 8 final seeds in, is {:+.2f} points of test top-1 from softmax [{:+.2f}, {:+.2f}] "
            "(Holm over the earlier-budget rows {:.3f};")
    c = speech["vs"]
    assert said.format(c["diff"], c["ci_low"], c["ci_high"], speech["p_holm_study"]) in words
    assert c["ci_high"] < 0 and speech["p_holm_study"] >= 0.05
    # speech at 320 epochs, V1's finished column: below zero before Holm, not after it nor with the voices resampled
    sp = next(r for r in result["cells"]["speech-320ep"]["rows"] if r["variant"] == "diff")
    c = sp["vs"]
    assert ("there V1, with all 8 final seeds in, is {:+.2f} points of test top-1 from softmax [{:+.2f}, {:+.2f}] (exact "
            "permutation p {:.3f}, which survives neither Holm's correction over the earlier-budget rows, {:.3f}, nor, "
            "while this was the final speech cell, the study's; with the test voices resampled its interval includes "
            "zero)").format(c["diff"], c["ci_low"], c["ci_high"], c["p_perm"], sp["p_holm_study"]) in words
    boot = next(r for r in plan.cell_voice_stats(root / plan.RECORDS, plan.cell_named("speech-320ep"))["rows"]
                if r["variant"] == "diff")
    assert c["ci_high"] < 0 and sp["p_holm_study"] >= 0.05 and boot["bootstrap"]["ci_low"] < 0 < boot["bootstrap"]["ci_high"]
    assert boot["interaction"]["ci_low"] < 0 < boot["interaction"]["ci_high"]  # "its gap does not grow with the noise"
    v2 = next(r for r in result["cells"]["speech-320ep"]["rows"] if r["variant"] == "diff_v2_matched")["vs"]
    assert "V2 is {:+.2f} [{:+.2f}, {:+.2f}] (p {:.3f}), no difference found.".format(
        v2["diff"], v2["ci_low"], v2["ci_high"], v2["p_perm"]) in words and v2["ci_low"] < 0 < v2["ci_high"]
    sp2 = _check_rows("speech-320ep-2x")  # its 640-epoch check: V1 and softmax over their three seeds
    assert sp2["diff"]["seeds"] == sp2["softmax"]["seeds"] == [0, 1, 2]
    gain = {v: sp2[v]["longer"] - sp2[v]["budget"] for v in ("diff", "softmax")}
    assert gain["diff"] > 1 > abs(gain["softmax"])  # "beyond the study's 1-point tolerance"
    gap = [sp2["diff"][k] - sp2["softmax"][k] for k in ("budget", "longer")]
    assert ("At twice the epochs V1 gained {:+.2f} points of validation top-1 over its three seeds (softmax {:+.2f}), "
            "beyond the study's 1-point tolerance, and its validation gap to softmax narrowed from {:+.2f} to {:+.2f} "
            "points").format(gain["diff"], gain["softmax"], *gap) in words and gap[0] < gap[1] < 0
    assert ("so part of V1's speech gap is slower fitting, and speech's budget became 640 epochs (the `speech` cell, "
            "being trained)") in words
    noisy = next(r for r in result["cells"]["speech-noisy"]["rows"] if r["variant"] == "diff")["vs"]
    gap = next(g for g in plan.noise_gaps(root / plan.RECORDS, plan.CELLS) if g["cell"] == "speech-noisy")
    noisy2x = _check_rows("speech-noisy-2x")
    assert ("V1 is {:+.2f} points of test top-1 from softmax [{:+.2f}, {:+.2f}], no difference found, and its gap there "
            "is no wider than on clean speech (it moves by {:+.2f} points [{:+.2f}, {:+.2f}]); but softmax gained "
            "{:.0f} points of validation top-1 there at twice the epochs (three seeds) and V1 {:.0f}, so V1's validation "
            "lead of {:+.2f} points became {:+.2f}").format(
        *(c[k] for c in (noisy, gap["change"]) for k in ("diff", "ci_low", "ci_high")),
        *(noisy2x[v]["longer"] - noisy2x[v]["budget"] for v in ("softmax", "diff")),
        *(noisy2x["diff"][k] - noisy2x["softmax"][k] for k in ("budget", "longer"))) in words
    assert all(r["seeds"] == [0, 1, 2] for r in noisy2x.values())  # "(three seeds)"
    assert noisy["ci_low"] < 0 < noisy["ci_high"] and gap["change"]["ci_low"] < 0 < gap["change"]["ci_high"]
    vit = {r["variant"]: r["vs"] for r in result["cells"]["vit"]["rows"] if "vs" in r and r["variant"] in plan.MAIN}
    assert set(vit) == {"diff", "diff_v2_matched"}  # "both": the sentence reads V1 and V2, not the ablations
    assert all(abs(c["diff"]) < 0.25 and max(abs(c["ci_low"]), abs(c["ci_high"])) < 0.65 for c in vit.values())
    assert ("gap fell to +0.012 nats, ViT digits' from -0.94 to -0.21 points and speech's from -2.08 to -0.59"
            in words)
    speech_v2 = next(r for r in result["cells"]["speech-80ep"]["rows"] if r["variant"] == "diff_v2_matched")
    assert "speech-80ep" in result["earlier"]  # "Holm over the earlier-budget rows"
    assert f"+2.33 [+0.65, +4.00] (Holm over the earlier-budget rows {speech_v2['p_holm_study']:.3f};" in words
    assert "V2 leads softmax by +4.5 points of test retrieval recall and +6.2 of zero-shot top-1" in words
    assert "lead on one seed's validation recall from 9.8 to 1.6 points" in words  # clip-2x, above
    for name, variant, text in (("lm", "diff", "+0.012"), ("vit-40ep", "diff", "-0.94"), ("vit", "diff", "-0.21"),
                                ("lm-2k", "diff", "+0.043"), ("cluttered-30ep", "diff", "-12.7"),
                                ("clip-80ep", "diff_v2_matched", "+4.5"),
                                ("clip-80ep (test/zs_top1)", "diff_v2_matched", "+6.2"),
                                ("clip", "diff", "-0.92"), ("clip (test/zs_top1)", "diff", "+5.42"),
                                ("speech-40ep", "diff", "-2.08"), ("speech-80ep", "diff", "-0.59"),
                                ("speech-80ep", "diff_v2_matched", "+2.33")):
        diff = next(r for r in result["cells"][name]["rows"] if r["variant"] == variant)["vs"]["diff"]
        assert f"{diff:+.{len(text.split('.')[1])}f}" == text, (name, diff)
    for name, cell in result["cells"].items():  # a cell shown with a variant missing is named as still to come
        planned = plan.cell_named(cell["cell"]).variants if cell else ()
        missing = [v for v in plan.MAIN if cell and name not in result["earlier"] and v in planned
                   and v not in {r["variant"] for r in cell["rows"]}]
        assert not missing or f"{cell['cell']} ({' and '.join(missing)})" in on_page.split("Still to come:")[1], name
    # ... and a variant a cell never runs is not: speech at 0 dB compares softmax and V1 only; its row is shown or
    # still to come, never with V2 named as missing
    assert "diff_v2_matched" not in plan.cell_named("speech-0db").variants
    assert "| speech-0db (test/top1) |" in on_page or "speech-0db" in on_page.split("Still to come:")[1]
    named = re.findall(r"speech-0db \(([^)]*)\)", on_page.replace("speech-0db (test", ""))
    assert all(set(n.split(" and ")) <= set(plan.cell_named("speech-0db").variants) for n in named), named
    # CLIP's final cell as the README reads it: V1 and V2 against softmax, no difference found for either
    said = "{:+.2f} points of test retrieval recall [{:+.2f}, {:+.2f}] and {:+.2f} of zero-shot top-1 [{:+.2f}, {:+.2f}]"
    for variant, head, fmt in (("diff", "V1 - softmax is ", said), ("diff_v2_matched", "V2 - softmax ",
                                                                    "{:+.2f} [{:+.2f}, {:+.2f}] and {:+.2f} [{:+.2f}, {:+.2f}]")):
        clip = [next(r for r in result["cells"][n]["rows"] if r["variant"] == variant)["vs"]
                for n in ("clip", "clip (test/zs_top1)")]
        assert head + fmt.format(*(c[k] for c in clip for k in ("diff", "ci_low", "ci_high"))) in words
        assert all(c["ci_low"] < 0 < c["ci_high"] for c in clip), variant  # "no difference found"
    mqar = {r["variant"]: sum(x >= 95.0 for x in r["values"]) for r in result["cells"]["mqar"]["rows"]}
    assert f"V2 solved all 8 of its runs and softmax {mqar['softmax']} of 8" in words
    assert mqar["diff_v2_matched"] == 8
    assert f"V1 solved {mqar['diff']} of 8 runs" in words
    assert all(mqar[v] == 8 for v in ("softmax_wide", "diff_nonorm", "diff_const"))  # "solved 8 of 8 each"
    against_v1 = [a for a in result["cells"]["mqar"]["ablations"] if a["parent"] != "softmax"]
    assert len(against_v1) == 3 and all(a["p_holm_study"] < 0.05 for a in against_v1)  # "all three differ from V1"
    vit_cell = result["cells"]["vit"]
    vit_ablations = [r for r in vit_cell["rows"] if r.get("kind") == "ablation vs softmax"] + vit_cell["ablations"]
    assert "On ViT digits the same three ablations differed from neither softmax nor V1." in words
    assert len(vit_ablations) == 6 and all(a["p_holm_study"] >= 0.05 for a in vit_ablations)
    # the LM's gap at its smallest size (Welch 95 % intervals of final test loss), at 16,000 and 32,000 steps
    def lm_gap(cell: str, variant: str, unit: str = "") -> str:
        finals = _final_losses(cell, ("softmax", variant))
        assert len(finals["softmax"]) == len(finals[variant]) == 5, (cell, variant)
        w = welch(finals[variant], finals["softmax"])
        return "{:+.3f}{} [{:+.3f}, {:+.3f}]".format(w["diff"], unit, w["ci_low"], w["ci_high"])
    assert (f"largest at 16,000 steps (V1 {lm_gap('lm-xxs', 'diff', ' nats')}, V2 {lm_gap('lm-xxs', 'diff_v2_matched')}, "
            f"5 seeds each, outside the Holm family) and at 32,000 steps is V1 {lm_gap('lm-xxs-32k', 'diff')}, V2 "
            f"{lm_gap('lm-xxs-32k', 'diff_v2_matched')}; the paper reports") in words


def test_report_page_replaces_only_the_marked_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n{plan.PAGE_START}\nold table\n{plan.PAGE_END}\nafter\n")
    plan.update_page(page, "new table")
    assert page.read_text() == f"# Title\n\nbefore\n{plan.PAGE_START}\nnew table\n{plan.PAGE_END}\nafter\n"
    assert plan.page_table(page) == "new table"
    page.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="markers|one line"):
        plan.update_page(page, "x")
    assert page.read_text() == "no markers here\n"  # nothing is lost when the page has no place for the table
    with pytest.raises(SystemExit):
        plan.main(["report", "--cells", "vit", "--page", str(page)])  # a part of the study is not the page's table


def _study_with_two_trainings_started(tmp_path, rest: str, main: str):
    """A study process whose ``main`` (a line of Python) runs ``run(on_result)``: four trainings, two at a time,
    each writing its pid into ``tmp_path/started`` and then running ``rest``. Returned once the first two started."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    started = tmp_path / "started"
    started.mkdir()
    training = f"import os, time; open(os.path.join({str(started)!r}, str(os.getpid())), 'w').close()\n{rest}"
    script = tmp_path / "study.py"
    script.write_text(
        "import json, sys\n"
        "from pathlib import Path\n"
        "from diffzoo.study.runs import main_with_signals, run_jobs, train\n"
        f"def run(on_result=None): return run_jobs([0, 1, 2, 3], lambda i: train([sys.executable, '-c', {training!r}], "
        f"Path({str(tmp_path)!r}) / f'{{i}}.log'), 2, on_result)\n"
        f"{main}\n")
    # SIGINT at its default, as in a terminal (a test run in the background would pass SIGINT on ignored)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=Path(__file__).resolve().parents[1],
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while len(list(started.iterdir())) < 2 and time.time() < deadline:
        time.sleep(0.1)
    assert len(list(started.iterdir())) == 2, "the two trainings did not start"
    return proc, started


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_killed_study_stops_its_trainings(tmp_path, signum):
    """SIGTERM or Ctrl-C to a study process terminates the training processes it started instead of orphaning
    them (or recording them as failed), and starts none of the trainings still queued behind them."""
    import os
    import time
    from pathlib import Path

    proc, started = _study_with_two_trainings_started(tmp_path, "time.sleep(120)", "main_with_signals(run)")
    children = [int(p.name) for p in started.iterdir()]
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and f"stopped by signal {int(signum)}; 2 training(s) terminated" in err, err
    assert "KeyboardInterrupt" not in err

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()  # a zombie has ended
        except (ProcessLookupError, FileNotFoundError):
            return False

    assert not [pid for pid in children if alive(pid)], "a training process outlived the study"
    time.sleep(1)
    assert len(list(started.iterdir())) == 2, "a queued training started after the study was stopped"


def test_sigusr1_lets_the_trainings_running_finish_and_starts_no_more(tmp_path):
    """SIGUSR1 to a study process: the two trainings running go on to their end and their results are handed on
    (saved), the two queued behind them never start, and the command exits with a message saying so."""
    import json
    import signal
    import time

    ended = tmp_path / "ended"
    ended.mkdir()
    go = tmp_path / "go"  # the trainings end once this file exists (after the signal has been sent)
    saved = tmp_path / "saved.json"
    rest = (f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
            f"open(os.path.join({str(ended)!r}, str(os.getpid())), 'w').close()")
    proc, started = _study_with_two_trainings_started(
        tmp_path, rest, f"main_with_signals(lambda: run(lambda done: Path({str(saved)!r}).write_text(json.dumps(len(done)))))")
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1)
    assert proc.poll() is None, "the study exited before its trainings finished"
    go.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "finished the trainings that were running" in err, err
    assert sorted(p.name for p in ended.iterdir()) == sorted(p.name for p in started.iterdir())  # both ran to the end
    assert json.loads(saved.read_text()) == 2  # and both results were handed on
    time.sleep(0.5)
    assert len(list(started.iterdir())) == 2, "a queued training started after SIGUSR1"


def test_every_run_records_the_code_that_trained_it(tmp_path):
    import subprocess

    from diffzoo.study.runs import code_stamp

    here = code_stamp()  # this checkout
    assert here["commit"] is not None and len(here["commit"]) == 40 and here["torch"]
    repo = tmp_path / "repo"
    (repo / "diffzoo").mkdir(parents=True)
    (repo / "diffzoo" / "layer.py").write_text("x = 1\n")
    (repo / "docs.md").write_text("notes\n")

    def git(*args):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    clean = code_stamp(repo)
    assert len(clean["commit"]) == 40 and clean["changed"] == []
    (repo / "diffzoo" / "layer.py").write_text("x = 2\n")  # training code edited after the commit
    (repo / "docs.md").write_text("more notes\n")  # not code a training imports
    (repo / "recipes").mkdir()
    (repo / "recipes" / "new.py").write_text("")
    stamp = code_stamp(repo)
    assert stamp["commit"] == clean["commit"] and stamp["changed"] == ["diffzoo/layer.py", "recipes/new.py"]
    assert code_stamp(tmp_path / "not-a-checkout")["commit"] is None
    assert code_stamp(repo / "diffzoo")["commit"] is None  # inside a checkout, but not its top: not this code's


def _scratch_repo(repo: Path, *folders: str):
    """A git command on a new scratch repository ``repo`` with ``folders`` made in it (``git init`` done)."""
    import subprocess

    for folder in folders:
        (repo / folder).mkdir(parents=True, exist_ok=True)

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    return git


def test_code_report_dates_each_run_and_lists_training_files_changed_since(tmp_path):
    from diffzoo.study import provenance

    repo = tmp_path / "repo"
    git = _scratch_repo(repo, "diffzoo/study", "rec")

    def commit(message, runs, name="cell.json"):
        (repo / "rec" / name).write_text(json.dumps({"runs": {r: {"name": r} for r in runs}}))
        git("add", "-A")
        git("commit", "-q", "-m", message)
        return git("rev-parse", "HEAD")

    (repo / "diffzoo" / "layer.py").write_text("x = 1\n")
    (repo / "diffzoo" / "study" / "plan.py").write_text("cells = 1\n")
    a = commit("first run", ["r1"])
    b = commit("second run", ["r1", "r2"])
    (repo / "diffzoo" / "layer.py").write_text("x = 2\n")  # training code changes after both runs
    (repo / "diffzoo" / "study" / "plan.py").write_text("cells = 2\n")  # the harness: not training code
    c = commit("code changed", ["r1", "r2"])
    git("mv", "rec/cell.json", "rec/renamed.json")  # a cell kept under another name, as the study does
    git("commit", "-q", "-m", "rename")
    assert provenance.recorded_at(repo / "rec" / "renamed.json", repo) == {"r1": a, "r2": b}
    records = json.loads((repo / "rec" / "renamed.json").read_text())
    gone = "0123456789" * 4  # a commit amended away after its run started: the stamp names what git lacks
    records["runs"]["r6"] = {"name": "r6", "code": {"commit": gone, "changed": []}}
    (repo / "rec" / "renamed.json").write_text(json.dumps(records))
    git("commit", "-q", "-am", "a run stamped with a rewritten commit")
    d = git("rev-parse", "HEAD")
    records["runs"]["r7"] = {"name": "r7", "code": {"commit": gone, "changed": []}}  # ... and not committed yet
    records["runs"]["r3"] = {"name": "r3", "code": {"commit": c, "changed": []}}  # stamped, not committed yet
    records["runs"]["r4"] = {"name": "r4"}  # neither stamped nor committed
    (repo / "rec" / "renamed.json").write_text(json.dumps(records))
    groups = {(g["commit"], g["how"]): g for g in provenance.cell_code(repo / "rec", "renamed", repo)}
    assert set(groups) == {(a, "recorded"), (b, "recorded"), (c, "stamped"), (d, "lost stamp"),
                           (None, "recorded"), (None, "lost stamp")}
    assert groups[a, "recorded"]["changed_since"] == ["diffzoo/layer.py"]
    assert groups[c, "stamped"]["changed_since"] == [] and groups[d, "lost stamp"]["changed_since"] == []
    assert groups[None, "recorded"]["runs"] == groups[None, "lost stamp"]["runs"] == 1
    lines = provenance.code_lines(repo / "rec", ["renamed", "absent"], repo)
    assert lines[0] == "renamed: 6 runs, not all from the code there now"
    assert (f"  1 runs trained at a commit this repository lacks (rewritten after they ran), recorded at 1 "
            f"commit(s) ({d[:10]}); unchanged since") in lines
    assert "  1 runs in no commit yet, stamped with a commit this repository lacks" in lines
    assert "  1 runs in no commit yet and without a code stamp" in lines
    assert f"  2 runs recorded at 2 commit(s) ({a[:10]}, {b[:10]}); changed since: diffzoo/layer.py" in lines
    assert f"  1 runs trained at 1 commit(s) ({c[:10]}); unchanged since" in lines
    assert not any(line.startswith("absent") for line in lines)  # a cell with no records says nothing
    assert provenance.recorded_at(tmp_path / "elsewhere.json", repo) == {}  # records outside the checkout


def test_code_report_sets_apart_files_the_cells_recipe_does_not_import(tmp_path):
    from diffzoo.study import provenance

    repo = tmp_path / "repo"
    git = _scratch_repo(repo, "diffzoo/data", "rec")
    (repo / "diffzoo" / "data" / "synth.py").write_text("v = 1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "code")
    first = git("rev-parse", "HEAD")
    for cell, recipe in (("vitcell", "recipes.vit_imagenet"), ("speechcell", "recipes.speech_commands")):
        runs = {"r1": {"name": "r1", "code": {"commit": first, "changed": []}},
                "r2": {"name": "r2", "code": {"commit": first, "changed": ["diffzoo/data/synth.py"]}}}
        (repo / "rec" / f"{cell}.json").write_text(json.dumps({"recipe": recipe, "runs": runs}))
    (repo / "diffzoo" / "data" / "synth.py").write_text("v = 2\n")  # speech's data changes after the runs
    git("add", "-A")
    git("commit", "-q", "-m", "speech data")
    (vit,) = provenance.cell_code(repo / "rec", "vitcell", repo)
    assert vit["changed_since"] == vit["changed_then"] == [] and vit["not_imported"] == ["diffzoo/data/synth.py"]
    (speech,) = provenance.cell_code(repo / "rec", "speechcell", repo)
    assert speech["changed_since"] == speech["changed_then"] == ["diffzoo/data/synth.py"]
    assert speech["not_imported"] == []
    lines = provenance.code_lines(repo / "rec", ["vitcell", "speechcell"], repo)
    assert lines == [
        "vitcell: 2 runs, trained by the code there now",
        f"  2 runs trained at 1 commit(s) ({first[:10]}); unchanged since (changed, not imported by this recipe: "
        "diffzoo/data/synth.py)",
        "speechcell: 2 runs, not all from the code there now",
        f"  2 runs trained at 1 commit(s) ({first[:10]}); uncommitted then: diffzoo/data/synth.py; changed since: "
        "diffzoo/data/synth.py",
    ]


def test_verify_trains_the_first_final_run_again_and_compares_its_metrics(tmp_path, monkeypatch):
    from diffzoo.study import sweep
    from diffzoo.study.recipe import recipe_args

    best = {"softmax": 4e-3, "diff": 1e-3}
    record = _record("mqar", best, {"softmax": [90.0, 91.0], "diff": [80.0, 81.0]})
    for r in record["runs"].values():
        r["summary"]["metrics"]["train/loss"] = 0.5  # not an evaluation metric: not compared
        r["curves"] = {"val/acc": [[10, 0.1], [20, 0.2], [30, 0.3]]}
        if r["variant"] == "diff":  # stamped with its machine; softmax's records predate that
            r["code"] = {"commit": "c" * 40, "cpu": "AVX2", "cpu_model": "Some CPU", "threads": 1}
    family = FAMILIES["mqar"]
    record.update(fixed=[*family.base_args, *recipe_args(family.budget)], extra=[])
    (tmp_path / "mqar.json").write_text(json.dumps(record))
    trained = []

    def train_run(fam, out, variant, lr, seed, quick, extra, knob=None):
        trained.append((variant, lr, seed, quick, list(extra)))
        old = record["runs"][run_name(variant, lr, seed)]["summary"]["metrics"]
        now = {k: (v + 1e-7 if variant == "diff" and k.startswith("test/") else v) for k, v in old.items()}
        curve = [[10, 0.1], [20, 0.2], [30, 0.3 + (1e-7 if variant == "diff" else 0.0)]]  # V1 parts at step 30
        return {"summary": {"metrics": now}, "curves": {"val/acc": curve}}

    monkeypatch.setattr(sweep, "train_run", train_run)
    lines = plan.verify_lines(tmp_path, ["mqar", "vit"], ["softmax", "diff"], out=tmp_path / "again")
    assert trained == [("softmax", 4e-3, sweep.FINAL_SEED, False, []), ("diff", 1e-3, sweep.FINAL_SEED, False, [])]
    assert lines[0] == "mqar: 3 of 4 metrics identical over 2 runs trained again"
    assert lines[1].startswith(f"  {run_name('diff', 1e-3, sweep.FINAL_SEED)} test/acc: recorded 0.8, now 0.80000")
    saved = json.loads((tmp_path / "verify.json").read_text())["mqar"]
    soft, v1 = run_name("softmax", 4e-3, sweep.FINAL_SEED), run_name("diff", 1e-3, sweep.FINAL_SEED)
    assert [r["identical"] for r in saved[soft]["rows"]] == [True, True] and saved[soft]["code"]["torch"]
    assert [r["identical"] for r in saved[v1]["rows"]] == [False, True]  # test/acc, val/acc
    # the validation curves: where they part, and the machines each run was trained on
    here = saved[v1]["code"]
    assert here["cpu"] and here["threads"] >= 1 and "cpu_model" in here
    assert saved[soft]["curve"] == {"run": soft, "curve": "val/acc", "points": 3, "same_points": 3,
                                    "parted_at_step": None, "machine_then": {"cpu": None, "cpu_model": None,
                                                                             "threads": None}}
    assert saved[v1]["curve"]["same_points"] == 2 and saved[v1]["curve"]["parted_at_step"] == 30
    assert lines[2] == (f"  {v1}: val/acc the same at its first 2 of 3 evaluations, apart from step 30 on; recorded "
                        f"on AVX2 (Some CPU), 1 thread(s), trained again on {here['cpu']} ({here['cpu_model']}), "
                        f"{here['threads']} thread(s)")
    assert len(lines) == 3  # softmax: identical metrics and curve, nothing more said
    plan.verify_lines(tmp_path, ["mqar"], ["softmax"], out=tmp_path / "again")  # again, softmax only
    saved = json.loads((tmp_path / "verify.json").read_text())["mqar"]
    assert set(saved) == {soft, v1} and "before" not in saved[soft]  # V1's entry kept; same machine: replaced
    # trained again on another machine: its outcome leads, the first machine's stays under "before"
    from diffzoo.study import runs as study_runs

    first = saved[soft]
    other = {**first["code"], "cpu": "AVX2", "cpu_model": "Other CPU"}
    monkeypatch.setattr(study_runs, "code_stamp", lambda: dict(other))
    for _ in range(2):  # twice on the other machine: still one entry for each machine
        plan.verify_lines(tmp_path, ["mqar"], ["softmax"], out=tmp_path / "again")
        saved = json.loads((tmp_path / "verify.json").read_text())["mqar"]
        assert saved[soft]["code"]["cpu_model"] == "Other CPU" and saved[soft]["before"] == [first]
    assert [e["code"]["cpu_model"] for e in plan.verify_entries(saved[soft])] == ["Other CPU", first["code"]["cpu_model"]]
    old = {"when": "then", "code": {"torch": "2"}, "rows": []}  # an entry from before stamps named the machine
    assert plan.with_earlier({**first}, {**old, "before": [first]}) == {**first, "before": [old]}
    record["fixed"] = ["--other", "arguments"]  # records made with other recipe arguments are not retrained
    (tmp_path / "mqar.json").write_text(json.dumps(record))
    trained.clear()
    lines = plan.verify_lines(tmp_path, ["mqar"], ["softmax"], out=tmp_path / "again")
    assert trained == [] and "the records were made with ['--other', 'arguments']" in lines[1]


def test_headline_plot_wraps_its_panels_four_to_a_row(tmp_path):
    from PIL import Image

    cell = {"metric": "test/top1", "rows": [{"variant": v, "values": [90.0, 91.0, 92.0]} for v in plan.MAIN]}
    for tasks, size in ((6, (4 * 288, 2 * 288)), (4, (4 * 288, 288))):  # panels of 3.2 in at 90 dpi
        result = {"cells": {f"task{i}": cell for i in range(tasks)} | {"old": cell, "waiting": None},
                  "earlier": ["old"]}  # an earlier-budget cell and a cell still running get no panel
        plan.plot_headline(result, tmp_path / f"headline{tasks}.png")
        assert Image.open(tmp_path / f"headline{tasks}.png").size == size, tasks


def test_ablation_table_says_what_each_row_against_softmax_compares():
    """Every row of the page's ablation table names what it compares, the rows against softmax included."""
    vs = {"diff": 0.5, "ci_low": -0.1, "ci_high": 1.1, "p_perm": 0.2}
    rows = [{"variant": v, "kind": "ablation vs softmax", "vs": vs, "p_holm_study": 1.0}
            for v in ("softmax_wide", "diff_nonorm")]
    ablations = [{"variant": "diff_nonorm", "parent": "diff", "what": "without the norm", "vs": vs, "p_holm_study": 1.0}]
    table = plan.ablation_table({"cells": {"t": {"scale": 100.0, "rows": rows, "ablations": ablations}, "u": None}})
    lines = table.splitlines()[2:]
    assert len(lines) == 3 and all("|  |" not in line for line in lines)
    assert lines[0].startswith("| t | softmax_wide | softmax | fewer, wider heads")  # its parent is softmax
    assert lines[1].startswith("| t | diff_nonorm | softmax | every change from softmax at once |")
    assert lines[2].startswith("| t | diff_nonorm | diff | without the norm |")


def test_a_cell_takes_the_runs_of_a_check_with_its_set_up_instead_of_training_them_again(tmp_path):
    """lm-xs-16k's centre lrs at seeds 0-2 are exactly the runs its source's budget check trained (same
    arguments): they are copied into its records, marked, once; records of another set-up get nothing."""
    cell = plan.cell_named("lm-xs-16k")
    assert cell.runs_from == "lm-xs-8k-2x" and cell.epochs == 160
    best = {"softmax": 3.2e-2, "diff": 6.4e-2, "diff_v2_matched": 6.4e-2}
    check = _record("lm", best, {v: [1.41] for v in best})
    check.update(family="lm", recipe="recipes.lm", extra=list(plan.LM_XS), quick=False, fixed=["--trainer.max_epochs", "160"])
    check["runs"]["softmax_lr0.032_seed1"] = {**check["runs"][run_name("softmax", 3.2e-2, sweep.FINAL_SEED)],
                                              "failed": "killed"}  # a failed run is trained again, not copied
    (tmp_path / "lm-xs-8k-2x.json").write_text(json.dumps(check))
    assert "(39 runs:" in plan.status_lines(tmp_path, [cell])[0]  # 42 planned, 3 of them trained by the check
    assert plan.adopt_runs(tmp_path, cell) == 3
    assert "(39 runs:" in plan.status_lines(tmp_path, [cell])[0]  # the same once they are copied
    taken = plan.load(tmp_path, cell)
    assert {r["adopted_from"] for r in taken["runs"].values()} == {"lm-xs-8k-2x"} and len(taken["runs"]) == 3
    assert taken["fixed"] == check["fixed"] and taken["extra"] == check["extra"]
    assert plan.adopt_runs(tmp_path, cell) == 0  # once
    taken["fixed"] = ["--trainer.max_epochs", "80"]  # another budget: nothing is mixed in
    taken["runs"] = {}
    (tmp_path / "lm-xs-16k.json").write_text(json.dumps(taken))
    assert plan.adopt_runs(tmp_path, cell) == 0 and plan.load(tmp_path, cell)["runs"] == {}


def test_a_cell_waiting_for_another_cells_lrs_lets_the_cells_after_it_train(tmp_path, monkeypatch, capsys):
    """``run --cells needle-2x lm-xxs`` before needle has its best lrs: needle-2x is not started, saying why, lm-xxs
    trains, and the command then exits naming the cell that waits."""
    from diffzoo.study import sweep

    trained = []
    monkeypatch.setattr(sweep, "main", lambda argv: trained.append(argv[0]))
    monkeypatch.setattr(plan, "adopt_runs", lambda *a: 0)
    real = plan.cell_sweeps
    monkeypatch.setattr(plan, "cell_sweeps", lambda cell, *a: real(cell, *a) if cell.name == "needle-2x" else [[cell.name]])
    with pytest.raises(SystemExit, match="^cell needle-2x centres its grid on the best lrs of cell needle, which has none"):
        plan.main(["run", "--cells", "needle-2x", "lm-xxs", "--records", str(tmp_path)])
    assert trained == ["lm-xxs"]
    assert "== cell needle-2x: not started: cell needle-2x centres its grid" in capsys.readouterr().out
