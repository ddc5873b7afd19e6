"""recipes.compare: collecting finished runs into the cross-modal table."""

import json

import pytest
from scipy import stats as scipy_stats

from recipes import compare


def _run(model, seed, top1, params=1000):
    return {"model": model, "seed": seed, "params": params, "summary": {"metrics": {"val/top1": top1}}}


def _write(tmp_path, runs):
    path = tmp_path / "outputs" / "vit_compare" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(runs))


def test_rows_mean_spread_and_statistics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fam = compare.FAMILIES["vit"]
    _write(tmp_path, [
        _run(fam.diff, 0, 0.90), _run(fam.diff, 1, 0.92), _run(fam.diff, 2, 0.94),
        _run(fam.soft, 0, 0.80), _run(fam.soft, 1, 0.85), _run(fam.soft, 2, 0.84),
        _run("someone_else", 0, 0.1),  # runs of other models in the file are ignored
    ])
    (row,) = compare.adjust(compare.compare_rows(fam, compare.load_runs(fam)))
    assert row["diff_values"] == pytest.approx([90, 92, 94])
    assert row["diff_mean"] == pytest.approx(92.0) and row["diff_sd"] == pytest.approx(2.0)
    assert row["soft_mean"] == pytest.approx(83.0)
    assert row["delta"] == pytest.approx(9.0) and row["diff_better"]
    # 3 vs 3 with every differential seed above every softmax seed: 2 of the 20 splits are as extreme
    assert row["p_perm"] == pytest.approx(0.1) and row["perm_exact"] and row["perm_count"] == 20
    welch = scipy_stats.ttest_ind([90, 92, 94], [80, 85, 84], equal_var=False)
    assert row["t"] == pytest.approx(welch.statistic) and row["p_welch"] == pytest.approx(welch.pvalue)
    ci = welch.confidence_interval(0.95)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert row["p_holm"] == pytest.approx(0.1)  # a single comparison: Holm changes nothing
    text = compare.markdown_table([row])
    assert "p perm" in text and "| 0.100 | 0.100 |" in text and "1 comparison(s)" in text
    assert "beyond seed spread" not in text


