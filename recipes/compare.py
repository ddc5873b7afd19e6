"""The cross-modal study: differential vs softmax attention, encoders and a decoder, matched parameters.

    OMP_NUM_THREADS=1 python -m recipes.compare                   # collect finished runs, write the table
    OMP_NUM_THREADS=1 python -m recipes.compare --run --jobs 2    # train what is missing first
    OMP_NUM_THREADS=1 python -m recipes.compare --analysis        # plus diffzoo.analysis on the checkpoints

Every family is trained by its own comparison recipe (``recipes.vit_compare``, ``recipes.clip_compare``,
``recipes.speech_compare``, ``recipes.lm_compare``): the differential model and its matched softmax
baseline, the same data, recipe and seeds. Those recipes write ``outputs/<family>_compare/results.json``;
this one reads them (``--run`` first starts the recipes whose results are missing, with the seeds given)
and writes one table: setting, parameters of each model, the metric of each (mean ± sample standard
deviation over seeds), the difference with its 95 % Welch interval, Welch's t and p, the exact
permutation p (:mod:`diffzoo.stats`) and that p adjusted with Holm's method over every row of the table
(the number of comparisons is stated under it).

``--analysis`` loads each run's exported weights and measures, with :mod:`diffzoo.analysis`, the
attention entropy and the share of attention on the task's relevant tokens, lambda by depth, activation
outliers, and the task metric with the attention logits quantised to 8, 6 and 4 bits; the plots go to
``--plots`` (default ``docs/results``). Everything is also written to ``outputs/compare/study.json`` and,
as markdown, to ``outputs/compare/study.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from diffzoo.stats import compare, holm

OUT = Path("outputs/compare")


@dataclass(frozen=True)
class Metric:
    key: str  # where the value sits in a run's ``summary.metrics`` (or a callable's name)
    label: str
    higher_is_better: bool = True
    scale: float = 1.0
    get: Callable[[dict], float] | None = None  # for values not in summary.metrics
    digits: int = 2  # decimals in the table

    def value(self, run: dict) -> float:
        if self.get is not None:
            return self.get(run) * self.scale
        return float(run["summary"]["metrics"][self.key]) * self.scale


def _lm_retrieval(run: dict) -> float:
    rows = run.get("retrieval") or []
    total = sum(r["n"] for r in rows)
    return sum(r["correct"] for r in rows) / total if total else float("nan")


@dataclass(frozen=True)
class Family:
    name: str  # short name, also the recipe: recipes.<name>_compare
    setting: str
    side: str  # "encoder" or "decoder"
    diff: str  # model (or attention) name of the differential run
    soft: str
    metrics: tuple[Metric, ...]
    run_key: str = "model"  # the field of a run that holds ``diff`` / ``soft``
    recipe_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def results(self) -> Path:
        return Path(f"outputs/{self.name}_compare/results.json")

    @property
    def recipe(self) -> str:
        return f"recipes.{self.name}_compare"


FAMILIES: dict[str, Family] = {
    "vit": Family(
        "vit", "ViT, embedded MNIST digits (10 classes)", "encoder",
        "diffvit_nano_patch7_28", "softvit_nano_patch7_28",
        (Metric("val/top1", "val top-1 %", scale=100),),
        recipe_args=("--jobs", "{jobs}"),
    ),
    "clip": Family(
        "clip", "CLIP image + text towers, coloured digits", "encoders", "DiffCLIP-nano", "SoftCLIP-nano",
        (Metric("val/zs_top1", "held-out zero-shot top-1 % (300 captions)", scale=100),
         Metric("val/zs_pair", "held-out caption beats its colour swap %", scale=100),
         Metric("val/i2t_r1", "image->text R@1 % (seen pairs)", scale=100)),
        recipe_args=("--jobs", "{jobs}"),
    ),
    "speech": Family(
        "speech", "keyword encoder, synthesised keywords (12 classes)", "encoder", "diffkwt_nano", "softkwt_nano",
        (Metric("test/top1", "test top-1 % (unseen voices)", scale=100),),
        recipe_args=("--jobs", "{jobs}"),
    ),
    "lm": Family(
        "lm", "causal LM, byte-level pydoc text", "decoder", "diff", "softmax",
        (Metric("val/loss", "val loss (nats/byte)", higher_is_better=False, digits=3),
         Metric("retrieval", "needle retrieval %", scale=100, get=_lm_retrieval)),
        run_key="attn", recipe_args=("--parallel", "{jobs}"),
    ),
}


def load_runs(family: Family) -> list[dict]:
    """The finished runs of ``family`` (its comparison recipe's results.json); [] if there are none."""
    if not family.results.is_file():
        return []
    runs = json.loads(family.results.read_text())
    if not isinstance(runs, list):
        raise ValueError(f"{family.results}: expected a list of runs, got {type(runs).__name__}")
    return [r for r in runs if r.get(family.run_key) in (family.diff, family.soft)]


def run_family(family: Family, seeds: list[int], jobs: int, extra: list[str]) -> None:
    """Start ``family``'s comparison recipe in a fresh process (it writes its own results.json)."""
    args = [a.format(jobs=jobs) for a in family.recipe_args]
    cmd = [sys.executable, "-m", family.recipe, "--seeds", *map(str, seeds), *args, *extra]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _params(runs: list[dict]) -> int | None:
    for r in runs:
        p = r.get("params") or r.get("summary", {}).get("parameters") or r.get("summary", {}).get("params")
        if p:
            return int(p)
    return None


def compare_rows(family: Family, runs: list[dict]) -> list[dict]:
    """One row per metric: both models' per-seed values, means, spreads, the difference (diff - soft) and
    its statistics (:func:`diffzoo.stats.compare`); ``p_holm`` is filled in by :func:`adjust`."""
    diff = sorted((r for r in runs if r[family.run_key] == family.diff), key=lambda r: r["seed"])
    soft = sorted((r for r in runs if r[family.run_key] == family.soft), key=lambda r: r["seed"])
    rows = []
    for m in family.metrics:
        d = [m.value(r) for r in diff]
        s = [m.value(r) for r in soft]
        if not d or not s:
            continue
        c = compare(d, s)
        better = c.diff > 0 if m.higher_is_better else c.diff < 0
        rows.append(dict(
            family=family.name, setting=family.setting, side=family.side, metric=m.label,
            higher_is_better=m.higher_is_better, diff_model=family.diff, soft_model=family.soft,
            diff_params=_params(diff), soft_params=_params(soft), diff_values=d, soft_values=s,
            diff_seeds=[r["seed"] for r in diff], soft_seeds=[r["seed"] for r in soft],
            diff_mean=c.mean_a, diff_sd=c.sd_a, soft_mean=c.mean_b, soft_sd=c.sd_b, delta=c.diff,
            ci_low=c.ci_low, ci_high=c.ci_high, t=c.t, df=c.df, p_welch=c.p_welch, p_perm=c.p_perm,
            perm_exact=c.perm_exact, perm_count=c.perm_count, p_holm=float("nan"), diff_better=better,
            digits=m.digits,
        ))
    return rows


def adjust(rows: list[dict]) -> list[dict]:
    """Fill ``p_holm``: the permutation p-values adjusted with Holm's method over all ``rows``."""
    for row, p in zip(rows, holm([r["p_perm"] for r in rows])):
        row["p_holm"] = p
    return rows


def _fmt_params(p: int | None) -> str:
    return f"{p / 1e6:.2f} M" if p and p >= 1e6 else (f"{p / 1e3:.0f} k" if p else "?")


def _num(x: float, spec: str) -> str:
    return "–" if x is None or math.isnan(x) else format(x, spec)


def _pv(p: float) -> str:
    return "–" if p is None or math.isnan(p) else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def markdown_table(rows: list[dict]) -> str:
    """The study table, with a line stating the number of comparisons the Holm correction covers."""
    head = (
        "| setting | side | metric | params diff / softmax | differential | softmax | difference (diff - soft) "
        "[95 % CI] | Welch t (df) | p Welch | p perm | p Holm | seeds |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        arrow = "higher is better" if r["higher_is_better"] else "lower is better"
        f = f".{r.get('digits', 2)}f"
        perm = _pv(r["p_perm"]) + ("" if r["perm_exact"] else f" (MC {r['perm_count']})")
        lines.append(
            f"| {r['setting']} | {r['side']} | {r['metric']} ({arrow}) | "
            f"{_fmt_params(r['diff_params'])} / {_fmt_params(r['soft_params'])} | "
            f"{r['diff_mean']:{f}} ± {_num(r['diff_sd'], f)} | {r['soft_mean']:{f}} ± {_num(r['soft_sd'], f)} | "
            f"{r['delta']:+{f}} [{_num(r['ci_low'], f)}, {_num(r['ci_high'], f)}] | "
            f"{_num(r['t'], '.2f')} ({_num(r['df'], '.1f')}) | {_pv(r['p_welch'])} | {perm} | {_pv(r['p_holm'])} | "
            f"{len(r['diff_values'])} + {len(r['soft_values'])} |"
        )
    lines.append(
        f"\n{len(rows)} comparison(s); p perm: permutation test of the difference of means (exact over every "
        f"split of the seeds unless marked MC), p Holm: p perm adjusted with Holm's method over the {len(rows)}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds for --run")
    p.add_argument("--run", action="store_true", help="train the families whose results are missing")
    p.add_argument("--rerun", action="store_true", help="train every family again, even with results")
    p.add_argument("--jobs", type=int, default=2, help="trainings at once where a family's recipe allows it")
    p.add_argument("--analysis", action="store_true", help="run diffzoo.analysis on the trained models")
    p.add_argument("--analysis-seeds", type=int, nargs="+", default=None,
                   help="seeds analysed (default: every collected seed)")
    p.add_argument("--plots", type=Path, default=Path("docs/results"), help="folder for the analysis plots")
    p.add_argument("--out", type=Path, default=OUT)
    args, extra = p.parse_known_args(argv)

    start = time.time()
    rows, missing = [], []
    for name in args.families:
        family = FAMILIES[name]
        runs = load_runs(family)
        if args.rerun or (args.run and not runs):
            run_family(family, args.seeds, args.jobs, extra)
            runs = load_runs(family)
        if not runs:
            missing.append(name)
            continue
        rows.extend(compare_rows(family, runs))
    adjust(rows)
    study: dict = {"rows": rows, "missing": missing, "comparisons": len(rows)}
    text = markdown_table(rows) if rows else "(no finished runs)"
    if missing:
        text += "\n\nNo results for: " + ", ".join(
            f"{m} (`python -m {FAMILIES[m].recipe}` or `--run`)" for m in missing)
    if args.analysis:
        from recipes import compare_analysis

        study["analysis"] = compare_analysis.analyse(
            [FAMILIES[n] for n in args.families if n not in missing], load_runs, args.analysis_seeds, args.plots)
        text += "\n\n" + compare_analysis.markdown(study["analysis"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "study.json").write_text(json.dumps(study, indent=1))
    (args.out / "study.md").write_text(text + "\n")
    print(text)
    print(f"\n({time.time() - start:.0f} s; written to {args.out / 'study.md'} and study.json)")
    return study


if __name__ == "__main__":
    main()
