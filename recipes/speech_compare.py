"""Differential vs softmax keyword transformer at matched parameters on the synthesised keywords, several seeds.

    OMP_NUM_THREADS=1 python -m recipes.speech_compare --seeds 0 1 2 --jobs 2 \\
        --plot docs/results/speech_synth_curves.png

Each run is ``python -m recipes.speech_commands`` with the default config (``configs/speech_synth.yaml``),
one with ``diffkwt_nano`` and one with ``softkwt_nano`` per seed (the seed sets the initialisation, the
training order and the training augmentation; the voices, clips and evaluation noise are fixed by
``split_seed``). ``--jobs`` runs that many trainings at once. Runs go to ``outputs/speech_compare/<model>_seed<k>/``;
the markdown table (test and validation top-1 on voices unseen in training: mean, sample standard
deviation, min-max) is printed and saved with the curves in ``outputs/speech_compare/results.json``.
Extra arguments go to every run (e.g. ``--trainer.max_epochs 6``); the command line is the one of every
comparison (``recipes._study.compare_main``), with ``--collect`` to gather runs made in parts.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from recipes._study import compare_main, read_run, recipe_command, train

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


def run_one(model: str, seed: int, extra: list[str]) -> dict:
    """Train one model with one seed in a fresh process; returns its summary and per-epoch curves."""
    seconds = train(command(model, seed, extra), OUT / f"{model}_seed{seed}.log")
    r = {**collect(model, seed), "seconds": seconds}
    print(f"done: {model} seed {seed}: test top-1 {100 * r['summary']['metrics'].get('test/top1', float('nan')):.2f} %"
          f" ({seconds:.0f} s)", flush=True)
    return r


def prepare() -> None:
    """Synthesise the clip cache once, before parallel runs read it."""
    from diffzoo.data.speech import SynthKeywordsDataModule

    SynthKeywordsDataModule().prepare_data()


def count_params(model: str) -> int:
    import timm

    import diffzoo.models.speech  # noqa: F401  (registers the models)
    from diffzoo.layers import count_parameters

    return count_parameters(timm.create_model(model))


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


def main(argv: list[str] | None = None) -> list[dict]:
    return compare_main(argv, __doc__, OUT, MODELS, run_one, count_params, table, plot, prepare=prepare,
                        collect=collect)


if __name__ == "__main__":
    main()
