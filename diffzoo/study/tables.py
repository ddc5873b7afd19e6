"""Selection and statistics of a study's records: each variant's best learning rate, the comparison of
every variant with a reference (:func:`diffzoo.stats.compare`, Holm's correction over a table), ablations
against the variant each one changes, the scores of untrained models, the per-clip statistics of the
speech runs (voices resampled, the gap against the SNR), and their markdown tables."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..stats import cluster_bootstrap_diff, compare, fisher_exact, holm, snr_interaction
from .families import FAMILIES, Family, lr_tag, metric_value
from .recipe import PLATEAU_ABS, PLATEAU_TAIL, PLATEAU_TOL, plateau


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
        out[variant] = {"lr": _pick_lr(family, by_lr, eligible), "by_lr": by_lr}
    return out


TIE_REL = 1e-6  # means closer than this (relative) are a tie: float32 round-off of one metric, not a difference


def _pick_lr(family: Family, by_lr: dict[float, dict], eligible: list[float]) -> float:
    """The best of ``eligible``: lrs with no diverged run first, then the best mean. Means equal to within
    float32 round-off (:data:`TIE_REL`) tie; a tie goes to the smaller seed sd, then to the smaller lr, so
    the choice never rests on the last bit of a float."""
    stable = [lr for lr in eligible if by_lr[lr]["diverged"] == 0] or eligible
    score = {lr: _score(family, [by_lr[lr]["mean"]]) for lr in stable}
    top = max(score.values())
    tied = [lr for lr in stable if math.isclose(score[lr], top, rel_tol=TIE_REL, abs_tol=1e-12)]
    return min(tied, key=lambda lr: (by_lr[lr]["sd"] if math.isfinite(by_lr[lr]["sd"]) else math.inf, lr))


def add_holm(rows: list[dict]) -> None:
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
    add_holm(rows)
    return rows


def fmt(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def fmt_p(x: float | None) -> str:
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
        cells += [r["variant"], f"{fmt(r['mean'], digits)} ± {fmt(r['sd'], digits)}",
                  f"{r['n']}" + (f" ({r['diverged']} diverged)" if r["diverged"] else "")]
        if c:
            perm = fmt_p(c["p_perm"]) + ("" if c["perm_exact"] else f" (MC {c['perm_count']})")
            cells += [f"{c['diff']:+.{digits}f} [{fmt(c['ci_low'], digits)}, {fmt(c['ci_high'], digits)}]",
                      f"{fmt(c['t'])} ({fmt(c['df'], 1)})", fmt_p(c["p_welch"]), perm, fmt_p(r.get("p_holm"))]
        else:
            cells += ["reference" if r["variant"] == reference else "–"] + ["–"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparisons_note(rows: list[dict]) -> str:
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


def success_rows(family: Family, runs: list[dict], reference: str, metric: str) -> list[dict]:
    """Per variant: ``k`` of its ``n`` runs reach ``family.success`` in ``metric`` (in the family's scale: at or
    above it, at or below it for a family whose lower values are better; a run that diverged counts as not
    reaching it), each run's ``values`` (by seed); for variants other than
    ``reference``, ``p_fisher``: Fisher's exact two-sided p that both counts come from one success rate."""
    if family.success is None:
        raise ValueError(f"the family {family.label!r} states no success threshold")
    rows = []
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = sorted((r for r in runs if r["variant"] == variant), key=lambda r: r["seed"])
        values = [family.scale * metric_value(r, metric) for r in mine]
        rows.append({"variant": variant, "n": len(values), "values": values,
                     "k": sum(1 for x in values if math.isfinite(x)
                              and (x >= family.success if family.higher_is_better else x <= family.success))})
    ref = next((r for r in rows if r["variant"] == reference), None)
    for r in rows:
        if ref is not None and r is not ref:
            r["p_fisher"] = fisher_exact(r["k"], r["n"], ref["k"], ref["n"])
    return rows


def success_table(family: Family, rows: list[dict], reference: str, digits: int = 1) -> str:
    """Markdown: one line per row of :func:`success_rows`."""
    unit = " %" if family.scale == 100.0 else ""
    lines = [f"| variant | runs reaching {family.success:g}{unit} | each run, by seed | Fisher's exact p vs {reference} |",
             "|---|---|---|---|"]
    for r in rows:
        each = ", ".join(fmt(x, digits) for x in r["values"])
        p = fmt_p(r["p_fisher"]) if "p_fisher" in r else ("reference" if r["variant"] == reference else "–")
        lines.append(f"| {r['variant']} | {r['k']} of {r['n']} | {each} | {p} |")
    return "\n".join(lines)


