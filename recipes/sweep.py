"""Learning rate tuned per attention variant, then final seeds, with real statistics.

    OMP_NUM_THREADS=1 python -m recipes.sweep --family mqar --variants softmax diff \\
        --lrs 3e-4 1e-3 3e-3 6e-3 --seeds 2 --final-seeds 5 --jobs 2
    OMP_NUM_THREADS=1 python -m recipes.sweep --family cluttered --knob data.k --values 0 4 8 16 --jobs 2
    OMP_NUM_THREADS=1 python -m recipes.sweep --family mqar --chance 5           # random-init scores only
    python -m recipes.sweep --family mqar --quick                                # seconds: the pipeline only

**Sweep.** For every variant, every learning rate of ``--lrs`` is trained with ``--seeds`` seeds (0, 1,
...). Each variant's best learning rate is the one with the best mean *validation* metric (an lr at
which any seed diverged ranks below every lr without a divergence). That variant is then trained at its
best lr with ``--final-seeds`` new seeds (100, 101, ...; the grid seeds are not reused, so the reported
values carry no selection bias) and the final runs are scored on the family's test metric (validation
where the task has no test split). Every other variant is compared with ``--reference`` (default
``softmax``) by :func:`diffzoo.stats.compare` (Welch's t and 95 % interval of the difference, exact
permutation p) with Holm's correction over the comparisons of the table.

**Knob** (``--knob ARG --values ...``, mqar and cluttered): each variant at its best lr of the earlier
sweep in the same folder (or in ``--lrs-from RESULTS``, or the single ``--lrs`` value) is trained with ``--final-seeds`` seeds at
every knob value; the table and plot show the metric against the knob.

**Chance** (``--chance N``): every variant is scored untrained, ``N`` initialisations each (the recipe's
``validate`` subcommand without a checkpoint), to show the metric's distribution under random init.

Every run is ``python -m <recipe>`` in a fresh process (:mod:`recipes._study`), logging the validation
metric and ``train/grad_norm`` (:class:`diffzoo.tasks.monitor.GradNormMonitor`); a run that meets a
non-finite loss stops and is reported as diverged. Written to ``--out`` (default
``outputs/sweep/<family>/``): ``results.json`` (every run, reused on the next call unless ``--fresh``;
a folder whose runs were trained with other extra arguments or ``--quick`` is refused rather than mixed),
``sweep.md`` / ``knob.md`` / ``chance.md`` and ``curves.png`` / ``knob.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffzoo.stats import compare, holm
from diffzoo.tasks.callbacks import DIVERGENCE_FILE
from recipes._study import latest_log_dir, read_run, recipe_command, run_jobs, train

MONITOR = ["--trainer.callbacks+=diffzoo.tasks.monitor.GradNormMonitor"]
CONFIGS = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class Family:
    """How the sweep drives one recipe."""

    recipe: str
    variants: dict[str, tuple[str, ...]]  # variant name -> recipe arguments that select it
    val_metric: str  # selection metric in summary.metrics (validation split)
    test_metric: str | None  # reported metric of the final runs; None: the task has no test split
    label: str
    config: Path  # the recipe's default config (for ``validate`` in --chance)
    seed_args: Callable[[int], list[str]]
    quick: tuple[str, ...]
    higher_is_better: bool = True
    scale: float = 100.0
    monitor_args: tuple[str, ...] = tuple(MONITOR)  # recipes without a built-in GradNormMonitor get one
    default_variants: tuple[str, ...] = ("softmax", "diff")
    knobs: tuple[str, ...] = ()
    chance: float | None = None  # the metric of uniform guessing, when it is known in closed form
    base_args: tuple[str, ...] = ()  # recipe arguments every run of the family gets, before the variant's


def _attn_variants(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    return {v: ("--model.attn", v) for v in names}


def _variant_names() -> list[str]:
    from diffzoo.layers.variants import variant_names

    return variant_names()


def _data_seed(s: int) -> list[str]:
    return ["--seed_everything", str(s), "--data.init_args.seed", str(s)]


def _plain_seed(s: int) -> list[str]:
    return ["--seed_everything", str(s), "--data.seed", str(s)]


_LIMITS = ("--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
           "--trainer.log_every_n_steps", "1")
FAMILIES: dict[str, Family] = {
    "vit": Family(
        "recipes.vit_imagenet", {"softmax": ("--model.model", "softvit_nano_patch7_28"),
                                 "diff": ("--model.model", "diffvit_nano_patch7_28")},
        "val/top1", "test/top1", "top-1 %, embedded digits (1,000 held out for test)", CONFIGS / "vit_digits.yaml",
        _data_seed, _LIMITS + ("--trainer.limit_test_batches", "2"), chance=0.1,
        base_args=("--data.init_args.num_test", "1000")),
    "clip": Family(
        "recipes.clip", {"softmax": ("--model.model", "SoftCLIP-nano"), "diff": ("--model.model", "DiffCLIP-nano")},
        "val/zs_top1", None, "zero-shot top-1 %, coloured digits", CONFIGS / "clip_digits.yaml", _data_seed, _LIMITS),
    "speech": Family(
        "recipes.speech_commands", {"softmax": ("--model.model", "softkwt_nano"),
                                    "diff": ("--model.model", "diffkwt_nano")},
        "val/top1", "test/top1", "top-1 %, synthesised keywords", CONFIGS / "speech_synth.yaml", _data_seed,
        _LIMITS + ("--trainer.limit_test_batches", "2"), knobs=("data.init_args.snr_fixed_db",), chance=1 / 12),
    "lm": Family(
        "recipes.lm", _attn_variants(("softmax", "diff", "diff_v2")), "val/loss", "test/loss",
        "loss (nats/byte), pydoc text, lm_nano, 500 steps", CONFIGS / "lm_pydoc.yaml", _plain_seed,
        _LIMITS + ("--trainer.limit_test_batches", "2"), higher_is_better=False, scale=1.0,
        base_args=("--model.model", "lm_nano", "--data.test_windows", "64", "--trainer.max_epochs", "5")),
    "mqar": Family(
        "recipes.mqar", _attn_variants(_variant_names()), "val/acc", "test/acc", "query accuracy %, MQAR",
        CONFIGS / "mqar.yaml", _plain_seed, ("--quick",), monitor_args=(),
        knobs=("data.num_pairs", "data.filler", "data.seq_len"), chance=1 / 64),
    "cluttered": Family(
        "recipes.cluttered_digits", _attn_variants(_variant_names()), "val/top1", "test/top1",
        "top-1 %, cluttered digits", CONFIGS / "cluttered_digits.yaml", _plain_seed, ("--quick",), monitor_args=(),
        knobs=("data.k", "data.canvas"), chance=0.1),
}


# -- running -------------------------------------------------------------------------------------
def _lr_tag(lr: float) -> str:
    return f"{lr:g}"


def run_name(variant: str, lr: float, seed: int, knob: tuple[str, str] | None = None) -> str:
    tag = f"_{knob[0].split('.')[-1]}{knob[1]}" if knob else ""
    return f"{variant}_lr{_lr_tag(lr)}_seed{seed}{tag}"


def metric_value(run: dict, key: str) -> float:
    """``summary.metrics[key]`` of a run, nan when it is missing."""
    return float(run.get("summary", {}).get("metrics", {}).get(key, float("nan")))


def _divergence(run_dir: Path) -> dict | None:
    """The divergence record a run left in its log folder (:data:`~diffzoo.tasks.callbacks.DIVERGENCE_FILE`)."""
    try:
        div = latest_log_dir(run_dir) / DIVERGENCE_FILE
    except FileNotFoundError:
        return None
    return json.loads(div.read_text()) if div.is_file() else None


def train_run(family: Family, out: Path, variant: str, lr: float, seed: int, quick: bool, extra: Sequence[str],
              knob: tuple[str, str] | None = None) -> dict:
    """Train one (variant, lr, seed[, knob value]) in a fresh process; its summary, curves and health."""
    name = run_name(variant, lr, seed, knob)
    args = [*family.base_args, *family.variants[variant], "--model.lr", _lr_tag(lr), *family.seed_args(seed),
            *family.monitor_args, *(family.quick if quick else ()), *(("--" + knob[0], knob[1]) if knob else ()), *extra]
    runs = out / "runs"
    record: dict[str, Any] = {"name": name, "variant": variant, "lr": lr, "seed": seed,
                              "knob": list(knob) if knob else None}
    try:
        record["seconds"] = train(recipe_command(family.recipe, runs, name, args), runs / f"{name}.log")
        record.update(read_run(runs / name, (family.val_metric, "train/grad_norm"), steps=True))
        record["diverged"] = _divergence(runs / name)
    except (RuntimeError, FileNotFoundError) as e:
        # a run that diverged stops with an error on purpose (and writes its divergence record): not a failure
        diverged = _divergence(runs / name)
        record.update(failed=None if diverged else str(e), diverged=diverged, summary={}, curves={})
    v = metric_value(record, family.val_metric)
    if not record.get("failed") and not math.isfinite(v) and record["diverged"] is None:
        record["diverged"] = {"what": family.val_metric, "value": str(v)}
    print(f"done: {name}: {family.val_metric} {v:.4g}"
          + (" (diverged)" if record["diverged"] else "") + (f" FAILED: {record['failed']}" if record.get("failed") else ""),
          flush=True)
    return record


def run_all(jobs: list[tuple], family: Family, out: Path, quick: bool, extra: Sequence[str], parallel: int,
            cache: dict[str, dict], save: Callable[[], None]) -> list[dict]:
    """Train every job not in ``cache`` (keyed by run name); the records of all jobs, in order."""
    todo = [j for j in jobs if run_name(*j) not in cache]

    def one(job: tuple) -> dict:
        return train_run(family, out, job[0], job[1], job[2], quick, extra, job[3] if len(job) > 3 else None)

    def store(done: list[dict]) -> None:
        for r in done:
            cache[r["name"]] = r
        save()

    run_jobs(todo, one, parallel, store)
    return [cache[run_name(*j)] for j in jobs]


# -- selection and statistics --------------------------------------------------------------------
def _score(family: Family, values: list[float]) -> float:
    mean = statistics.mean(values)
    return mean if family.higher_is_better else -mean


def best_lrs(family: Family, grid: list[dict]) -> dict[str, dict]:
    """Per variant: ``{"lr", "by_lr": {lr: {"mean", "sd", "n", "diverged"}}}``, the best lr on validation."""
    out: dict[str, dict] = {}
    for variant in dict.fromkeys(r["variant"] for r in grid):
        by_lr: dict[float, dict] = {}
        for lr in dict.fromkeys(r["lr"] for r in grid if r["variant"] == variant):
            rs = [r for r in grid if r["variant"] == variant and r["lr"] == lr]
            vals = [family.scale * metric_value(r, family.val_metric) for r in rs]
            ok = [v for v in vals if math.isfinite(v)]
            diverged = sum(1 for r in rs if r.get("diverged") or r.get("failed"))
            by_lr[lr] = {"mean": statistics.mean(ok) if ok else float("nan"),
                         "sd": statistics.stdev(ok) if len(ok) > 1 else float("nan"), "n": len(ok),
                         "diverged": diverged, "values": vals}
        eligible = [lr for lr, s in by_lr.items() if s["n"]]
        if not eligible:
            out[variant] = {"lr": None, "by_lr": by_lr}
            continue
        out[variant] = {"lr": max(eligible, key=lambda lr, s=by_lr: (s[lr]["diverged"] == 0, _score(family, [s[lr]["mean"]]))),
                        "by_lr": by_lr}
    return out


def _add_holm(rows: list[dict]) -> None:
    """Set ``p_holm`` on every row holding a comparison (``vs``): its permutation p, Holm-adjusted over them."""
    compared = [r for r in rows if "vs" in r]
    for r, p in zip(compared, holm([r["vs"]["p_perm"] for r in compared])):
        r["p_holm"] = p


def comparison_rows(family: Family, runs: list[dict], reference: str, metric: str,
                    group: Callable[[dict], Any] = lambda r: None) -> list[dict]:
    """One row per (group, variant): mean, sd, n of ``metric``; for variants other than ``reference``
    the statistics of :func:`diffzoo.stats.compare` against it, Holm-adjusted over all rows."""
    rows = []
    groups = list(dict.fromkeys(group(r) for r in runs))
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    for g in groups:
        values = {v: [family.scale * metric_value(r, metric) for r in runs if r["variant"] == v and group(r) == g]
                  for v in variants}
        ref = [x for x in values.get(reference, []) if math.isfinite(x)]
        for v in variants:
            vals = [x for x in values[v] if math.isfinite(x)]
            row: dict[str, Any] = {"group": g, "variant": v, "values": values[v], "n": len(vals),
                                   "diverged": len(values[v]) - len(vals),
                                   "mean": statistics.mean(vals) if vals else float("nan"),
                                   "sd": statistics.stdev(vals) if len(vals) > 1 else float("nan")}
            if v != reference and vals and ref:
                row["vs"] = compare(vals, ref).as_dict()
            rows.append(row)
    _add_holm(rows)
    return rows


def _f(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _p(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "–"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


STAT_COLUMNS = ("mean ± sd", "n", "diff vs {ref} [95 % CI]", "Welch t (df)", "p Welch", "p perm", "p Holm")


def stats_table(rows: list[dict], reference: str, digits: int, group_label: str | None = None) -> str:
    """Markdown: one line per row of :func:`comparison_rows`."""
    cols = ((group_label,) if group_label else ()) + ("variant",) + tuple(c.format(ref=reference) for c in STAT_COLUMNS)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        c = r.get("vs")
        cells = [str(r["group"])] if group_label else []
        cells += [r["variant"], f"{_f(r['mean'], digits)} ± {_f(r['sd'], digits)}",
                  f"{r['n']}" + (f" ({r['diverged']} diverged)" if r["diverged"] else "")]
        if c:
            perm = _p(c["p_perm"]) + ("" if c["perm_exact"] else f" (MC {c['perm_count']})")
            cells += [f"{c['diff']:+.{digits}f} [{_f(c['ci_low'], digits)}, {_f(c['ci_high'], digits)}]",
                      f"{_f(c['t'])} ({_f(c['df'], 1)})", _p(c["p_welch"]), perm, _p(r.get("p_holm"))]
        else:
            cells += ["reference" if r["variant"] == reference else "–"] + ["–"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _comparisons_note(rows: list[dict]) -> str:
    n = sum(1 for r in rows if "vs" in r)
    return (f"{n} comparison(s) in this table; p Holm is the permutation p adjusted with Holm's method over "
            f"those {n}. CI: Welch's 95 % interval of the difference of means.")


# Each ablation compared with the variant it changes (variant, its parent, what the pair isolates).
ABLATIONS: tuple[tuple[str, str, str], ...] = (
    ("softmax_wide", "softmax", "fewer, wider heads (H/2 of width 2d)"),
    ("diff", "softmax_wide", "the difference of two maps, at the same head count and width"),
    ("diff_nonorm", "diff", "V1 without the per-head norm and the (1 - lambda_init) scale"),
    ("diff_const", "diff", "constant lambda_init 0.8 instead of the depth schedule"),
    ("diff_v2_matched", "softmax", "V2 with the softmax parameter count"),
)


def ablation_rows(family: Family, runs: list[dict], metric: str) -> list[dict]:
    """One row per pair of :data:`ABLATIONS` whose two variants are both in ``runs``: the variant against
    its parent with :func:`diffzoo.stats.compare`, Holm-adjusted over the rows."""
    rows = []
    for variant, parent, what in ABLATIONS:
        a, b = ([x for r in runs if r["variant"] == v if math.isfinite(x := family.scale * metric_value(r, metric))]
                for v in (variant, parent))
        if a and b:
            rows.append({"variant": variant, "parent": parent, "what": what, "vs": compare(a, b).as_dict()})
    _add_holm(rows)
    return rows


def ablation_table(rows: list[dict], digits: int) -> str:
    """Markdown: each ablation's difference to its parent with the statistics of :func:`stats_table`."""
    lines = ["| variant | against | what it isolates | variant mean ± sd | parent mean ± sd | diff [95 % CI] | "
             "p Welch | p perm | p Holm |", "|" + "---|" * 9]
    for r in rows:
        c = r["vs"]
        lines.append(f"| {r['variant']} | {r['parent']} | {r['what']} | {_f(c['mean_a'], digits)} ± {_f(c['sd_a'], digits)}"
                     f" (n={c['n_a']}) | {_f(c['mean_b'], digits)} ± {_f(c['sd_b'], digits)} (n={c['n_b']}) | "
                     f"{c['diff']:+.{digits}f} [{_f(c['ci_low'], digits)}, {_f(c['ci_high'], digits)}] | "
                     f"{_p(c['p_welch'])} | {_p(c['p_perm'])} | {_p(r.get('p_holm'))} |")
    return "\n".join(lines)


