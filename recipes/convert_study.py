"""What converting a trained softmax model to differential attention buys, on MQAR (``python -m recipes.mqar``).

    OMP_NUM_THREADS=1 python -m recipes.convert_study --jobs 2 \\
        --source-runs 'outputs/study/mqar/runs/softmax_lr0.003_seed10[0-4]'
    python -m recipes.convert_study --quick            # seconds: two tiny source runs, the whole pipeline

The sources are finished softmax runs of ``python -m recipes.mqar`` (folders holding ``version_N/`` with
``model.safetensors``, ``config.yaml`` and ``summary.json``), one per seed. From each source:

=================== ===========================================================================
arm                 what is trained
=================== ===========================================================================
softmax_continued   the source model, ``--steps`` more steps (``python -m recipes.convert --attn
                    softmax``: the weights unchanged, in the converted-folder format)
diff_v2_converted   the source converted to differential V2 (exact: it starts on the source's
                    function), fine-tuned ``--steps`` steps
diff_converted      the source converted to differential V1 (``diff``: projections copied, lambda
                    fixed at ``lambda_init`` 0, sub-norms calibrated on random tokens), fine-tuned
diff_scratch        differential V1 trained from scratch for the whole budget (``--scratch-steps``,
                    default the source's steps + ``--steps``)
diff_v2_scratch     differential V2 likewise
=================== ===========================================================================

Every run starts from the source's ``config.yaml`` (same shape, data, batch size, weight decay, betas,
clipping, validation and test sets) at the source's learning rate (``--lr`` overrides it). Fine-tuning
warms up for ``--warmup`` steps, then decays by the source's cosine over ``--steps``; its training data
is drawn with the data seed ``source data seed + --data-seed-offset`` (1000: sequences the source never
saw, the same for the three fine-tuned arms of one source) and ``--seed_everything`` is the source's.
The from-scratch runs use the source's seeds, data seed and warm-up. Before any fine-tuning each
starting point is scored on the validation and test sets (the recipe's ``validate`` subcommand with
``--model.init_from``, in this process: a fraction of a second each): step 0, where V2 must equal the
source and V1 shows its conversion gap.

Every training is ``python -m recipes.mqar`` in a fresh process (:mod:`diffzoo.study.runs`), ``--jobs`` at a
time; validation every ``--eval-every`` steps. Written to ``--out`` (default
``outputs/convert_study``): ``start/<source>/<arm>/`` (the converted folders), ``runs/<source>/`` (the
runs and their logs), ``results.json`` (every run with its curves; a run whose arguments did not change is
reused on the next call unless ``--fresh``), ``convert_study.md`` (accuracies at step 0 and after
training, mean ± sd; each converted arm against continued softmax and against its from-scratch
counterpart with :func:`diffzoo.stats.compare` and Holm's correction) and ``curves.png``. Other arguments
go to every ``recipes.mqar`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffzoo.study.families import FAMILIES, metric_value
from diffzoo.study.plots import mean_curve
from diffzoo.study.runs import last_logged, latest_log_dir, read_run, recipe_command, run_jobs, train
from diffzoo.study.tables import comparison_rows, comparisons_note, fmt, stats_table

RECIPE = "recipes.mqar"
FAMILY = FAMILIES["mqar"]  # val/acc, test/acc, percent
METRICS = ("val/acc", "test/acc")
REPORTED = "test/acc"
REFERENCE = "softmax_continued"
FINETUNED = {"softmax_continued": "softmax", "diff_v2_converted": "diff_v2", "diff_converted": "diff"}  # arm -> attn
SCRATCH = {"diff_scratch": "diff", "diff_v2_scratch": "diff_v2"}
COUNTERPART = {"diff_v2_converted": "diff_v2_scratch", "diff_converted": "diff_scratch"}
COLOURS = {"softmax": "black", "diff_v2": "tab:orange", "diff": "tab:green"}  # per attention; scratch dashed
# no per-run curves.png / TensorBoard files: the study draws its own plot
QUIET = ("--curves.plot", "false", "--curves.tensorboard", "false", "--trainer.logger.init_args.version", "null")
QUICK_SOURCE_SEEDS = (100, 101)


@dataclass(frozen=True)
class Source:
    """A finished softmax MQAR run."""

    name: str  # its folder's name (unique in a study)
    log_dir: Path  # version_N
    config: dict
    seed: int  # seed_everything
    data_seed: int
    lr: float
    steps: int  # optimizer steps it was trained for
    metrics: dict  # summary.json metrics (its final validation)
    curve: list  # [[step, val/acc], ...], step = optimizer steps done

    @property
    def config_path(self) -> Path:
        return self.log_dir / "config.yaml"

    @property
    def weights(self) -> Path:
        return self.log_dir / "model.safetensors"


def _config_steps(config: dict) -> int:
    trainer, data = config["trainer"], config["data"]
    if trainer.get("max_steps") not in (None, -1):
        return int(trainer["max_steps"])
    return int(trainer["max_epochs"]) * int(data["steps_per_epoch"])


def read_source(folder: Path) -> Source:
    """The newest run of ``folder``; refuses a run that is not softmax or has no exported weights.

    Its steps are ``global_step`` of ``summary.json`` (``trainer.max_epochs * data.steps_per_epoch`` of
    ``config.yaml`` for a run that finished); without a summary, the config's."""
    import yaml

    log_dir = latest_log_dir(folder)
    for f in ("model.safetensors", "config.yaml"):
        if not (log_dir / f).is_file():
            raise FileNotFoundError(f"--source-runs {folder}: {log_dir / f} is missing; is the run finished?")
    config = yaml.safe_load((log_dir / "config.yaml").read_text())
    if config.get("model", {}).get("attn") != "softmax":
        raise ValueError(f"--source-runs {folder}: model.attn is {config.get('model', {}).get('attn')!r}; "
                         "the sources must be softmax runs of python -m recipes.mqar")
    summary = json.loads((log_dir / "summary.json").read_text()) if (log_dir / "summary.json").is_file() else {}
    curve = read_run(folder, ("val/acc",), steps=True)["curves"]["val/acc"] if summary else []
    return Source(
        name=folder.name, log_dir=log_dir, config=config, seed=int(config.get("seed_everything") or 0),
        data_seed=int(config["data"]["seed"]), lr=float(config["model"]["lr"]),
        steps=int(summary.get("global_step") or _config_steps(config)), metrics=summary.get("metrics", {}),
        curve=[[s + 1, v] for s, v in curve],
    )


