"""Differential vs softmax keyword transformer at matched parameters on the synthesised keywords, several seeds.

    OMP_NUM_THREADS=1 python -m recipes.speech_compare --seeds 0 1 2 --jobs 2 \\
        --plot docs/results/speech_synth_curves.png

Each run is ``python -m recipes.speech_commands`` with the default config (``configs/speech_synth.yaml``),
one with ``diffkwt_nano`` and one with ``softkwt_nano`` per seed (the seed sets the initialisation, the
training order and the training augmentation; the voices, clips and evaluation noise are fixed by
``split_seed``). ``--jobs`` runs that many trainings at once. Runs go to ``outputs/speech_compare/<model>_seed<k>/``;
the markdown table (test and validation top-1 on voices unseen in training: mean, sample standard
deviation, min-max) is printed and saved with the curves in ``outputs/speech_compare/results.json``.
Extra arguments go to every run (e.g. ``--trainer.max_epochs 6``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

from recipes._study import read_run, recipe_command, run_jobs, train

MODELS = ("diffkwt_nano", "softkwt_nano")
OUT = Path("outputs/speech_compare")
CURVES = ("val/top1", "val/loss", "train/loss_epoch")


def command(model: str, seed: int, extra: list[str]) -> list[str]:
    """The recipe command line of one run."""
    args = ["--model.model", model, "--seed_everything", str(seed), "--data.init_args.seed", str(seed), *extra]
    return recipe_command("recipes.speech_commands", OUT, f"{model}_seed{seed}", args)


def collect(model: str, seed: int) -> dict:
    """Summary and per-epoch curves of the latest run of ``model`` / ``seed``."""
    return {"model": model, "seed": seed, **read_run(OUT / f"{model}_seed{seed}", CURVES)}


def run_all(seeds: list[int], extra: list[str], jobs: int) -> list[dict]:
    """Train every (seed, model) pair, ``jobs`` at a time, each in a fresh process."""

    def one(job: tuple[str, int]) -> dict:
        m, s = job
        seconds = train(command(m, s, extra), OUT / f"{m}_seed{s}.log")
        r = {**collect(m, s), "seconds": seconds}
        print(f"done: {m} seed {s}: test top-1 {100 * r['summary']['metrics'].get('test/top1', float('nan')):.2f} %"
              f" ({seconds:.0f} s)", flush=True)
        return r

    OUT.mkdir(parents=True, exist_ok=True)
    return run_jobs([(m, s) for s in seeds for m in MODELS], one, jobs,
                    lambda done: (OUT / "results.json").write_text(json.dumps(done, indent=1)))


def table(runs: list[dict]) -> str:
    """Markdown table of final test and validation top-1 per model."""
    lines = ["| model | params | seeds | test top-1 % (mean ± std) | test min - max | val top-1 % (mean ± std) "
             "| per seed (test) |", "|---|---|---|---|---|---|---|"]
    for model in MODELS:
        mine = sorted((r for r in runs if r["model"] == model), key=lambda r: r["seed"])
        if not mine:
            continue
        test = [100 * r["summary"]["metrics"]["test/top1"] for r in mine]
        val = [100 * r["summary"]["metrics"]["val/top1"] for r in mine]

        def spread(xs: list[float]) -> str:
            return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.2f}"

        lines.append(
            f"| {model} | {mine[0].get('params', 0):,} | {len(mine)} | {spread(test)} | {min(test):.1f} - "
            f"{max(test):.1f} | {spread(val)} | {', '.join(f'{a:.1f}' for a in test)} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    """Validation top-1 and training loss per epoch, mean line and min-max band per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    panels = ((acc_ax, "val/top1", 100.0, "val top-1 (%)"), (loss_ax, "train/loss_epoch", 1.0, "training loss"))
    for model, color in zip(MODELS, ("tab:red", "tab:blue")):
        series = [r["curves"] for r in runs if r["model"] == model]
        for ax, key, scale, label in panels:
            n = min(len(c[key]) for c in series)
            values = scale * np.array([c[key][:n] for c in series])
            epochs = np.arange(1, n + 1)
            ax.plot(epochs, values.mean(0), color=color, label=f"{model} (n={len(series)})")
            ax.fill_between(epochs, values.min(0), values.max(0), color=color, alpha=0.2)
            ax.set(xlabel="epoch", ylabel=label)
    acc_ax.set_title("validation top-1 (unseen voices)")
    loss_ax.set_title("training loss")
    acc_ax.legend()
    fig.suptitle("synthesised keywords (12 classes), KWT-nano (D=64, 4 blocks), matched parameters", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=1, help="trainings run at the same time")
    p.add_argument("--plot", type=Path, default=None, help="write the training curves here (PNG)")
    p.add_argument("--from-results", action="store_true", help="only re-make the table/plot from results.json")
    p.add_argument("--collect", action="store_true",
                   help="train nothing: gather the finished runs of --seeds from their folders (runs made in parts)")
    args, extra = p.parse_known_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.from_results:
        runs = json.loads((OUT / "results.json").read_text())
    elif args.collect:
        import timm

        import diffzoo.models.speech  # noqa: F401
        from diffzoo.layers import count_parameters

        # wall times of earlier invocations (results.json, or copies of it named results_*.json)
        previous = {(r["model"], r["seed"]): r for f in sorted(OUT.glob("results*.json"))
                    for r in json.loads(f.read_text())}
        runs = []
        for seed in args.seeds:
            for model in MODELS:
                r = collect(model, seed)
                r["seconds"] = previous.get((model, seed), {}).get("seconds", float("nan"))
                r["params"] = count_parameters(timm.create_model(model))
                runs.append(r)
        (OUT / "results.json").write_text(json.dumps(runs, indent=1))
    else:
        import timm

        import diffzoo.models.speech  # noqa: F401  (registers the models)
        from diffzoo.data.speech import SynthKeywordsDataModule
        from diffzoo.layers import count_parameters

        SynthKeywordsDataModule().prepare_data()  # synthesise the cache once, before parallel runs read it
        params = {m: count_parameters(timm.create_model(m)) for m in MODELS}
        start = time.time()
        runs = run_all(args.seeds, extra, args.jobs)
        for r in runs:
            r["params"] = params[r["model"]]
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"study wall time {time.time() - start:.0f} s, CPU time of the runs {cpu.ru_utime + cpu.ru_stime:.0f} s")
        (OUT / "results.json").write_text(json.dumps(runs, indent=1))
    print(table(runs))
    print(f"wall time per run: {statistics.mean(r['seconds'] for r in runs):.0f} s")
    if args.plot:
        plot(runs, args.plot)
        print(f"curves: {args.plot}")


if __name__ == "__main__":
    main()
