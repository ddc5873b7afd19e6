"""recipes.compare: collecting finished runs into the cross-modal table."""

import json

import pytest

from recipes import compare


def _run(model, seed, top1, params=1000):
    return {"model": model, "seed": seed, "params": params, "summary": {"metrics": {"val/top1": top1}}}


def _write(tmp_path, runs):
    path = tmp_path / "outputs" / "vit_compare" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(runs))


def test_rows_mean_spread_and_verdict(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fam = compare.FAMILIES["vit"]
    _write(tmp_path, [
        _run(fam.diff, 0, 0.90), _run(fam.diff, 1, 0.92), _run(fam.diff, 2, 0.94),
        _run(fam.soft, 0, 0.80), _run(fam.soft, 1, 0.85), _run(fam.soft, 2, 0.84),
        _run("someone_else", 0, 0.1),  # runs of other models in the file are ignored
    ])
    (row,) = compare.compare_rows(fam, compare.load_runs(fam))
    assert row["diff_values"] == pytest.approx([90, 92, 94])
    assert row["diff_mean"] == pytest.approx(92.0) and row["diff_sd"] == pytest.approx(2.0)
    assert row["soft_mean"] == pytest.approx(83.0)
    assert row["delta"] == pytest.approx(9.0)
    assert row["beyond_spread"] and row["diff_better"]
    assert "yes, differential better" in compare.markdown_table([row])


def test_overlapping_seeds_are_not_beyond_spread(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fam = compare.FAMILIES["vit"]
    _write(tmp_path, [_run(fam.diff, s, v) for s, v in enumerate((0.90, 0.80, 0.85))]
           + [_run(fam.soft, s, v) for s, v in enumerate((0.82, 0.88, 0.84))])
    (row,) = compare.compare_rows(fam, compare.load_runs(fam))
    assert not row["beyond_spread"]
    assert "| no |" in compare.markdown_table([row])


def test_lower_is_better_metric_and_missing_family(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lm = compare.FAMILIES["lm"]
    path = tmp_path / "outputs" / "lm_compare" / "results.json"
    path.parent.mkdir(parents=True)
    runs = [{"attn": a, "seed": s, "summary": {"parameters": 10, "metrics": {"val/loss": v}},
             "retrieval": [{"n": 4, "correct": c}]}
            for a, s, v, c in [("diff", 0, 1.0, 4), ("diff", 1, 1.1, 3), ("softmax", 0, 1.5, 0), ("softmax", 1, 1.6, 1)]]
    path.write_text(json.dumps(runs))
    study = compare.main(["--families", "lm", "vit", "--out", str(tmp_path / "study")])
    loss, retrieval = study["rows"]
    assert loss["diff_better"] and loss["beyond_spread"]  # lower loss is better
    assert retrieval["diff_values"] == pytest.approx([100.0, 75.0])
    assert study["missing"] == ["vit"]
    assert "recipes.vit_compare" in (tmp_path / "study" / "study.md").read_text()
