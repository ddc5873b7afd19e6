"""Learning rate tuned per attention variant, then final seeds, with real statistics.

    OMP_NUM_THREADS=1 python -m recipes.sweep --family mqar --variants softmax diff \\
        --lrs 5e-4 1e-3 2e-3 4e-3 8e-3 --seeds 3 --final-seeds 8 --jobs 2
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

Every run is ``python -m <recipe>`` in a fresh process (:mod:`diffzoo.study.runs`), logging the validation
metric and ``train/grad_norm`` (:class:`diffzoo.tasks.monitor.GradNormMonitor`); a run that meets a
non-finite loss stops and is reported as diverged. A run that scores the test set clip by clip (speech:
``test_clips.csv``) keeps, when it is a final run, each clip's ``[voice, snr_db, label, pred]`` in its record
(``test_clips``), for :func:`diffzoo.study.tables.speech_voice_stats`. Written to ``--out`` (default
``outputs/sweep/<family>/``): ``results.json`` (every run, reused on the next call unless ``--fresh``;
a folder whose runs were trained with other extra arguments or ``--quick`` is refused rather than mixed),
``sweep.md`` / ``knob.md`` / ``chance.md`` and ``curves.png`` / ``knob.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .families import FAMILIES, GRAD_NORM, Family, lr_tag, metric_value, run_name
from .plots import plot_curves, plot_knob
from .provenance import same_training_code
from .recipe import lr_grid, recipe_args
from .runs import (
    FINAL_SEED,
    FINISH_BY_HELP,
    Paused,
    RecordsBusy,
    check_time_left,
    code_stamp,
    finish_by,
    forget_stopped,
    last_logged,
    latest_log_dir,
    note_stopped,
    parse_finish_by,
    progress_line,
    read_divergence,
    read_run,
    read_test_clips,
    recipe_command,
    records_lock,
    resume_point,
    run_jobs,
    stopping,
    train,
)
from .tables import (
    ablation_rows,
    ablation_table,
    best_lrs,
    chance_rows,
    chance_table,
    comparison_rows,
    comparisons_note,
    divergence_text,
    grid_text,
    plateau_text,
    run_plateau,
    stats_table,
)

REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout the code stamps describe (code_stamp's root)


def with_epochs(family: Family, epochs: int) -> Family:
    """``family`` with its study budget set to ``epochs`` (``--epochs``; a cell with a budget of its own)."""
    assert family.budget is not None, f"{family.recipe} has no study budget to change"
    return dataclasses.replace(family, budget=dataclasses.replace(family.budget, epochs=epochs))


def fixed_args(family: Family) -> list[str]:
    """The recipe arguments every run of ``family`` gets: its own, then the study recipe's for its budget. A
    records file remembers them, and runs made with others are never mixed into it."""
    return [*family.base_args, *(recipe_args(family.budget) if family.budget else ())]


def train_run(family: Family, out: Path, variant: str, lr: float, seed: int, quick: bool, extra: Sequence[str],
              knob: tuple[str, str] | None = None, until: float | None = None) -> dict:
    """Train one (variant, lr, seed[, knob value]) in a fresh process; its summary, curves and health. With
    ``until`` (a family that resumes exactly, under ``--finish-by``) the training pauses then (:class:`Paused`)
    and the next call goes on from its checkpoint."""
    name = run_name(variant, lr, seed, knob)
    args = [*fixed_args(family), *family.variants[variant],
            "--model.lr", lr_tag(lr), *family.seed_args(seed), *family.monitor_args,
            *(family.no_test_args if seed < FINAL_SEED else ()), *(family.quick if quick else ()),
            *(("--" + knob[0], knob[1]) if knob else ()), *extra]
    runs = out / "runs"
    record: dict[str, Any] = {"name": name, "variant": variant, "lr": lr, "seed": seed,
                              "knob": list(knob) if knob else None, "code": code_stamp()}
    command, log = recipe_command(family.recipe, runs, name, args), runs / f"{name}.log"
    ckpt, earlier = (resume_point(runs / name, log, command,
                                  lambda then: same_training_code(then, record["code"], REPOSITORY, family.recipe))
                     if family.resumes_exactly else (None, []))
    if ckpt is None:
        forget_stopped(log)
        print(f"starting {name}", flush=True)  # a log read later shows when each core took up a run
    else:
        print(f"resuming {name} from {ckpt} (attempt {len(earlier) + 1})", flush=True)
    start = time.time()
    try:
        seconds = train([*command, "--ckpt_path", str(ckpt)] if ckpt else command, log, append=ckpt is not None,
                        until=until)
        record["seconds"] = seconds + sum(earlier)  # every attempt's wall time
        if earlier:
            record["attempts"] = len(earlier) + 1
        record.update(read_run(runs / name, (family.val_metric, GRAD_NORM), steps=True))
        record["curves"] = {k: drawn_only(v) if k == GRAD_NORM else v for k, v in record["curves"].items()}
        record["diverged"] = read_divergence(runs / name)
        clips = read_test_clips(runs / name) if seed >= FINAL_SEED else None
        if clips is not None:  # recipes that score each test clip (speech): [voice, snr_db, label, pred] per clip
            record["test_clips"] = clips
    except (RuntimeError, FileNotFoundError, Paused) as e:
        # cut short by a stop of the study or paused at --finish-by: not a result, not recorded; goes on next call
        if isinstance(e, Paused) or stopping():
            if family.resumes_exactly:
                note_stopped(runs / name, log, command, record["code"], start, earlier)
            raise
        # a run that diverged stops with an error on purpose (and writes its divergence record): not a failure
        diverged = read_divergence(runs / name)
        record.update(failed=None if diverged else str(e), diverged=diverged, summary={}, curves={})
    forget_stopped(log)
    record["plateau"] = run_plateau(family, record)
    v = metric_value(record, family.val_metric)
    if not record.get("failed") and not math.isfinite(v) and record["diverged"] is None:
        record["diverged"] = {"what": family.val_metric, "value": str(v)}
    print(f"done: {name}: {family.val_metric} {v:.4g}"
          + (" (diverged)" if record["diverged"] else "") + (f" FAILED: {record['failed']}" if record.get("failed") else ""),
          flush=True)
    return record


RUN_TIME_SPARE = 1.1  # a run's expected length: the longest like it + 10 % (its wall time varies about that much)


def expected_seconds(cache: dict[str, dict], variant: str, lr: float,
                     fallback: Mapping[str, float] | None = None) -> float | None:
    """How long a run of ``variant`` at ``lr`` should take, for ``--finish-by``: the longest finished run in
    ``cache`` of that variant at that lr, else of that variant, with 10 % to spare (the same run's wall time
    varies by about that much with the machine's load); else ``fallback``'s guess for that variant (seconds by
    variant, ``"*"`` for any); else the longest run of any variant in ``cache`` + 10 %, else the fallback's
    longest guess. Variants differ in cost by 2-3x, so another variant's run is the last resort."""
    done = [r for r in cache.values() if not r.get("failed") and r.get("seconds")]
    fallback = fallback or {}
    for like in ([r for r in done if r["variant"] == variant and r["lr"] == lr],
                 [r for r in done if r["variant"] == variant]):
        if like:
            return RUN_TIME_SPARE * max(r["seconds"] for r in like)
    if variant in fallback:
        return fallback[variant]
    if done:
        return RUN_TIME_SPARE * max(r["seconds"] for r in done)
    return fallback.get("*", max(fallback.values(), default=None))


def run_minutes(value: str) -> tuple[str, float]:
    """One ``--run-minutes`` value: ``M`` (a run of any variant) or ``VARIANT=M``."""
    variant, _, minutes = value.rpartition("=")
    try:
        return variant or "*", float(minutes)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give minutes (M) or VARIANT=M") from None


def run_all(jobs: list[tuple], family: Family, out: Path, quick: bool, extra: Sequence[str], parallel: int,
            cache: dict[str, dict], save: Callable[[], None],
            fallback_seconds: Mapping[str, float] | None = None) -> list[dict]:
    """Train every job not in ``cache`` (keyed by run name), or recorded there as failed (a crash is trained
    again on the next call; a divergence is a result and stays); the records of all jobs, in order. With a
    ``--finish-by`` time, a job that would not end by then is not started (:func:`expected_seconds`, with
    ``fallback_seconds``, seconds by variant, where ``cache`` has no finished run of one) and the call finishes
    the jobs running; in a family that resumes exactly, a job starts while a few minutes are left and pauses at
    that time instead."""
    todo = [j for j in jobs if run_name(*j) not in cache or cache[run_name(*j)].get("failed")]
    start = time.time()
    paused: list[str] = []  # every run paused at --finish-by, not only the one whose error the pool passes on

    def one(job: tuple) -> dict:
        until = check_time_left(expected_seconds(cache, job[0], job[1], fallback_seconds), run_name(*job),
                                pausable=family.resumes_exactly)
        try:
            return train_run(family, out, job[0], job[1], job[2], quick, extra, job[3] if len(job) > 3 else None,
                             until=until)
        except Paused as e:
            paused.append(str(e))
            raise

    def store(done: list[dict]) -> None:
        for r in done:
            cache[r["name"]] = r
        save()
        print(progress_line(len(done), len(todo), time.time() - start), flush=True)

    try:
        run_jobs(todo, one, parallel, store)
    except Paused:  # the pool has waited for every job, so ``paused`` names all of them
        raise Paused("; ".join(paused)) from None
    return [cache[run_name(*j)] for j in jobs]


def extend_grid(best: dict[str, dict], lrs_of: dict[str, list[float]], base: Sequence[float],
                limit: int) -> dict[str, float]:
    """For every variant whose best lr is at an edge of its grid, add the next lr beyond that edge to
    ``lrs_of`` (a factor of the grid's smallest step), unless the variant already has ``limit`` lrs beyond
    the ``base`` grid; the lrs added, by variant."""
    grown = {}
    for v, b in best.items():
        lrs = lrs_of[v]
        if b["lr"] is None or len(lrs) < 2 or sum(1 for lr in lrs if lr not in base) >= limit:
            continue
        step = min(hi / lo for lo, hi in zip(lrs, lrs[1:]))
        if b["lr"] == lrs[0]:
            grown[v] = float(f"{lrs[0] / step:.3g}")
        elif b["lr"] == lrs[-1] and not b["by_lr"][lrs[-1]]["diverged"]:
            grown[v] = float(f"{lrs[-1] * step:.3g}")
        if v in grown:
            lrs_of[v] = sorted({*lrs, grown[v]})
    return grown


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
    return {"variant": variant, "seed": seed, "seconds": seconds, "metrics": last_logged(
        latest_log_dir(folder / name) / "metrics.csv")}


def write_records(path: Path, results: dict) -> None:
    """Write ``results`` to ``path`` through a temporary file: a run killed while saving leaves the previous
    records whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dump_records(results))
    tmp.replace(path)


DRAWN_POINTS = 1000  # the most points of a plotted-only curve a run's record keeps


def drawn_only(curve: list, most: int = DRAWN_POINTS) -> list:
    """A curve that is only plotted, never selected on or tested (the gradient norm, logged every 10 steps):
    its values kept to 4 significant digits, and a curve longer than ``most`` points thinned to every k-th point
    (k the smallest stride that leaves at most ``most``; the first and last points always kept). The full
    floats made a 16,000-step LM cell's records 2.2 MB; four digits halved that, and at 32,000 steps (3,200
    points a run) the thinning keeps a cell's records under 2 MB. Curves of ``most`` points or fewer keep every
    point, so figures read from them (median gradient norms) do not change."""
    stride = max(1, -(-len(curve) // most))
    kept = curve[::stride]
    if (len(curve) - 1) % stride:  # the last point falls between two strides: it follows, or replaces, the last kept
        kept = [*kept[:most - 1], curve[-1]]
    return [[step, float(f"{value:.4g}")] for step, value in kept]


def dump_records(results: dict) -> str:
    """``results`` as JSON, indented by one space, except each run's ``test_clips``, one clip per line
    (``["voice", snr_db, label, pred]``), and each of its ``curves``, one curve per line, instead of one value
    per line: a records file with per-clip results and curves stays a few kB per run. ``json.loads`` reads it
    back unchanged."""
    blobs: dict[str, tuple[list, bool]] = {}  # placeholder -> (the list, one row per line or all on one)

    def hold(value: list, rows: bool) -> str:
        key = f"\x00blob {len(blobs)}"  # a string no record holds
        blobs[json.dumps(key)] = (value, rows)
        return key

    runs = results.get("runs")
    if isinstance(runs, dict):
        slim = {}
        for name, r in runs.items():
            if isinstance(r, dict) and isinstance(r.get("test_clips"), list):
                r = {**r, "test_clips": hold(r["test_clips"], True)}
            if isinstance(r, dict) and isinstance(r.get("curves"), dict):
                r = {**r, "curves": {k: hold(v, False) if isinstance(v, list) else v for k, v in r["curves"].items()}}
            slim[name] = r
        results = {**results, "runs": slim}
    text = json.dumps(results, indent=1)
    for key, (value, rows) in blobs.items():
        if not rows or not value:
            written = json.dumps(value, separators=(",", ":"))
        else:
            written = "[\n" + ",\n".join("    " + json.dumps(row, separators=(",", ":")) for row in value) + "\n   ]"
        text = text.replace(key, written, 1)
    return text


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m recipes.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, choices=list(FAMILIES))
    p.add_argument("--variants", nargs="+", default=None, help="variants (default: softmax diff)")
    p.add_argument("--reference", default="softmax", help="the variant every other one is compared with")
    p.add_argument("--lrs", type=float, nargs="+", default=lr_grid(2e-3),
                   help="the grid's learning rates (default: %(default)s, factor-2 steps)")
    p.add_argument("--paired", action="store_true",
                   help="--lrs gives one lr per variant, in the order of --variants: each variant's grid is its own "
                        "lr, never extended (the study's budget checks: every variant at its best lr, all in one sweep)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per (variant, lr) of the grid")
    p.add_argument("--extend", type=int, default=2, metavar="N",
                   help="rounds of grid extension: a variant whose best lr is the smallest or largest of its grid "
                        "gets the next lr beyond it (factor of the grid's step), up to N times")
    p.add_argument("--final-seeds", type=int, default=8, help="seeds of the final runs at the best lr")
    p.add_argument("--jobs", type=int, default=1, help="trainings at once (one process each)")
    p.add_argument("--knob", default=None, help="a data argument to sweep (mqar: data.num_pairs, data.filler, "
                                                "data.seq_len; cluttered: data.k, data.canvas; speech: "
                                                "data.init_args.snr_fixed_db)")
    p.add_argument("--values", nargs="+", default=None, help="values of --knob")
    p.add_argument("--epochs", type=int, default=None,
                   help="train for this many epochs instead of the family's study budget (the warm-up stays 5 %% "
                        "of the steps; a budget check)")
    p.add_argument("--chance", type=int, default=0, metavar="N", help="score N random initialisations per variant")
    p.add_argument("--quick", action="store_true", help="smoke mode: each training is the recipe's few-step run")
    p.add_argument("--fresh", action="store_true", help="retrain runs already in results.json")
    p.add_argument("--lrs-from", type=Path, default=None, metavar="RESULTS",
                   help="with --knob: each variant's lr from the results.json of another sweep (default: this --out's)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default outputs/sweep/<family>)")
    p.add_argument("--finish-by", default=None, metavar="WHEN",
                   help=FINISH_BY_HELP)
    p.add_argument("--run-minutes", type=run_minutes, nargs="+", default=None, metavar="[VARIANT=]M",
                   help="with --finish-by: how long a run takes (of VARIANT, or of any) while the records hold none "
                        "of it yet (default: unknown, so a first run starts whatever the time)")
    p.add_argument("--results", type=Path, default=None, metavar="JSON",
                   help="the records file (default <out>/results.json); a file kept in version control lets "
                        "another machine or session resume the sweep: runs recorded there are not trained again")
    args, extra = p.parse_known_args(argv)

    if args.finish_by is not None:
        try:
            finish_by(parse_finish_by(args.finish_by))
        except ValueError as e:
            p.error(str(e))
    family = FAMILIES[args.family]
    if args.epochs is not None:
        if family.budget is None:
            p.error(f"--epochs: family {args.family} has no study budget to change")
        family = with_epochs(family, args.epochs)
    variants = args.variants or [v for v in family.default_variants if v in family.variants]
    unknown = [v for v in variants if v not in family.variants]
    if unknown:
        p.error(f"--variants {' '.join(unknown)}: family {args.family} accepts {', '.join(family.variants)}")
    reference = args.reference if args.reference in variants else variants[0]
    if args.paired and len(args.lrs) != len(variants):
        p.error(f"--paired: --lrs gives {len(args.lrs)} lrs for the {len(variants)} variants {' '.join(variants)}; "
                "give one lr per variant")
    if args.knob is not None:
        if args.knob not in family.knobs:
            p.error(f"--knob {args.knob}: family {args.family} has the knobs {', '.join(family.knobs) or 'none'}")
        if not args.values:
            p.error("--knob needs --values")
    out = args.out or Path("outputs/sweep") / args.family
    out.mkdir(parents=True, exist_ok=True)
    results_path = args.results or out / "results.json"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with records_lock(results_path):
            return _sweep(p, args, extra, family, variants, reference, out, results_path)
    except RecordsBusy as e:
        p.error(str(e))


def _sweep(p: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str], family: Family,
           variants: list[str], reference: str, out: Path, results_path: Path) -> dict:
    """The sweep of :func:`main` on its parsed arguments, with the records' lock held."""
    results = _load(results_path)
    cache: dict[str, dict] = {} if args.fresh else dict(results.get("runs", {}))
    fixed = fixed_args(family)
    made_with = {"extra": results.get("extra", []), "quick": results.get("quick", False),
                 "fixed": results.get("fixed", fixed)}
    wanted = {"extra": list(extra), "quick": args.quick, "fixed": fixed}
    if cache and not args.chance and made_with != wanted:
        # runs are cached by name (variant, lr, seed, knob): reusing them would mix two set-ups in one table
        fixed_words = ("" if made_with["fixed"] == wanted["fixed"] else
                       f" (the family's fixed arguments were {' '.join(made_with['fixed'])}, now "
                       f"{' '.join(wanted['fixed'])})")
        p.error(f"{results_path} holds {len(cache)} runs trained with {_setup_words(made_with)}, not "
                f"{_setup_words(wanted)}{fixed_words}; give another --out (--lrs-from {results_path} takes its "
                "tuned lrs) or --fresh to retrain them")
    if not args.chance:
        results.update(family=args.family, recipe=family.recipe, extra=list(extra), quick=args.quick, fixed=fixed)

    def save() -> None:
        results["runs"] = cache
        write_records(results_path, results)

    digits = 2 if family.scale != 1.0 else 3
    fallback = {v: 60 * m for v, m in args.run_minutes or ()}  # --finish-by's guesses for a variant's first run
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
        jobs = [(v, lrs[v], FINAL_SEED + s, (args.knob, str(x))) for x in args.values for v in variants
                for s in range(args.final_seeds)]
        reuse_final_runs(jobs, cache, config_value(family.config, args.knob))  # the cache's set-up was checked above
        runs = run_all(jobs, family, out, args.quick, extra, args.jobs, cache, save, fallback)
        metric = family.test_metric or family.val_metric
        rows = comparison_rows(family, runs, reference, metric, group=lambda r: r["knob"][1])
        results["knob_result"] = {"knob": args.knob, "values": args.values, "lrs": lrs, "rows": rows}
        text = (f"## {family.label} against {args.knob} ({metric}, {args.final_seeds} seeds per cell; "
                f"lr per variant: {', '.join(f'{v} {lr:g}' for v, lr in lrs.items())})\n\n"
                + stats_table(rows, reference, digits, args.knob) + "\n\n" + comparisons_note(rows))
        plot_knob(family, rows, args.knob, out / "knob.png", family.chance)
        (out / "knob.md").write_text(text + "\n")
        texts.append(text + f"\n\nplot: {out / 'knob.png'}")
    else:
        own = {v: [lr] for v, lr in zip(variants, args.lrs)} if args.paired else {v: args.lrs for v in variants}
        lrs_of = {v: sorted(set(own[v]) | set((results.get("grid_lrs") or {}).get(v, ()))) for v in variants}
        while True:  # ends: each variant gets at most --extend lrs beyond --lrs
            grid_jobs = [(v, lr, s) for v in variants for lr in lrs_of[v] for s in range(args.seeds)]
            grid = run_all(grid_jobs, family, out, args.quick, extra, args.jobs, cache, save, fallback)
            best = best_lrs(family, grid)
            grown = {} if args.quick or args.paired else extend_grid(best, lrs_of, args.lrs, args.extend)
            results["grid_lrs"] = {**(results.get("grid_lrs") or {}), **lrs_of}
            if not grown:
                break
            print("best lr at the grid's edge, grid extended: "
                  + ", ".join(f"{v} + {lr_tag(lr)}" for v, lr in grown.items()), flush=True)
        results["best"] = {**(results.get("best") or {}), **best}  # other variants' (an earlier call) stay
        save()
        final_jobs = [(v, best[v]["lr"], FINAL_SEED + s) for v in variants if best[v]["lr"] is not None
                      for s in range(args.final_seeds)]
        final = run_all(final_jobs, family, out, args.quick, extra, args.jobs, cache, save, fallback)
        metric = family.test_metric or family.val_metric
        text = grid_text(family, best, sorted({lr for v in variants for lr in lrs_of[v]}), digits) + "\n\n"
        if final:
            rows = comparison_rows(family, final, reference, metric)
            results["final"] = {"metric": metric, "rows": rows, "runs": [r["name"] for r in final]}
            text += (f"## Final runs at each variant's best lr ({metric}"
                     + ("" if family.test_metric else ", validation: this task has no test split")
                     + f", seeds 100-{99 + args.final_seeds})\n\n" + stats_table(rows, reference, digits) + "\n\n"
                     + comparisons_note(rows))
            text += "\n\n" + plateau_text(family, final)
            ablations = ablation_rows(family, final, metric)
            if ablations:
                results["final"]["ablations"] = ablations
                text += (f"\n\n## Ablations: each variant against the one it changes ({metric})\n\n"
                         + ablation_table(ablations, digits) + "\n\n" + comparisons_note(ablations))
        else:
            text += "No final runs (--final-seeds 0): the grid above is the whole result."
        text += "\n\n" + divergence_text(grid + final)
        plot_curves(family, final or grid, out / "curves.png")
        (out / "sweep.md").write_text(text + "\n")
        texts.append(text + f"\n\ncurves: {out / 'curves.png'}")
    took = time.time() - start
    earlier = 0.0 if args.fresh else (results.get("seconds") or 0.0)
    results["seconds"] = earlier + took  # every call on these records, summed
    save()
    print("\n\n".join(texts))
    print(f"\n({took:.0f} s wall, {results['seconds']:.0f} s over every call on these records; everything in "
          f"{results_path})")
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