def find_sources(patterns: Sequence[str]) -> list[Path]:
    """Folders named by ``patterns`` (paths or globs), in order, each once; names must be unique."""
    folders: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise FileNotFoundError(f"--source-runs {pattern}: no folder matches")
        folders += [Path(m) for m in matches if Path(m).is_dir() and Path(m) not in folders]
    names = [f.name for f in folders]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"--source-runs: several sources are called {sorted(dup)}; the study names runs by folder")
    if not folders:
        raise FileNotFoundError(f"--source-runs {' '.join(patterns)}: no folder")
    return folders


def lm_kwargs(config: dict) -> dict[str, Any]:
    """The :class:`~diffzoo.models.lm.LMConfig` arguments of the LM an MQAR run's ``config.yaml`` trains."""
    model, data = config["model"], config["data"]
    return {"vocab_size": int(data["key_vocab"]) + int(data["value_vocab"]), "dim": model["dim"],
            "depth": model["depth"], "num_heads": model["num_heads"],
            "intermediate_size": model.get("intermediate_size"), "max_seq_len": model.get("max_seq_len", 2048)}


def convert_source(src: Source, attn: str, folder: Path) -> dict:
    """``python -m recipes.convert --from diffzoo:lm`` of the source's weights to ``attn`` (``softmax``: a
    copy) in ``folder``; returns ``convert.json``'s content. A rerun writes the same conversion (seeded) over
    the folder's previous one."""
    from recipes.convert import main as convert

    return convert(["--from", "diffzoo:lm", "--model-kwargs", json.dumps(lm_kwargs(src.config)),
                    "--weights", str(src.weights), "--attn", attn, "--out", str(folder), "--seed", str(src.seed),
                    "--overwrite"])


# -- the jobs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Settings shared by every run of the study."""

    steps: int
    eval_every: int
    warmup: int
    scratch_steps: int | None  # None: each source's steps + ``steps``
    lr: float | None  # None: each source's lr
    data_seed_offset: int
    extra: tuple[str, ...]

    def lr_of(self, src: Source) -> float:
        return src.lr if self.lr is None else self.lr

    def scratch_of(self, src: Source) -> int:
        return src.steps + self.steps if self.scratch_steps is None else self.scratch_steps


