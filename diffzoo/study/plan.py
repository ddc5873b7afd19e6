"""The whole study as a list of cells, run resumably across sessions, and its one headline table.

A cell is one family at one size with the variants it compares and the starting learning-rate grid
(:func:`~diffzoo.study.recipe.lr_grid`: 5 points in factor-2 steps; the sweep extends it where the best lr
lands on an edge). Each cell is a :mod:`diffzoo.study.sweep` whose records file lives in the repository
(:data:`RECORDS`), so a later session, or another machine, continues where the last one stopped: runs
already recorded are never trained again, and a run killed half-way is simply trained again.

    OMP_NUM_THREADS=1 python -m recipes.study run --jobs 2            # every cell, in order; resumable
    OMP_NUM_THREADS=1 python -m recipes.study run --cells mqar lm     # some cells
    OMP_NUM_THREADS=1 python -m recipes.study run --main-only         # the three main variants first
    python -m recipes.study status                                    # runs recorded per cell
    python -m recipes.study report                                    # the headline table and its plot
    python -m recipes.study run --quick --records outputs/study-quick # the pipeline in seconds (tests)

The report compares every variant with softmax on every task and applies one Holm correction over all
the comparisons it reports (headline and ablations together); each comparison's p is the exact
permutation p of the final seeds' test scores.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..stats import compare, holm
from .families import FAMILIES, lr_tag, metric_value
from .recipe import RECIPE, lr_grid
from .sweep import FINAL_SEED
from .tables import ABLATIONS, comparison_rows, fmt, fmt_p, run_plateau

MAIN = ("softmax", "diff", "diff_v2_matched")
ABLATION_VARIANTS = ("softmax_wide", "diff_nonorm", "diff_const")
RECORDS = Path("docs/results/study/v0.3")
GRID_SEEDS = 3
FINAL_SEEDS = 8  # 8 + 8 seeds: the exact permutation p can reach 2/12870, so Holm over ~20 comparisons can act


@dataclass(frozen=True)
class Cell:
    """One sweep of the study: ``family`` at ``size`` (its default when None) over ``variants``."""

    name: str
    family: str
    variants: tuple[str, ...] = MAIN
    lr_center: float = 2e-3
    size_args: tuple[str, ...] = ()
    extra: tuple[str, ...] = field(default=())

    @property
    def lrs(self) -> list[float]:
        return lr_grid(self.lr_center)


CELLS: tuple[Cell, ...] = (  # the ablations run on one encoder (vit) and one decoder (mqar)
    Cell("vit", "vit", MAIN + ABLATION_VARIANTS),
    Cell("mqar", "mqar", MAIN + ABLATION_VARIANTS),
    Cell("cluttered", "cluttered"),
    Cell("speech", "speech"),
    Cell("clip", "clip"),
    Cell("lm", "lm"),
)


def sweep_argv(cell: Cell, records: Path, jobs: int, quick: bool, main_only: bool = False) -> list[str]:
    """The :func:`diffzoo.study.sweep.main` arguments of ``cell`` (``main_only``: its :data:`MAIN` variants)."""
    variants = [v for v in cell.variants if v in MAIN] if main_only else cell.variants
    argv = ["--family", cell.family, "--variants", *variants, "--lrs", *(lr_tag(x) for x in cell.lrs),
            "--seeds", str(GRID_SEEDS), "--final-seeds", str(FINAL_SEEDS), "--jobs", str(jobs),
            "--out", str(Path("outputs/study") / cell.name), "--results", str(records / f"{cell.name}.json")]
    if quick:  # the pipeline only: two variants, the grid's centre, one grid seed and two final seeds
        argv = [*argv, "--quick", "--variants", *cell.variants[:2], "--lrs", lr_tag(cell.lr_center), "--seeds", "1",
                "--final-seeds", "2"]
    return [*argv, *cell.size_args, *cell.extra]


def planned_runs(cell: Cell) -> int:
    """Runs of a cell before any grid extension: variants x (5 lrs x grid seeds + final seeds)."""
    return len(cell.variants) * (len(cell.lrs) * GRID_SEEDS + FINAL_SEEDS)


def load(records: Path, cell: Cell) -> dict:
    path = records / f"{cell.name}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def final_runs(record: dict) -> list[dict]:
    """The final runs (fresh seeds at each variant's best lr) of a cell's records."""
    best = {v: b["lr"] for v, b in (record.get("best") or {}).items()}
    return [r for r in (record.get("runs") or {}).values()
            if r["seed"] >= FINAL_SEED and not r.get("knob") and best.get(r["variant"]) == r["lr"]]


def status_lines(records: Path, cells: Sequence[Cell]) -> list[str]:
    lines = []
    for cell in cells:
        rec = load(records, cell)
        runs = list((rec.get("runs") or {}).values())
        grid = sum(1 for r in runs if r["seed"] < FINAL_SEED)
        final = len(final_runs(rec))
        hours = sum(r.get("seconds", 0.0) for r in runs) / 3600
        done = final >= FINAL_SEEDS * len(cell.variants)
        lines.append(f"{cell.name:10s} grid {grid:3d}, final {final:3d} of {FINAL_SEEDS * len(cell.variants)} "
                     f"(planned about {planned_runs(cell)} runs), {hours:.2f} CPU-thread hours"
                     + (" - done" if done else ""))
    return lines


def headline(records: Path, cells: Sequence[Cell]) -> dict:
    """Every finished cell's comparisons with softmax (and its ablations), one Holm over all of them."""
    out: dict = {"cells": {}, "recipe": RECIPE.describe()}
    compared: list[dict] = []
    for cell in cells:
        rec = load(records, cell)
        family = FAMILIES[cell.family]
        final = final_runs(rec)
        if not final or not rec.get("best"):
            out["cells"][cell.name] = None
            continue
        metric = family.test_metric or family.val_metric
        rows = comparison_rows(family, final, "softmax", metric)
        for r in rows:
            r["lr"] = rec["best"][r["variant"]]["lr"]
            r["plateau"] = [run_plateau(family, x) for x in final if x["variant"] == r["variant"]]
            if "vs" in r:
                r["kind"] = "headline" if r["variant"] in MAIN else "ablation vs softmax"
                compared.append(r)
        ablations = []
        for variant, parent, what in ABLATIONS:
            if parent == "softmax" or not {variant, parent} <= set(cell.variants):
                continue
            a = [family.scale * metric_value(x, metric) for x in final if x["variant"] == variant]
            b = [family.scale * metric_value(x, metric) for x in final if x["variant"] == parent]
            a, b = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
            if len(a) > 1 and len(b) > 1:
                row = {"variant": variant, "parent": parent, "what": what, "vs": compare(a, b).as_dict(),
                       "kind": "ablation"}
                ablations.append(row)
                compared.append(row)
        seconds = sum(r.get("seconds", 0.0) for r in rec["runs"].values())
        out["cells"][cell.name] = {"family": cell.family, "metric": metric, "label": family.label, "rows": rows,
                                   "ablations": ablations, "runs": len(rec["runs"]), "seconds": seconds,
                                   "higher_is_better": family.higher_is_better, "scale": family.scale}
    for r, p in zip(compared, holm([r["vs"]["p_perm"] for r in compared])):
        r["p_holm_study"] = p
    out["comparisons"] = len(compared)
    return out


def _mean_cell(by: dict[str, dict], digits: int):
    def cell(v: str) -> str:
        r = by.get(v)
        return "–" if r is None else f"{fmt(r['mean'], digits)} ± {fmt(r['sd'], digits)} (lr {lr_tag(r['lr'])})"
    return cell


def _diff_cell(by: dict[str, dict], digits: int):
    def cell(v: str) -> str:
        r = by.get(v)
        if r is None or "vs" not in r:
            return "–"
        c = r["vs"]
        return (f"{c['diff']:+.{digits}f} [{fmt(c['ci_low'], digits)}, {fmt(c['ci_high'], digits)}], "
                f"{fmt_p(c['p_perm'])}, {fmt_p(r.get('p_holm_study'))}")
    return cell


def headline_table(result: dict) -> str:
    """Markdown: one line per task, the three main variants' means and their differences to softmax."""
    head = ("| task (metric) | softmax | V1 `diff` | V2 `diff_v2_matched` | V1 - softmax [95 % CI], p perm, p Holm | "
            "V2 - softmax [95 % CI], p perm, p Holm | flat runs | runs, CPU hours |")
    lines = [head, "|" + "---|" * 8]
    for name, cell in result["cells"].items():
        if cell is None:
            lines.append(f"| {name} | not run yet | | | | | | |")
            continue
        digits = 2 if cell["scale"] != 1.0 else 3
        by = {r["variant"]: r for r in cell["rows"]}

        mean = _mean_cell(by, digits)
        diff = _diff_cell(by, digits)

        flat = [p for v in MAIN for p in (by[v]["plateau"] if v in by else []) if p is not None]
        flat_text = f"{sum(1 for p in flat if p['flat'])}/{len(flat)}"
        lines.append(f"| {name} ({cell['metric']}) | {mean('softmax')} | {mean('diff')} | {mean('diff_v2_matched')} "
                     f"| {diff('diff')} | {diff('diff_v2_matched')} | {flat_text} | {cell['runs']}, "
                     f"{cell['seconds'] / 3600:.1f} |")
    return "\n".join(lines)


def ablation_table(result: dict) -> str:
    lines = ["| task | variant | against | what it isolates | diff [95 % CI] | p perm | p Holm (study) |",
             "|" + "---|" * 7]
    for name, cell in result["cells"].items():
        if not cell:
            continue
        digits = 2 if cell["scale"] != 1.0 else 3
        rows = [r for r in cell["rows"] if r.get("kind") == "ablation vs softmax"] + cell["ablations"]
        for r in rows:
            c = r["vs"]
            lines.append(f"| {name} | {r['variant']} | {r.get('parent', 'softmax')} | {r.get('what', '')} | "
                         f"{c['diff']:+.{digits}f} [{fmt(c['ci_low'], digits)}, {fmt(c['ci_high'], digits)}] | "
                         f"{fmt_p(c['p_perm'])} | {fmt_p(r.get('p_holm_study'))} |")
    return "\n".join(lines)


def plot_headline(result: dict, path: Path) -> None:
    """One panel per finished task: each final seed's score per variant, and the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = {k: v for k, v in result["cells"].items() if v}
    if not cells:
        return
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.2), dpi=90, squeeze=False)
    for ax, (name, cell) in zip(axes[0], cells.items()):
        by = {r["variant"]: r for r in cell["rows"]}
        names = [v for v in MAIN if v in by]
        for i, v in enumerate(names):
            vals = [x for x in by[v]["values"] if math.isfinite(x)]
            ax.scatter([i] * len(vals), vals, s=12, alpha=0.6)
            if vals:
                ax.hlines(statistics.mean(vals), i - 0.3, i + 0.3, colors="k")
        ax.set_xticks(range(len(names)), [{"softmax": "softmax", "diff": "V1", "diff_v2_matched": "V2"}[v]
                                          for v in names])
        ax.set_title(f"{name}\n{cell['metric']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "status", "report"))
    p.add_argument("--cells", nargs="+", default=None, choices=[c.name for c in CELLS], metavar="CELL",
                   help=f"cells to run or report (default: all: {', '.join(c.name for c in CELLS)})")
    p.add_argument("--jobs", type=int, default=2, help="trainings at once (one process each; default 2)")
    p.add_argument("--records", type=Path, default=RECORDS, help=f"records folder (default {RECORDS})")
    p.add_argument("--quick", action="store_true", help="smoke mode: few-step runs, 1 grid seed, 2 final seeds")
    p.add_argument("--main-only", action="store_true",
                   help="run: only softmax, diff and diff_v2_matched of each cell (the ablations stay for a later "
                        "call on the same records)")
    args = p.parse_args(argv)
    cells = [c for c in CELLS if args.cells is None or c.name in args.cells]
    if args.quick and args.records == RECORDS:
        p.error("--quick writes smoke records: give another --records folder than the study's")
    if args.command == "run":
        from .sweep import main as sweep

        for cell in cells:
            start = time.time()
            print(f"== cell {cell.name} ({planned_runs(cell)} runs planned before grid extension)", flush=True)
            sweep(sweep_argv(cell, args.records, args.jobs, args.quick, args.main_only))
            print(f"== cell {cell.name} done in {time.time() - start:.0f} s", flush=True)
    elif args.command == "status":
        print("\n".join(status_lines(args.records, cells)))
    else:
        result = headline(args.records, cells)
        text = (f"Recipe: {result['recipe']}.\n\n" + headline_table(result) + "\n\n"
                + f"{result['comparisons']} comparisons; p perm: exact permutation p of the final seeds' test "
                  "scores; p Holm: Holm's adjustment over all of them.\n\n" + ablation_table(result) + "\n")
        args.records.mkdir(parents=True, exist_ok=True)
        (args.records / "table.md").write_text(text)
        (args.records / "table.json").write_text(json.dumps(result, indent=1))
        plot_headline(result, args.records / "headline.png")
        print(text)
