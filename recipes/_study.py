"""What the multi-seed comparison recipes (``recipes.*_compare``) share: training runs in fresh processes,
several at a time, and reading a finished run's summary and curves back from its log folder."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def recipe_command(recipe: str, out: Path, name: str, args: Sequence[str]) -> list[str]:
    """``python -m <recipe> <args>`` logging CSV to ``out/name/version_N`` with no progress bar."""
    return [
        sys.executable, "-m", recipe, *args, "--trainer.logger.init_args.save_dir", str(out),
        "--trainer.logger.init_args.name", name, "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
    ]


def latest_log_dir(folder: Path) -> Path:
    """The newest ``version_N`` folder of a run."""
    versions = list(folder.glob("version_*"))
    if not versions:
        raise FileNotFoundError(f"no finished run in {folder} (no version_* folder)")
    return max(versions, key=lambda p: int(p.name.split("_")[1]))


def read_run(folder: Path, curves: Sequence[str], steps: bool = False) -> dict:
    """``{"summary", "curves"}`` of the newest run in ``folder``: ``summary.json`` and, per key of
    ``curves``, the values logged in ``metrics.csv`` (``[step, value]`` pairs with ``steps=True``)."""
    log_dir = latest_log_dir(folder)
    out: dict[str, list] = {key: [] for key in curves}
    with open(log_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            for key in out:
                if row.get(key):
                    out[key].append([int(row["step"]), float(row[key])] if steps else float(row[key]))
    return {"summary": json.loads((log_dir / "summary.json").read_text()), "curves": out}


def train(command: list[str], log: Path) -> float:
    """Run one training command with its output in ``log``; returns the wall time. Fails loudly."""
    start = time.time()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"training failed (exit {proc.returncode}); see {log}")
    return time.time() - start


def run_jobs(jobs: Sequence, run: Callable, parallel: int, on_result: Callable[[list], None] | None = None) -> list:
    """``run(job)`` for every job, ``parallel`` at a time (threads waiting on processes), results in job
    order; ``on_result(results so far)`` after each one finishes (e.g. to save them)."""
    done: dict[int, object] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        result = run(jobs[i])
        with lock:
            done[i] = result
            if on_result is not None:
                on_result([done[k] for k in sorted(done)])

    with ThreadPoolExecutor(max(1, parallel)) as pool:
        list(pool.map(one, range(len(jobs))))
    return [done[i] for i in range(len(jobs))]


def compare_main(
    argv: Sequence[str] | None, doc: str, out: Path, models: Sequence[str], run_one: Callable[..., dict],
    count_params: Callable[[str], int] | None, table: Callable[[list], str], plot: Callable[[list, Path], None],
    *,
    prepare: Callable[[], None] | None = None,
    collect: Callable[[str, int], dict] | None = None,
    evaluate: Callable[[dict, argparse.Namespace], dict] | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> list[dict]:
    """The command line of every comparison: ``--seeds``, ``--models`` (default ``models``), ``--jobs``,
    ``--plot``, ``--from-results``; other arguments go to every training. Trains every (seed, model) with
    ``run_one(model, seed, extra)``, prints ``table(runs)`` and draws ``plot(runs, path)``.
    ``out/results.json`` keeps the runs of other (model, seed) pairs from earlier calls, so a model can
    be added to a finished comparison.

    Optional parts of a comparison: ``prepare()`` runs once before the trainings (e.g. a data cache that
    parallel runs then share); ``collect(model, seed)`` reads a finished run from its folder and adds
    ``--collect`` (train nothing, gather runs made in parts); ``evaluate(run, args)`` scores each trained
    run once more (e.g. retrieval) and adds ``--evaluate-only`` (train nothing, re-score the runs in
    results.json); ``add_arguments(parser)`` adds the flags those need. ``count_params`` None: the table
    reads the parameter count from each run's summary."""
    import statistics

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--models", nargs="+", default=list(models), help="models trained (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="trainings run at the same time (one thread each)")
    p.add_argument("--plot", type=Path, default=None, help="write the training curves here (PNG)")
    p.add_argument("--from-results", action="store_true", help="only re-make the table/plot from results.json")
    if collect is not None:
        p.add_argument("--collect", action="store_true",
                       help="train nothing: gather the finished runs of --seeds / --models from their folders")
    if evaluate is not None:
        p.add_argument("--evaluate-only", action="store_true",
                       help="train nothing: evaluate the runs in results.json again")
    if add_arguments is not None:
        add_arguments(p)
    args, extra = p.parse_known_args(argv)
    results = out / "results.json"
    previous = json.loads(results.read_text()) if results.is_file() else []
    params = {m: count_params(m) for m in args.models} if count_params is not None and not args.from_results else {}

    def with_params(run: dict) -> dict:
        return {**run, "params": params[run["model"]]} if run["model"] in params else run

    if (args.from_results or getattr(args, "evaluate_only", False)) and not results.is_file():
        p.error(f"{results} does not exist; run without --from-results / --evaluate-only first")
    if args.from_results:
        runs = previous
    elif getattr(args, "evaluate_only", False):
        runs = previous
        for i, run in enumerate(runs):
            runs[i] = evaluate(run, args)
            results.write_text(json.dumps(runs, indent=1))
    else:
        out.mkdir(parents=True, exist_ok=True)
        jobs = [(m, s) for s in args.seeds for m in args.models]
        kept = [r for r in previous if (r.get("model", r.get("attn")), r["seed"]) not in jobs]  # older LM runs: "attn"
        if getattr(args, "collect", False):
            seconds = {(r["model"], r["seed"]): r.get("seconds", float("nan")) for r in previous}
            done = [with_params({**collect(m, s), "seconds": seconds.get((m, s), float("nan"))}) for m, s in jobs]
        else:
            if prepare is not None:
                prepare()

            def one(job: tuple[str, int]) -> dict:
                run = with_params(run_one(*job, extra))
                return evaluate(run, args) if evaluate is not None else run

            done = run_jobs(jobs, one, args.jobs, lambda d: results.write_text(json.dumps(kept + d, indent=1)))
        runs = kept + done
        results.write_text(json.dumps(runs, indent=1))
    print(table(runs))
    print(f"wall time per run: {statistics.mean(r.get('seconds', float('nan')) for r in runs):.0f} s")
    if args.plot:
        plot(runs, args.plot)
        print(f"curves: {args.plot}")
    return runs


def expand_quick(args: Sequence[str] | None, quick: Sequence[str]) -> list[str]:
    """``args`` (default ``sys.argv[1:]``) with ``--quick`` replaced by the recipe's smoke-run overrides;
    arguments given after them still win."""
    args = list(sys.argv[1:] if args is None else args)
    if "--quick" not in args:
        return args
    i = args.index("--quick")
    return [*args[:i], *quick, *args[i + 1:]]