def test_overlapping_seeds_give_a_large_p(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fam = compare.FAMILIES["vit"]
    _write(tmp_path, [_run(fam.diff, s, v) for s, v in enumerate((0.90, 0.80, 0.85))]
           + [_run(fam.soft, s, v) for s, v in enumerate((0.82, 0.88, 0.84))])
    (row,) = compare.compare_rows(fam, compare.load_runs(fam))
    assert row["p_perm"] == pytest.approx(1.0) and row["p_welch"] > 0.9  # equal means


def test_lower_is_better_metric_and_missing_family(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "outputs" / "lm_compare" / "results.json"
    path.parent.mkdir(parents=True)
    runs = [{"attn": a, "seed": s, "summary": {"parameters": 10, "metrics": {"val/loss": v}},
             "retrieval": [{"n": 4, "correct": c}]}
            for a, s, v, c in [("diff", 0, 1.0, 4), ("diff", 1, 1.1, 3), ("softmax", 0, 1.5, 0), ("softmax", 1, 1.6, 1)]]
    path.write_text(json.dumps(runs))
    study = compare.main(["--families", "lm", "vit", "--out", str(tmp_path / "study")])
    loss, retrieval = study["rows"]
    assert loss["diff_better"] and loss["delta"] == pytest.approx(-0.5)  # lower loss is better
    assert study["comparisons"] == 2
    # Holm over the two rows: the smaller permutation p is doubled, the larger one kept (both 2 + 2 seeds)
    assert loss["p_perm"] == pytest.approx(1 / 3) and loss["p_holm"] == pytest.approx(2 / 3)
    assert retrieval["diff_values"] == pytest.approx([100.0, 75.0])
    assert study["missing"] == ["vit"]
    assert "recipes.vit_compare" in (tmp_path / "study" / "study.md").read_text()


def test_analysis_of_exported_vit_runs(tmp_path, monkeypatch):
    """--analysis end to end on two exported (untrained) nano ViTs: every measurement is filled in,
    lambda only for the differential model, metric-vs-bits for each bit width, and the plots exist."""
    import timm
    import torch

    import diffzoo.models  # noqa: F401  (registers the ViTs)
    from diffzoo.tasks.export import save_safetensors
    from recipes import compare_analysis

    monkeypatch.setattr(compare_analysis, "PROBE", 8)
    fam = compare.FAMILIES["vit"]
    runs = []
    for i, name in enumerate((fam.diff, fam.soft)):
        torch.manual_seed(i)
        model = timm.create_model(name, num_classes=10, in_chans=1, img_size=28)
        path = save_safetensors(model.state_dict(), tmp_path / f"{name}.safetensors", name,
                                {"num_classes": 10, "in_chans": 1, "img_size": 28})
        runs.append({"model": name, "seed": 0, "summary": {"safetensors": str(path)}})
    result = compare_analysis.analyse([fam], lambda f: runs, None, tmp_path / "plots")["vit"]
    diff, soft = result["diff"][0], result["softmax"][0]
    assert len(diff["lambdas"]) == 4 and soft["lambdas"] == []
    for r in (diff, soft):
        assert set(r["bits"]) == {"None", "8", "6", "4"}
        assert all(0.0 <= v <= 100.0 for v in r["bits"].values())
        assert 0.0 <= r["noise"]["negative"] <= 1.0 and r["noise"]["entropy"] > 0
        assert r["outliers"]["logits"]["top1_ratio"] >= r["outliers"]["logits"]["topk_ratio"] >= 1.0
    assert soft["noise"]["negative"] == 0.0  # softmax maps are never negative
    for png in ("vit_diff_attention", "vit_softmax_attention", "vit_outliers", "vit_bits", "lambda_by_depth"):
        assert (tmp_path / "plots" / f"analysis_{png}.png").stat().st_size > 1000
    text = compare_analysis.markdown({"vit": result})
    assert "| vit | diff | 1 |" in text and "| vit | val top-1 % | softmax |" in text


def test_compare_main_adds_a_model_and_keeps_earlier_runs(tmp_path, capsys):
    from recipes._study import compare_main

    calls = []

    def run_one(model, seed, extra):
        calls.append((model, seed, tuple(extra)))
        return {"model": model, "seed": seed, "seconds": 1.0, "summary": {}, "curves": {}}

    def table(runs):
        return "\n".join(f"{r['model']}:{r['seed']}:{r.get('tag', 'new')}" for r in runs)

    out = tmp_path / "study"
    out.mkdir()
    old = [{"model": m, "seed": s, "seconds": 2.0, "tag": "old"} for m in ("a", "b") for s in (0, 1)]
    (out / "results.json").write_text(json.dumps(old))
    runs = compare_main(["--models", "c", "b", "--seeds", "1", "--jobs", "2", "--trainer.max_epochs", "1"],
                        "doc", out, ("a", "b"), run_one, lambda m: 7, table, lambda runs, path: None)
    assert sorted(calls) == [("b", 1, ("--trainer.max_epochs", "1")), ("c", 1, ("--trainer.max_epochs", "1"))]
    saved = json.loads((out / "results.json").read_text())
    assert {(r["model"], r["seed"], r.get("tag", "new")) for r in saved} == {
        ("a", 0, "old"), ("a", 1, "old"), ("b", 0, "old"), ("b", 1, "new"), ("c", 1, "new")}
    assert len(runs) == 5 and all(r["params"] == 7 for r in runs if r.get("tag") is None)
    assert "c:1:new" in capsys.readouterr().out


def test_lm_and_speech_comparisons_share_the_study_command_line(tmp_path, monkeypatch):
    """--jobs, --models and --from-results of recipes._study.compare_main; the LM's retrieval evaluation runs
    after each training and again with --evaluate-only; unknown flags go to every training."""
    import recipes.lm_compare as lm_compare
    import recipes.speech_compare as speech_compare

    monkeypatch.chdir(tmp_path)
    seen = []

    def fake_train(attn, seed, extra):
        seen.append((attn, seed, extra))
        return {"model": attn, "attn": attn, "seed": seed, "seconds": 1.0, "curves": {"val/loss": [[1, 2.0]]},
                "summary": {"parameters": 10, "metrics": {"val/loss": 2.0 + seed, "val/ppl": 7.0},
                            "safetensors": f"{attn}{seed}.safetensors"}}

    def fake_evaluate(run, args):
        row = {"length": 64, "needles": 1, "depth": 0.5, "n": 2, "correct": 1, "score_answer": 0.5,
               "score_noise": 0.1, "samples": args.retrieval_samples}
        return {**run, "retrieval": [row]}

    monkeypatch.setattr(lm_compare, "train_one", fake_train)
    monkeypatch.setattr(lm_compare, "evaluate", fake_evaluate)
    runs = lm_compare.main(["--seeds", "0", "1", "--jobs", "2", "--retrieval-samples", "3",
                            "--trainer.max_epochs", "1"])
    assert sorted((a, s) for a, s, _ in seen) == [("diff", 0), ("diff", 1), ("softmax", 0), ("softmax", 1)]
    assert all(extra == ["--trainer.max_epochs", "1"] for _, _, extra in seen)
    assert [r["retrieval"][0]["samples"] for r in runs] == [3, 3, 3, 3]
    saved = json.loads((tmp_path / "outputs/lm_compare/results.json").read_text())
    assert {(r["attn"], r["seed"]) for r in saved} == {("diff", 0), ("diff", 1), ("softmax", 0), ("softmax", 1)}
    again = lm_compare.main(["--evaluate-only", "--retrieval-samples", "5"])
    assert len(seen) == 4 and [r["retrieval"][0]["samples"] for r in again] == [5, 5, 5, 5]

    monkeypatch.setattr(speech_compare, "run_one", lambda m, s, extra: {
        "model": m, "seed": s, "seconds": 2.0, "curves": {},
        "summary": {"metrics": {"test/top1": 0.5, "val/top1": 0.6}}})
    monkeypatch.setattr(speech_compare, "prepare", lambda: None)
    monkeypatch.setattr(speech_compare, "count_params", lambda m: 123)
    runs = speech_compare.main(["--seeds", "0", "--models", "diffkwt_nano", "--jobs", "2"])
    assert [(r["model"], r["params"]) for r in runs] == [("diffkwt_nano", 123)]