def ablation_rows(family: Family, runs: list[dict], metric: str) -> list[dict]:
    """One row per pair of :data:`ABLATIONS` whose two variants are both in ``runs``: the variant against
    its parent with :func:`diffzoo.stats.compare`, Holm-adjusted over the rows."""
    rows = []
    for variant, parent, what in ABLATIONS:
        a, b = ([x for r in runs if r["variant"] == v if math.isfinite(x := family.scale * metric_value(r, metric))]
                for v in (variant, parent))
        if a and b:
            rows.append({"variant": variant, "parent": parent, "what": what, "vs": compare(a, b).as_dict()})
    add_holm(rows)
    return rows


def ablation_table(rows: list[dict], digits: int) -> str:
    """Markdown: each ablation's difference to its parent with the statistics of :func:`stats_table`."""
    lines = ["| variant | against | what it isolates | variant mean ± sd | parent mean ± sd | diff [95 % CI] | "
             "p Welch | p perm | p Holm |", "|" + "---|" * 9]
    for r in rows:
        c = r["vs"]
        lines.append(f"| {r['variant']} | {r['parent']} | {r['what']} | {fmt(c['mean_a'], digits)} ± {fmt(c['sd_a'], digits)}"
                     f" (n={c['n_a']}) | {fmt(c['mean_b'], digits)} ± {fmt(c['sd_b'], digits)} (n={c['n_b']}) | "
                     f"{c['diff']:+.{digits}f} [{fmt(c['ci_low'], digits)}, {fmt(c['ci_high'], digits)}] | "
                     f"{fmt_p(c['p_welch'])} | {fmt_p(c['p_perm'])} | {fmt_p(r.get('p_holm'))} |")
    return "\n".join(lines)


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
        lines.append(f"| {r['variant']} | {r['metric']} | {fmt(r['mean'], digits)} ± {fmt(r['sd'], digits)} | "
                     f"{fmt(r['min'], digits)} - {fmt(r['max'], digits)} | {r['n']} |")
    if family.chance is not None:
        lines.append(f"\nUniform guessing scores {family.scale * family.chance:.{digits}f}.")
    return "\n".join(lines)


def grid_text(family: Family, best: dict, lrs: Sequence[float], digits: int) -> str:
    """The grid: validation mean ± sd per (variant, lr), the chosen lr in bold."""
    head = "| variant | " + " | ".join(f"lr {lr_tag(lr)}" for lr in lrs) + " | best lr |"
    lines = [f"## Learning-rate grid ({family.val_metric}, validation)\n", head, "|" + "---|" * (len(lrs) + 2)]
    for v, b in best.items():
        cells = []
        for lr in lrs:
            s = b["by_lr"].get(lr)
            if s is None:
                cells.append("–")
                continue
            cell = f"{fmt(s['mean'], digits)} ± {fmt(s['sd'], digits)}" + (f" ({s['diverged']} div.)" if s["diverged"] else "")
            cells.append(f"**{cell}**" if lr == b["lr"] else cell)
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {lr_tag(b['lr']) if b['lr'] else '–'} |")
    return "\n".join(lines)


def divergence_text(runs: list[dict]) -> str:
    bad = [r for r in runs if r.get("diverged") or r.get("failed")]
    if not bad:
        return f"Divergences: none of {len(runs)} runs."
    return f"Divergences / failures ({len(bad)} of {len(runs)} runs): " + "; ".join(
        f"{r['name']} ({'failed' if r.get('failed') else 'diverged at step ' + str(r['diverged'].get('step', '?'))})"
        for r in bad)


def run_plateau(family: Family, run: dict) -> dict | None:
    """:func:`~diffzoo.study.recipe.plateau` of a run's validation curve, as a dict (None: too few points)."""
    curve = (run.get("curves") or {}).get(family.val_metric) or []
    found = plateau(curve, family.higher_is_better, bounded=family.scale != 1.0)
    return found.as_dict() if found else None


def plateau_text(family: Family, runs: list[dict]) -> str:
    """How many of each variant's runs had flattened by the end (the study's plateau rule)."""
    parts = []
    for v in dict.fromkeys(r["variant"] for r in runs):
        found = [run_plateau(family, r) for r in runs if r["variant"] == v]
        flat = sum(1 for f in found if f and f["flat"])
        gains = [f["gain"] * family.scale for f in found if f]
        gain = f", mean gain over the tail {statistics.mean(gains):+.3g}" if gains else ""
        parts.append(f"{v} {flat}/{len(found)}{gain}")
    return (f"Plateau (validation {family.val_metric} improved by less than {100 * PLATEAU_TOL:g} % of its value, "
            + (f"or {100 * PLATEAU_ABS:g} points, " if family.scale != 1.0 else "")
            + f"over the last {100 * PLATEAU_TAIL:g} % of the steps): " + "; ".join(parts) + ".")