# -- plots ---------------------------------------------------------------------------------------
def _mean_curve(runs: list[dict], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    curves = [r["curves"].get(key) or [] for r in runs]
    curves = [c for c in curves if c]
    if not curves:
        return [], []
    n = min(len(c) for c in curves)
    steps = [s for s, _ in curves[0][:n]]
    return steps, [scale * statistics.mean(c[i][1] for c in curves) for i in range(n)]


def plot_curves(family: Family, runs: list[dict], path: Path) -> None:
    """Validation metric and gradient norm against the step, mean over each variant's final seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=90)
    for variant in dict.fromkeys(r["variant"] for r in runs):
        rs = [r for r in runs if r["variant"] == variant and not r.get("failed")]
        for ax, key, scale in ((axes[0], family.val_metric, family.scale), (axes[1], "train/grad_norm", 1.0)):
            steps, ys = _mean_curve(rs, key, scale)
            if steps:
                ax.plot(steps, ys, marker="." if len(steps) < 30 else None, label=f"{variant} (n={len(rs)})")
    axes[0].set(xlabel="step", ylabel=family.val_metric, title=f"validation: {family.label}")
    axes[1].set(xlabel="step", ylabel="global gradient norm", title="gradient norm (before clipping)", yscale="log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_knob(family: Family, rows: list[dict], knob: str, path: Path, chance: float | None) -> None:
    """Metric against the knob, one line per variant (mean and ± sd)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=90)
    for variant in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == variant]
        xs = [float(r["group"]) for r in rs]
        ax.errorbar(xs, [r["mean"] for r in rs], yerr=[0 if math.isnan(r["sd"]) else r["sd"] for r in rs],
                    marker="o", capsize=3, label=variant)
    if chance is not None:
        ax.axhline(family.scale * chance, color="grey", ls=":", label="chance")
    ax.set(xlabel=knob, ylabel=family.test_metric or family.val_metric, title=family.label)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# -- chance --------------------------------------------------------------------------------------
