"""The 0.2 comparison's records (docs/results/study/*.json) recomputed by diffzoo.study give the tables of its
page (docs/results/history-0.2.md) line for line: the page's numbers come from the records, and the harness still reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffzoo.study import FAMILIES, tables

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "docs" / "results" / "study"
PAGE = ROOT / "docs" / "results" / "history-0.2.md"  # the superseded comparison these records made


def _load(name: str) -> tuple[dict, object, int]:
    record = json.loads((STUDY / f"{name}.json").read_text())
    family = FAMILIES[record["family"]]
    return record, family, 2 if family.scale != 1.0 else 3


def _table_rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines()[2:] if line.startswith("|")]


def _assert_on_page(markdown: str) -> None:
    page = PAGE.read_text()
    rows = _table_rows(markdown)
    assert rows, "an empty table"
    missing = [row for row in rows if row not in page]
    assert not missing, f"{PAGE.name} lacks these recomputed rows:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", ["mqar", "cluttered", "vit", "speech", "lm"])
def test_final_and_grid_tables_recomputed_from_the_records(name: str) -> None:
    record, family, digits = _load(name)
    runs = record["runs"]
    final = [runs[n] for n in record["final"]["runs"]]
    metric = record["final"]["metric"]
    rows = tables.comparison_rows(family, final, "softmax", metric)
    stored = record["final"]["rows"]
    assert [(r["variant"], r["n"]) for r in rows] == [(r["variant"], r["n"]) for r in stored]
    assert [r["mean"] for r in rows] == pytest.approx([r["mean"] for r in stored])
    assert [r.get("p_holm") for r in rows] == pytest.approx([r.get("p_holm") for r in stored])
    _assert_on_page(tables.stats_table(rows, "softmax", digits))
    grid = [r for r in runs.values() if r["seed"] < 100 and not r.get("knob")]
    best = tables.best_lrs(family, grid)
    assert {v: b["lr"] for v, b in best.items()} == {v: b["lr"] for v, b in record["best"].items()}
    _assert_on_page(tables.grid_text(family, best, sorted({r["lr"] for r in grid}), digits))
    ablations = tables.ablation_rows(family, final, metric)
    if "ablations" in record["final"]:
        _assert_on_page(tables.ablation_table(ablations, digits))


@pytest.mark.parametrize("name", ["mqar", "cluttered", "speech_snr"])
def test_knob_tables_recomputed_from_the_records(name: str) -> None:
    record, family, digits = _load(name)
    knob = record["knob_result"]
    runs = [r for r in record["runs"].values() if r.get("knob") and r["knob"][0] == knob["knob"]
            and r["knob"][1] in knob["values"] and r["lr"] == knob["lrs"][r["variant"]] and r["seed"] >= 100]
    rows = tables.comparison_rows(family, runs, "softmax", family.test_metric or family.val_metric,
                                  group=lambda r: r["knob"][1])
    assert len(rows) == len(knob["rows"])
    _assert_on_page(tables.stats_table(rows, "softmax", digits, knob["knob"]))


def test_a_changed_record_no_longer_matches_the_page() -> None:
    """The check above can fail: one final value moved by a point changes the table row."""
    record, family, digits = _load("mqar")
    final = [dict(record["runs"][n]) for n in record["final"]["runs"]]
    final[0] = {**final[0], "summary": {"metrics": {"test/acc": 0.01 + final[0]["summary"]["metrics"]["test/acc"]}}}
    rows = tables.comparison_rows(family, final, "softmax", record["final"]["metric"])
    with pytest.raises(AssertionError, match="lacks these recomputed rows"):
        _assert_on_page(tables.stats_table(rows, "softmax", digits))
