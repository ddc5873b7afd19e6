"""Differential vs softmax ViT at matched parameters on the embedded digits, several seeds.

    OMP_NUM_THREADS=1 python -m recipes.vit_compare --seeds 0 1 2 --jobs 2 [--plot docs/results/vit_digits_curves.png]

Each run is ``python -m recipes.vit_imagenet`` with the default config (``configs/vit_digits.yaml``), one
with ``diffvit_nano_patch7_28`` and one with ``softvit_nano_patch7_28`` per seed (the seed sets the
initialisation and the training order; the train/validation split is fixed). Runs go to
``outputs/vit_compare/<model>_seed<k>/``; the table of final validation top-1 (mean, sample standard
deviation, min-max) is printed as markdown and saved with the curves in ``outputs/vit_compare/results.json``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from recipes._study import compare_main, read_run, recipe_command, train

MODELS = ("diffvit_nano_patch7_28", "softvit_nano_patch7_28")
OUT = Path("outputs/vit_compare")


def run_one(model: str, seed: int, extra: list[str]) -> dict:
    """Train one model with one seed in a fresh process; returns its summary and per-epoch curves."""
    name = f"{model}_seed{seed}"
    args = ["--model.model", model, "--seed_everything", str(seed), "--data.init_args.seed", str(seed),
            "--checkpoint.save_top_k", "1", *extra]
    seconds = train(recipe_command("recipes.vit_imagenet", OUT, name, args), OUT / f"{name}.log")
    run = read_run(OUT / name, ("val/top1", "val/loss", "train/loss_epoch"))
    return {"model": model, "seed": seed, "seconds": seconds, **run}


def table(runs: list[dict]) -> str:
    """Markdown table of final validation top-1 per model."""
    lines = ["| model | params | seeds | val top-1 % (mean ± std) | min - max | per seed |", "|---|---|---|---|---|---|"]
    for model in MODELS:
        accs = [100 * r["summary"]["metrics"]["val/top1"] for r in runs if r["model"] == model]
        if not accs:
            continue
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        params = next(r["params"] for r in runs if r["model"] == model)
        lines.append(
            f"| {model} | {params:,} | {len(accs)} | {statistics.mean(accs):.2f} ± {std:.2f} | "
            f"{min(accs):.1f} - {max(accs):.1f} | {', '.join(f'{a:.1f}' for a in accs)} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    """Validation top-1 and training loss per epoch: mean line and min-max band per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    for model, color in zip(MODELS, ("tab:red", "tab:blue")):
        for ax, key, scale in ((axes[0], "val/top1", 100), (axes[1], "train/loss_epoch", 1)):
            ys = [r["curves"][key] for r in runs if r["model"] == model]
            if not ys:
                continue
            n = min(len(y) for y in ys)
            arr = scale * np.array([y[:n] for y in ys])
            x = np.arange(1, n + 1)
            ax.plot(x, arr.mean(0), color=color, label=f"{model.split('_')[0]} (n={len(ys)})")
            ax.fill_between(x, arr.min(0), arr.max(0), color=color, alpha=0.2)
    axes[0].set(xlabel="epoch", ylabel="val top-1 (%)", title="validation top-1")
    axes[1].set(xlabel="epoch", ylabel="loss", title="training loss", yscale="log")
    axes[0].legend()
    fig.suptitle("embedded MNIST-5k digits, nano ViT (D=96, 4 blocks), matched parameters", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def count_params(model: str) -> int:
    import timm

    import diffzoo.models  # noqa: F401  (registers the ViTs)
    from diffzoo.layers import count_parameters

    return count_parameters(timm.create_model(model))


def main(argv: list[str] | None = None) -> list[dict]:
    return compare_main(argv, __doc__, OUT, MODELS, run_one, count_params, table, plot)


if __name__ == "__main__":
    main()