def _last_logged(metrics_csv: Path) -> dict[str, float]:
    values: dict[str, float] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            values.update({k: float(v) for k, v in row.items() if v not in (None, "") and k not in ("epoch", "step")})
    return values


def score_untrained(family: Family, out: Path, variant: str, seed: int, quick: bool, extra: Sequence[str]) -> dict:
    """The metrics of a randomly initialised ``variant`` (seed ``seed``): the recipe's ``validate``
    subcommand without a checkpoint."""
    name = f"{variant}_seed{seed}"
    folder = out / "chance"
    limits = ("--trainer.limit_val_batches", "2") if quick else ()
    cmd = recipe_command(family.recipe, folder, name, [
        "--config", str(family.config), *family.base_args, *family.variants[variant], *family.seed_args(seed),
        *limits, *extra])
    cmd.insert(3, "validate")  # python -m <recipe> validate --config ...
    seconds = train(cmd, folder / f"{name}.log")
    return {"variant": variant, "seed": seed, "seconds": seconds, "metrics": _last_logged(
        latest_log_dir(folder / name) / "metrics.csv")}


_NOT_SCORES = ("loss", "evaluated", "skipped")  # logged values that are not scores in [0, 1]


def chance_rows(family: Family, scored: list[dict]) -> list[dict]:
    """Per variant and metric (the family's selection and test metrics, then every other score logged
    under ``val/`` or ``test/``): mean, sd, min, max over the random initialisations."""
    rows = []
    keys = {k: (k, family.scale) for k in (family.val_metric, family.test_metric) if k}
    # every other score the validation logs (zero-shot, retrieval, colour-swap ...): as a percentage in a
    # family whose metrics are fractions, as logged otherwise (a perplexity is no fraction)
    for k in sorted({k for s in scored for k in s["metrics"]}):
        if k.startswith(("val/", "test/")) and k not in keys and not any(w in k for w in _NOT_SCORES):
            keys[k] = (f"{k} (%)", 100.0) if family.scale == 100.0 else (k, 1.0)
    for variant in dict.fromkeys(s["variant"] for s in scored):
        for key, (label, scale) in keys.items():
            vals = [scale * s["metrics"][key] for s in scored if s["variant"] == variant and key in s["metrics"]]
            if vals:
                rows.append({"variant": variant, "metric": label, "n": len(vals), "mean": statistics.mean(vals),
                             "sd": statistics.stdev(vals) if len(vals) > 1 else float("nan"),
                             "min": min(vals), "max": max(vals)})
    return rows