def _epochs(steps: int, every: int, what: str) -> str:
    if steps < every or steps % every:
        raise ValueError(f"{what}={steps} must be a positive multiple of --eval-every {every} "
                         "(validation runs at the end of each block of --eval-every steps)")
    return str(steps // every)


def jobs_for(src: Source, plan: Plan, start: Path) -> list[dict]:
    """The scoring, fine-tuning and from-scratch jobs of one source (``start``: its converted folders)."""
    cfg, lr = str(src.config_path), f"{plan.lr_of(src):g}"
    jobs = []
    for arm, attn in FINETUNED.items():
        init = ["--config", cfg, "--model.attn", attn, "--model.init_from", str(start / arm)]
        jobs.append({"kind": "step0", "arm": arm, "attn": attn, "args": [*init, *plan.extra]})
        jobs.append({"kind": "finetune", "arm": arm, "attn": attn, "steps": plan.steps, "args": [
            *init, "--model.lr", lr, "--model.warmup_steps", str(plan.warmup), "--seed_everything", str(src.seed),
            "--data.seed", str(src.data_seed + plan.data_seed_offset), "--data.steps_per_epoch", str(plan.eval_every),
            "--trainer.max_epochs", _epochs(plan.steps, plan.eval_every, "--steps"), "--trainer.max_steps", "-1",
            *plan.extra]})
    scratch = plan.scratch_of(src)
    for arm, attn in SCRATCH.items():
        jobs.append({"kind": "scratch", "arm": arm, "attn": attn, "steps": scratch, "args": [
            "--config", cfg, "--model.attn", attn, "--model.lr", lr, "--seed_everything", str(src.seed),
            "--data.seed", str(src.data_seed), "--data.steps_per_epoch", str(plan.eval_every),
            "--trainer.max_epochs", _epochs(scratch, plan.eval_every, "--scratch-steps"), "--trainer.max_steps", "-1",
            *plan.extra]})
    for job in jobs:
        job.update(source=src.name, seed=src.seed, key=f"{src.name}/{job['arm']}/{job['kind']}")
    return jobs


def _done(record: dict, metrics: dict) -> dict:
    print(f"done: {record['key']}: val/acc {metrics.get('val/acc', float('nan')):.4g}"
          + (f" FAILED: {record['failed']}" if record.get("failed") else ""), flush=True)
    return record


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """stdout, stderr and Lightning's log lines into ``log`` (an in-process run, as quiet as a subprocess)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        for lg in loggers:
            lg.setLevel(logging.WARNING)  # their handlers hold the terminal's stream
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def score_start(job: dict, out: Path) -> dict:
    """Step 0 of a starting point: ``recipes.mqar validate`` with ``--model.init_from``, in this process."""
    from recipes.mqar import cli_main

    folder, name = out / "runs" / job["source"], f"{job['arm']}_step0"
    logger = ["--trainer.logger.init_args.save_dir", str(folder), "--trainer.logger.init_args.name", name,
              "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    start = time.time()
    with _output_to(folder / f"{name}.log"):
        cli_main(["validate", *job["args"], *QUIET, *logger])
    metrics = last_logged(latest_log_dir(folder / name) / "metrics.csv")
    return _done({**job, "seconds": time.time() - start, "metrics": metrics}, metrics)


def run_job(job: dict, out: Path) -> dict:
    """Run one training in a fresh process; the record of :func:`run_jobs` (never raises for a failed run)."""
    folder = out / "runs" / job["source"]
    record = {**job}
    try:
        record["seconds"] = train(recipe_command(RECIPE, folder, job["arm"], [*job["args"], *QUIET]),
                                  folder / f"{job['arm']}.log")
        record.update(read_run(folder / job["arm"], (*METRICS, "train/loss_step"), steps=True))
    except (RuntimeError, FileNotFoundError) as e:  # a diverged run stops with an error; reported, not fatal
        record.update(failed=str(e), summary={}, curves={})
    return _done(record, record["summary"].get("metrics", {}))


# -- tables and plot -----------------------------------------------------------------------------
def arm_runs(records: Sequence[dict], kind: str) -> list[dict]:
    """``comparison_rows`` input: one run per (arm, source) of ``kind`` with its metrics in ``summary``."""
    runs = []
    for r in records:
        if r["kind"] != kind:
            continue
        metrics = r.get("metrics", {}) if kind == "step0" else r.get("summary", {}).get("metrics", {})
        runs.append({"variant": r["arm"], "source": r["source"], "seed": r["seed"], "summary": {"metrics": metrics},
                     "curves": r.get("curves", {}), "steps": r.get("steps"), "failed": r.get("failed")})
    return runs


def _cell(values: list[float]) -> str:
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return "–"
    sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
    return f"{fmt(statistics.mean(vals))} ± {fmt(sd)}"


def start_end_table(sources: Sequence[Source], records: Sequence[dict]) -> str:
    """Markdown: per arm, val/acc and test/acc (%) at step 0 and at the end of training, mean ± sd."""
    scale = FAMILY.scale
    start, end = arm_runs(records, "step0"), arm_runs(records, "finetune") + arm_runs(records, "scratch")
    lines = ["| arm | n | steps | val/acc step 0 | test/acc step 0 | val/acc end | test/acc end |",
             "|---|---|---|---|---|---|---|"]
    steps = sorted({s.steps for s in sources})
    src = [scale * float(s.metrics.get(m, float("nan"))) for s in sources for m in METRICS]
    lines.append(f"| source (softmax) | {len(sources)} | {'/'.join(map(str, steps))} | – | – | "
                 f"{_cell(src[0::2])} | {_cell(src[1::2])} |")
    for arm in (*FINETUNED, *SCRATCH):
        s0 = [r for r in start if r["variant"] == arm]
        e = [r for r in end if r["variant"] == arm]
        n = sum(1 for r in e if math.isfinite(metric_value(r, REPORTED)))
        cells = [_cell([scale * metric_value(r, m) for r in s0]) if s0 else "–" for m in METRICS]
        cells += [_cell([scale * metric_value(r, m) for r in e]) for m in METRICS]
        arm_steps = "/".join(str(x) for x in sorted({r["steps"] for r in e if r["steps"] is not None}))
        lines.append(f"| {arm} | {n} | {arm_steps or '–'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_source_table(sources: Sequence[Source], records: Sequence[dict]) -> str:
    """Markdown: the reported metric (%) of every arm per source (the arms of one row are paired)."""
    arms = (*FINETUNED, *SCRATCH)
    lines = ["| source | seed | source end | " + " | ".join(arms) + " |", "|" + "---|" * (len(arms) + 3)]
    for s in sources:
        cells = []
        for arm in arms:
            r = next((r for r in records if r["source"] == s.name and r["arm"] == arm and r["kind"] != "step0"), None)
            cells.append(fmt(FAMILY.scale * metric_value(r, REPORTED)) if r else "–")
        lines.append(f"| {s.name} | {s.seed} | {fmt(FAMILY.scale * float(s.metrics.get(REPORTED, float('nan'))))} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(sources: Sequence[Source], records: Sequence[dict], plan: Plan, checks: dict[str, list[float]]) -> str:
    """The markdown of ``convert_study.md``."""
    finetuned = arm_runs(records, "finetune")
    scratch = arm_runs(records, "scratch")
    vs_softmax = comparison_rows(FAMILY, finetuned, REFERENCE, REPORTED)
    pairs = [{**r, "variant": "converted", "attn": FINETUNED[r["variant"]]} for r in finetuned if r["variant"] in COUNTERPART]
    pairs += [{**r, "variant": "scratch", "attn": SCRATCH[r["variant"]]} for r in scratch]
    vs_scratch = comparison_rows(FAMILY, pairs, "scratch", REPORTED, group=lambda r: r["attn"])
    lrs = sorted({plan.lr_of(s) for s in sources})
    scratch_steps = sorted({plan.scratch_of(s) for s in sources})
    failed = [r["key"] for r in records if r.get("failed")]
    gaps = "; ".join(f"{arm} {max(v):.3g}" for arm, v in checks.items() if v)
    text = [
        "# Fine-tuning converted softmax models on MQAR",
        "",
        f"{len(sources)} source runs (softmax, {'/'.join(str(s) for s in sorted({s.steps for s in sources}))} steps, "
        f"seeds {', '.join(str(s.seed) for s in sources)}): {', '.join(s.name for s in sources)}. Fine-tuned arms: "
        f"{plan.steps} steps at lr {', '.join(f'{x:g}' for x in lrs)} (warm-up {plan.warmup}), data seed = source "
        f"data seed + {plan.data_seed_offset}; from-scratch arms: {'/'.join(map(str, scratch_steps))} steps at the "
        f"same lr with the source's seeds, data seed and warm-up. Validation every {plan.eval_every} steps. Accuracy on the query "
        f"positions in %, mean ± sd over sources; step 0 is the starting point before any training.",
        "",
        start_end_table(sources, records),
        "",
        f"Conversion check (largest |logit difference| from the source on a random token batch): {gaps}.",
        "",
        f"## Converted arms vs continued softmax ({REPORTED} after {plan.steps} steps)",
        "",
        stats_table(vs_softmax, REFERENCE, 2),
        "",
        comparisons_note(vs_softmax),
        "",
        f"## Converted arms vs the same attention trained from scratch ({REPORTED}; scratch: the whole budget)",
        "",
        stats_table(vs_scratch, "scratch", 2, "attention"),
        "",
        comparisons_note(vs_scratch),
        "",
        f"## Per source ({REPORTED} %, end of training)",
        "",
        per_source_table(sources, records),
        "",
        "The arms of one source start from the same model and (fine-tuned arms) see the same data, so the "
        "samples are paired; Welch's test and the permutation test above treat them as independent, which is "
        "conservative.",
        "",
        f"Failed or diverged runs: {', '.join(failed) if failed else 'none'}.",
    ]
    return "\n".join(text)


def _curve_points(record: dict, start: dict | None, offset: int = 0) -> list[list[float]]:
    """val/acc against optimizer steps done (logged steps + 1), the step-0 score first, shifted by ``offset``."""
    points = [[offset, start["val/acc"]]] if start and "val/acc" in start else []
    return points + [[offset + s + 1, v] for s, v in record.get("curves", {}).get("val/acc", [])]


def plot_curves(sources: Sequence[Source], records: Sequence[dict], path: Path) -> None:
    """Left: val/acc against the fine-tuning step (step 0: the starting point). Right: against all steps
    trained, the source's curve and its continuations beside the from-scratch runs. Means over sources."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts = {(r["source"], r["arm"]): r.get("metrics") for r in records if r["kind"] == "step0"}
    steps = {s.name: s.steps for s in sources}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), dpi=90)
    src_steps, src_ys = mean_curve([{"curves": {"val/acc": s.curve}} for s in sources], "val/acc", FAMILY.scale)
    if src_steps:
        axes[1].plot(src_steps, src_ys, color="grey", marker=".", label=f"source softmax (n={len(sources)})")
    for arm in (*FINETUNED, *SCRATCH):
        rs = [r for r in records if r["arm"] == arm and r["kind"] != "step0" and not r.get("failed")]
        if not rs:
            continue
        style = {"color": COLOURS[rs[0]["attn"]], "label": f"{arm} (n={len(rs)})"}
        if arm in FINETUNED:
            own = [{"curves": {"val/acc": _curve_points(r, starts.get((r["source"], arm)))}} for r in rs]
            xs, ys = mean_curve(own, "val/acc", FAMILY.scale)
            axes[0].plot(xs, ys, marker="." if len(xs) < 30 else None, **style)
            total = [{"curves": {"val/acc": _curve_points(r, starts.get((r["source"], arm)), steps[r["source"]])}}
                     for r in rs]
            xs, ys = mean_curve(total, "val/acc", FAMILY.scale)
            axes[1].plot(xs, ys, **style)
        else:
            xs, ys = mean_curve([{"curves": {"val/acc": _curve_points(r, None)}} for r in rs], "val/acc",
                                 FAMILY.scale)
            axes[1].plot(xs, ys, ls="--", **style)
    axes[0].set(xlabel="fine-tuning step", ylabel="val/acc %", title="from the source model (step 0: converted)")
    axes[1].set(xlabel="optimizer steps in all", ylabel="val/acc %", title="whole budget: source + fine-tuning vs scratch")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# -- command line --------------------------------------------------------------------------------