def speech_voice_stats(records: dict, reference: str = "softmax", n_boot: int = 10_000, seed: int = 0,
                       variants: Collection[str] | None = None) -> dict:
    """Per-clip statistics of a speech records file (a sweep's ``results.json``, loaded): every variant
    against ``reference`` by :func:`diffzoo.stats.cluster_bootstrap_diff` (test voices resampled as clusters,
    silence clips as their own stratum, seeds resampled within each variant) and
    :func:`diffzoo.stats.snr_interaction` (logit scale, variant labels permuted across runs).

    The runs used are the final runs (seed >= 100, no knob) at each variant's best lr that carry
    ``test_clips`` (runs recorded before the sweep kept them have none and are skipped); runs whose clips
    (voice, SNR, label of each) differ from the reference's first run are left out and counted in
    ``mismatched``. With ``variants``, only the runs of those variants count (the study passes the ones that have
    all their final seeds, so a variant's test scores are not shown half-way through them); without the
    reference among them there are no rows. Accuracies and their differences are in the family's scale (percent
    for speech); SNR slopes are log-odds per dB. The interaction is None when the clips' SNR does not vary (a
    fixed-SNR run).

    Returns ``{"reference", "metric", "clips", "voices", "unclustered", "mismatched", "rows"}`` with one row per
    other variant: ``{"variant", "n", "n_reference", "bootstrap", "interaction"}``.
    """
    family = FAMILIES.get(records.get("family", "speech"), FAMILIES["speech"])
    best = {v: b.get("lr") for v, b in (records.get("best") or {}).items()}
    runs = [r for r in (records.get("runs") or {}).values()
            if r.get("test_clips") and not r.get("knob") and r.get("seed", 0) >= 100 and best.get(r["variant"]) == r["lr"]
            and not r.get("diverged") and not r.get("failed") and (variants is None or r["variant"] in variants)]
    out: dict[str, Any] = {"reference": reference, "metric": "per-clip test correctness", "clips": 0, "voices": 0,
                           "unclustered": 0, "mismatched": 0, "rows": []}
    ref_runs = sorted((r for r in runs if r["variant"] == reference), key=lambda r: r["seed"])
    if not ref_runs:
        return out
    table = [tuple(c[:3]) for c in ref_runs[0]["test_clips"]]  # (voice, snr_db, label) of every clip
    same = [r for r in runs if [tuple(c[:3]) for c in r["test_clips"]] == table]
    out["mismatched"] = len(runs) - len(same)
    voices = [c[0] for c in table]
    snrs = [c[1] for c in table]
    out.update(clips=len(table), voices=len({v for v in voices if v is not None}),
               unclustered=sum(1 for v in voices if v is None))

    def correct(variant: str) -> list[list[float]]:
        chosen = sorted((r for r in same if r["variant"] == variant), key=lambda r: r["seed"])
        return [[float(c[2] == c[3]) for c in r["test_clips"]] for r in chosen]

    b = correct(reference)
    scale = family.scale
    varies = len({x for x in snrs if x is not None}) > 1
    for variant in dict.fromkeys(r["variant"] for r in same):
        if variant == reference:
            continue
        a = correct(variant)
        boot = cluster_bootstrap_diff(a, b, voices, n_boot=n_boot, seed=seed).as_dict()
        for key in ("diff", "mean_a", "mean_b", "ci_low", "ci_high"):
            boot[key] *= scale
        for c in boot["by_cluster"]:
            for key in ("mean_a", "mean_b", "diff"):
                c[key] *= scale
        inter = snr_interaction(a, b, snrs, seed=seed).as_dict() if varies else None
        if inter is not None:
            for g in inter["gap_by_bin"]:
                for key in ("mean_a", "mean_b", "diff"):
                    g[key] *= scale
        out["rows"].append({"variant": variant, "n": len(a), "n_reference": len(b), "bootstrap": boot,
                            "interaction": inter})
    return out


def speech_voice_table(result: dict, digits: int = 2) -> str:
    """Markdown: one line per row of :func:`speech_voice_stats`."""
    ref = result["reference"]
    lines = [f"| variant | runs (vs {ref}) | diff vs {ref}, voices resampled [95 % CI] | p boot | "
             "SNR slope diff (log-odds/dB) [95 % CI] | p perm | gap per SNR third (low → high) |", "|" + "---|" * 7]
    for r in result["rows"]:
        b, s = r["bootstrap"], r["interaction"]
        cells = [r["variant"], f"{r['n']} ({r['n_reference']})",
                 f"{b['diff']:+.{digits}f} [{fmt(b['ci_low'], digits)}, {fmt(b['ci_high'], digits)}]", fmt_p(b["p"])]
        if s is None:
            cells += ["– (SNR fixed)", "–", "–"]
        else:
            cells += [f"{s['diff']:+.4f} [{fmt(s['ci_low'], 4)}, {fmt(s['ci_high'], 4)}]", fmt_p(s["p_perm"]),
                      ", ".join(f"{g['diff']:+.{digits}f}" for g in s["gap_by_bin"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