def chance_table(family: Family, rows: list[dict], digits: int) -> str:
    lines = ["| variant | metric | untrained: mean ± sd | min - max | inits |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['metric']} | {_f(r['mean'], digits)} ± {_f(r['sd'], digits)} | "
                     f"{_f(r['min'], digits)} - {_f(r['max'], digits)} | {r['n']} |")
    if family.chance is not None:
        lines.append(f"\nUniform guessing scores {family.scale * family.chance:.{digits}f}.")
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------------
def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, choices=list(FAMILIES))
    p.add_argument("--variants", nargs="+", default=None, help="variants (default: softmax diff)")
    p.add_argument("--reference", default="softmax", help="the variant every other one is compared with")
    p.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3, 6e-3])
    p.add_argument("--seeds", type=int, default=2, help="seeds per (variant, lr) of the grid")
    p.add_argument("--final-seeds", type=int, default=5, help="seeds of the final runs at the best lr")
    p.add_argument("--jobs", type=int, default=1, help="trainings at once (one process each)")
    p.add_argument("--knob", default=None, help="a data argument to sweep (mqar: data.num_pairs, data.filler, "
                                                "data.seq_len; cluttered: data.k, data.canvas; speech: "
                                                "data.init_args.snr_fixed_db)")
    p.add_argument("--values", nargs="+", default=None, help="values of --knob")
    p.add_argument("--chance", type=int, default=0, metavar="N", help="score N random initialisations per variant")
    p.add_argument("--quick", action="store_true", help="smoke mode: each training is the recipe's few-step run")
    p.add_argument("--fresh", action="store_true", help="retrain runs already in results.json")
    p.add_argument("--lrs-from", type=Path, default=None, metavar="RESULTS",
                   help="with --knob: each variant's lr from the results.json of another sweep (default: this --out's)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default outputs/sweep/<family>)")
    args, extra = p.parse_known_args(argv)

    family = FAMILIES[args.family]
    variants = args.variants or [v for v in family.default_variants if v in family.variants]
    unknown = [v for v in variants if v not in family.variants]
    if unknown:
        p.error(f"--variants {' '.join(unknown)}: family {args.family} accepts {', '.join(family.variants)}")
    reference = args.reference if args.reference in variants else variants[0]
    if args.knob is not None:
        if args.knob not in family.knobs:
            p.error(f"--knob {args.knob}: family {args.family} has the knobs {', '.join(family.knobs) or 'none'}")
        if not args.values:
            p.error("--knob needs --values")
    out = args.out or Path("outputs/sweep") / args.family
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = _load(results_path)
    cache: dict[str, dict] = {} if args.fresh else dict(results.get("runs", {}))
    made_with = {"extra": results.get("extra", []), "quick": results.get("quick", False)}
    wanted = {"extra": list(extra), "quick": args.quick}
    if cache and not args.chance and made_with != wanted:
        # runs are cached by name (variant, lr, seed, knob): reusing them would mix two set-ups in one table
        p.error(f"{results_path} holds {len(cache)} runs trained with {_setup_words(made_with)}, not "
                f"{_setup_words(wanted)}; give another --out (--lrs-from {results_path} takes its tuned lrs) "
                "or --fresh to retrain them")
    if not args.chance:
        results.update(family=args.family, recipe=family.recipe, extra=list(extra), quick=args.quick)

    def save() -> None:
        results["runs"] = cache
        results_path.write_text(json.dumps(results, indent=1))

    digits = 2 if family.scale != 1.0 else 3
    start = time.time()
    texts = []
    if args.chance:
        jobs = [(v, s) for v in variants for s in range(args.chance)]
        scored = run_jobs(jobs, lambda j: score_untrained(family, out, j[0], j[1], args.quick, extra), args.jobs)
        rows = chance_rows(family, scored)
        results["chance"] = {"scored": scored, "rows": rows}
        text = f"## {family.label}: untrained models ({args.chance} initialisations per variant)\n\n"
        text += chance_table(family, rows, digits)
        (out / "chance.md").write_text(text + "\n")
        texts.append(text)
    elif args.knob is not None:
        if args.lrs_from and not args.lrs_from.is_file():
            p.error(f"--lrs-from {args.lrs_from}: no such file (the results.json of a finished sweep)")
        tuned = _load(args.lrs_from) if args.lrs_from else results
        sweep_best = {v: b["lr"] for v, b in (tuned.get("best") or {}).items()}
        lrs = {}
        for v in variants:
            lrs[v] = args.lrs[0] if len(args.lrs) == 1 else sweep_best.get(v)
            if lrs[v] is None:
                p.error(f"no best lr of {v} in {args.lrs_from or results_path}; run the sweep first or give one "
                        "value to --lrs")
        jobs = [(v, lrs[v], 100 + s, (args.knob, str(x))) for x in args.values for v in variants
                for s in range(args.final_seeds)]
        reuse_final_runs(jobs, cache, config_value(family.config, args.knob))  # the cache's set-up was checked above
        runs = run_all(jobs, family, out, args.quick, extra, args.jobs, cache, save)
        metric = family.test_metric or family.val_metric
        rows = comparison_rows(family, runs, reference, metric, group=lambda r: r["knob"][1])
        results["knob_result"] = {"knob": args.knob, "values": args.values, "lrs": lrs, "rows": rows}
        text = (f"## {family.label} against {args.knob} ({metric}, {args.final_seeds} seeds per cell; "
                f"lr per variant: {', '.join(f'{v} {lr:g}' for v, lr in lrs.items())})\n\n"
                + stats_table(rows, reference, digits, args.knob) + "\n\n" + _comparisons_note(rows))
        plot_knob(family, rows, args.knob, out / "knob.png", family.chance)
        (out / "knob.md").write_text(text + "\n")
        texts.append(text + f"\n\nplot: {out / 'knob.png'}")
    else:
        grid_jobs = [(v, lr, s) for v in variants for lr in args.lrs for s in range(args.seeds)]
        grid = run_all(grid_jobs, family, out, args.quick, extra, args.jobs, cache, save)
        best = best_lrs(family, grid)
        results["best"] = best
        save()
        final_jobs = [(v, best[v]["lr"], 100 + s) for v in variants if best[v]["lr"] is not None
                      for s in range(args.final_seeds)]
        final = run_all(final_jobs, family, out, args.quick, extra, args.jobs, cache, save)
        metric = family.test_metric or family.val_metric
        text = grid_text(family, best, args.lrs, digits) + "\n\n"
        if final:
            rows = comparison_rows(family, final, reference, metric)
            results["final"] = {"metric": metric, "rows": rows, "runs": [r["name"] for r in final]}
            text += (f"## Final runs at each variant's best lr ({metric}"
                     + ("" if family.test_metric else ", validation: this task has no test split")
                     + f", seeds 100-{99 + args.final_seeds})\n\n" + stats_table(rows, reference, digits) + "\n\n"
                     + _comparisons_note(rows))
            ablations = ablation_rows(family, final, metric)
            if ablations:
                results["final"]["ablations"] = ablations
                text += (f"\n\n## Ablations: each variant against the one it changes ({metric})\n\n"
                         + ablation_table(ablations, digits) + "\n\n" + _comparisons_note(ablations))
        else:
            text += "No final runs (--final-seeds 0): the grid above is the whole result."
        text += "\n\n" + divergence_text(grid + final)
        plot_curves(family, final or grid, out / "curves.png")
        (out / "sweep.md").write_text(text + "\n")
        texts.append(text + f"\n\ncurves: {out / 'curves.png'}")
    results["seconds"] = time.time() - start
    save()
    print("\n\n".join(texts))
    print(f"\n({results['seconds']:.0f} s wall; everything in {results_path})")
    return results