def make_quick_sources(out: Path, jobs: int, fresh: bool = False) -> list[Path]:
    """Two tiny softmax source runs (``python -m recipes.mqar --quick``, seeds 100 and 101) in ``out/sources``;
    finished ones are kept unless ``fresh``."""
    folder = out / "sources"

    def one(seed: int) -> Path:
        name = f"softmax_seed{seed}"
        if fresh or not list((folder / name).glob("version_*/summary.json")):
            args = ["--quick", "--model.attn", "softmax", "--model.lr", "3e-3", "--seed_everything", str(seed),
                    "--data.seed", str(seed), *QUIET]
            train(recipe_command(RECIPE, folder, name, args), folder / f"{name}.log")
        return folder / name

    return run_jobs(list(QUICK_SOURCE_SEEDS), one, jobs)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m recipes.convert_study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-runs", nargs="+", default=None, metavar="DIR",
                   help="finished softmax runs of recipes.mqar (folders or globs), one per seed")
    p.add_argument("--steps", type=int, default=None, help="fine-tuning steps (default 300; --quick 4)")
    p.add_argument("--eval-every", type=int, default=None, help="validation interval in steps (default 50; --quick 2)")
    p.add_argument("--warmup", type=int, default=None, help="fine-tuning warm-up steps (default 20; --quick 2)")
    p.add_argument("--scratch-steps", type=int, default=None,
                   help="steps of the from-scratch runs (default: the source's steps + --steps)")
    p.add_argument("--lr", type=float, default=None, help="learning rate of every run (default: the source's)")
    p.add_argument("--data-seed-offset", type=int, default=1000,
                   help="fine-tuning data seed = source data seed + this (new sequences)")
    p.add_argument("--jobs", type=int, default=1, help="runs at the same time (one process each)")
    p.add_argument("--out", type=Path, default=Path("outputs/convert_study"))
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: tiny steps; without --source-runs, two recipes.mqar --quick sources are made")
    p.add_argument("--fresh", action="store_true", help="run again what results.json already holds")
    args, extra = p.parse_known_args(argv)
    if args.source_runs is None and not args.quick:
        p.error("--source-runs is required (or --quick, which makes tiny sources)")
    defaults = (4, 2, 2) if args.quick else (300, 50, 20)
    plan = Plan(steps=args.steps or defaults[0], eval_every=args.eval_every or defaults[1],
                warmup=args.warmup if args.warmup is not None else defaults[2], scratch_steps=args.scratch_steps,
                lr=args.lr, data_seed_offset=args.data_seed_offset, extra=tuple(extra))

    from recipes._cli import one_line_errors

    start_time = time.time()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    with one_line_errors(p.prog):
        folders = (find_sources(args.source_runs) if args.source_runs is not None
                   else make_quick_sources(out, args.jobs, args.fresh))
        sources = [read_source(f) for f in folders]
        checks: dict[str, list[float]] = {arm: [] for arm in FINETUNED}
        jobs = []
        for src in sources:
            for arm, attn in FINETUNED.items():
                meta = convert_source(src, attn, out / "start" / src.name / arm)
                checks[arm].append(float(meta["check"]["max_abs_diff"]))
            jobs += jobs_for(src, plan, out / "start" / src.name)

    results_path = out / "results.json"
    previous = json.loads(results_path.read_text()) if results_path.is_file() else {}
    cache = {} if args.fresh else {k: r for k, r in previous.get("runs", {}).items() if not r.get("failed")}
    results = {
        "recipe": RECIPE, "quick": args.quick,
        "plan": {**vars(plan), "extra": list(plan.extra)},
        "sources": [{"name": s.name, "log_dir": str(s.log_dir), "seed": s.seed, "data_seed": s.data_seed, "lr": s.lr,
                     "steps": s.steps, "metrics": s.metrics, "curve": s.curve} for s in sources],
        "conversion_check": checks, "runs": {},
    }
    todo = [j for j in jobs if cache.get(j["key"], {}).get("args") != j["args"]]
    if len(todo) < len(jobs):
        print(f"{len(jobs) - len(todo)} run(s) with unchanged arguments reused from {results_path}", flush=True)

    def save(done: list[dict]) -> None:
        fresh = {r["key"]: r for r in done}
        results["runs"] = {j["key"]: fresh.get(j["key"], cache.get(j["key"])) for j in jobs
                           if j["key"] in fresh or cache.get(j["key"], {}).get("args") == j["args"]}
        results_path.write_text(json.dumps(results, indent=1))

    scored = [score_start(j, out) for j in todo if j["kind"] == "step0"]  # before any fine-tuning
    save(scored)
    save(scored + run_jobs([j for j in todo if j["kind"] != "step0"], lambda j: run_job(j, out), args.jobs,
                           lambda done: save(scored + done)))
    records = [results["runs"][j["key"]] for j in jobs]
    text = report(sources, records, plan, checks)
    (out / "convert_study.md").write_text(text + "\n")
    plot_curves(sources, records, out / "curves.png")
    results["seconds"] = time.time() - start_time
    results_path.write_text(json.dumps(results, indent=1))
    print(text)
    print(f"\ncurves: {out / 'curves.png'}\n({results['seconds']:.0f} s wall; everything in {results_path})")
    return results


if __name__ == "__main__":
    main()
