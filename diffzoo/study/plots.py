"""Plots of a study: mean curves of each variant's runs, and the metric against a knob."""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path

from .families import GRAD_NORM, Family


def mean_curve(runs: list[dict], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    """The mean of the runs' ``key`` curves (``[step, value]`` pairs), cut to the shortest, times ``scale``."""
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
        for ax, key, scale in ((axes[0], family.val_metric, family.scale), (axes[1], GRAD_NORM, 1.0)):
            steps, ys = mean_curve(rs, key, scale)
            if steps:
                ax.plot(steps, ys, marker="." if len(steps) < 30 else None, label=f"{variant} (n={len(rs)})")
    axes[0].set(xlabel="step", ylabel=family.val_metric)
    axes[0].set_title("validation: " + textwrap.fill(family.label, 60), fontsize=9)  # long task labels wrap
    axes[1].set(xlabel="step", ylabel="global gradient norm", yscale="log")
    axes[1].set_title("gradient norm (before clipping)", fontsize=9)
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


def plot_grid(family: Family, best: dict[str, dict], path: Path) -> None:
    """The learning-rate grid: each grid seed's validation metric (dots) and their mean (line) against the lr
    (log axis), one line per variant; the chosen lr of each variant ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=90)
    ticks: set[float] = set()
    for variant, b in best.items():
        by_lr = sorted((float(lr), cell) for lr, cell in (b.get("by_lr") or {}).items())
        if not by_lr:
            continue
        xs = [lr for lr, _ in by_lr]
        ticks.update(xs)
        line = ax.plot(xs, [c["mean"] for _, c in by_lr], marker="o", ms=3, label=variant)[0]
        for lr, c in by_lr:
            vals = [v for v in c.get("values", []) if math.isfinite(v)]
            ax.scatter([lr] * len(vals), vals, s=9, alpha=0.45, color=line.get_color())
            if b.get("lr") is not None and math.isclose(lr, b["lr"]):
                ax.scatter([lr], [c["mean"]], s=90, facecolors="none", edgecolors=line.get_color())
    if family.chance is not None:
        ax.axhline(family.scale * family.chance, color="grey", ls=":", label="chance")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel=f"{family.val_metric} (grid seeds)",
           title=f"lr grid: {family.label}"[:90])
    ax.minorticks_off()
    ax.set_xticks(sorted(ticks), [f"{x:g}" for x in sorted(ticks)], fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