def _setup_words(setup: dict) -> str:
    extra = " ".join(setup["extra"]) or "no extra arguments"
    return f"{extra}{' (--quick)' if setup['quick'] else ''}"


def config_value(config: Path, key: str) -> str | None:
    """The value of a dotted ``key`` (``data.k``) in a recipe's YAML config, as a string; None if absent."""
    import yaml

    node: Any = yaml.safe_load(config.read_text())
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part, node.get("init_args", {}).get(part) if "init_args" in node else None)
    return None if node is None or isinstance(node, dict) else str(node)


def reuse_final_runs(jobs: list[tuple], cache: dict[str, dict], default: str | None) -> int:
    """Knob jobs whose value is the config's default are the final runs of the sweep (same variant, lr,
    seed and arguments): copy those records under the knob's run name instead of training again."""
    reused = 0
    for variant, lr, seed, knob in jobs:
        name, plain = run_name(variant, lr, seed, knob), run_name(variant, lr, seed)
        if default is None or knob[1] != default or name in cache or plain not in cache:
            continue
        cache[name] = {**cache[plain], "name": name, "knob": list(knob), "reused_from": plain}
        reused += 1
    if reused:
        print(f"{reused} run(s) at the default {jobs[0][3][0]}={default} are the sweep's final runs: reused", flush=True)
    return reused


def grid_text(family: Family, best: dict, lrs: Sequence[float], digits: int) -> str:
    """The grid: validation mean ± sd per (variant, lr), the chosen lr in bold."""
    head = "| variant | " + " | ".join(f"lr {_lr_tag(lr)}" for lr in lrs) + " | best lr |"
    lines = [f"## Learning-rate grid ({family.val_metric}, validation)\n", head, "|" + "---|" * (len(lrs) + 2)]
    for v, b in best.items():
        cells = []
        for lr in lrs:
            s = b["by_lr"].get(lr)
            if s is None:
                cells.append("–")
                continue
            cell = f"{_f(s['mean'], digits)} ± {_f(s['sd'], digits)}" + (f" ({s['diverged']} div.)" if s["diverged"] else "")
            cells.append(f"**{cell}**" if lr == b["lr"] else cell)
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {_lr_tag(b['lr']) if b['lr'] else '–'} |")
    return "\n".join(lines)


def divergence_text(runs: list[dict]) -> str:
    bad = [r for r in runs if r.get("diverged") or r.get("failed")]
    if not bad:
        return f"Divergences: none of {len(runs)} runs."
    return f"Divergences / failures ({len(bad)} of {len(runs)} runs): " + "; ".join(
        f"{r['name']} ({'failed' if r.get('failed') else 'diverged at step ' + str(r['diverged'].get('step', '?'))})"
        for r in bad)


if __name__ == "__main__":
    main()
