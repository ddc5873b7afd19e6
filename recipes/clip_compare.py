"""Differential vs softmax CLIP at matched parameters on the embedded coloured digits, several seeds.

    OMP_NUM_THREADS=1 python -m recipes.clip_compare --seeds 0 1 2 --jobs 2 [--plot docs/results/clip_digits_curves.png]
    python -m recipes.clip_compare --from-results --plot ...          # re-make table / plot only

Each run is a fresh ``python -m recipes.clip`` process with the default config (``configs/clip_digits.yaml``),
one with ``DiffCLIP-nano`` and one with ``SoftCLIP-nano`` per seed (the seed sets the initialisation and
the training order; the split and the colouring are fixed). Runs go to ``outputs/clip_compare/<model>_seed<k>/``;
the table (held-out-pair zero-shot top-1, colour-swap pair accuracy and seen-pair retrieval R@1: mean,
sample standard deviation, per seed) is printed as markdown and saved with the curves in
``outputs/clip_compare/results.json``. Extra arguments go to every run (``--trainer.max_epochs 2``).

``--models DiffCLIPdagger-nano`` adds the model with a differential image tower and a softmax text tower
(DiffCLIP-dagger) to a finished comparison; the runs already in results.json are kept.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from recipes._study import compare_main, read_run, recipe_command, train

MODELS = ("DiffCLIP-nano", "SoftCLIP-nano")  # trained by default
EXTRA = ("DiffCLIPdagger-nano",)  # differential image tower only: --models DiffCLIPdagger-nano
OUT = Path("outputs/clip_compare")
CURVES = ("val/zs_top1", "val/zs_pair", "val/i2t_r1", "val/t2i_r1", "val/loss", "train/loss_epoch")
COLUMNS = (("val/zs_top1", "zero-shot top-1 (held-out pairs)"), ("val/zs_pair", "pair vs colour-swapped"),
           ("val/i2t_r1", "i2t R@1"), ("val/t2i_r1", "t2i R@1"))


def run_one(model: str, seed: int, extra: list[str]) -> dict:
    """Train one model with one seed in a fresh process; returns its summary and per-epoch curves."""
    name = f"{model}_seed{seed}"
    args = ["--model.model", model, "--seed_everything", str(seed), "--data.init_args.seed", str(seed), *extra]
    seconds = train(recipe_command("recipes.clip", OUT, name, args), OUT / f"{name}.log")
    return {"model": model, "seed": seed, "seconds": seconds, **read_run(OUT / name, CURVES)}


def table(runs: list[dict]) -> str:
    """Markdown table of the final metrics per model: mean ± sample std, then the per-seed values."""
    head = "| model | params | seeds | " + " | ".join(f"{label} % (mean ± std)" for _, label in COLUMNS) + " | per seed (zs top-1 / i2t R@1) |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 4)]
    for model in MODELS + EXTRA:
        mine = [r for r in runs if r["model"] == model]
        if not mine:
            continue
        cells = []
        for key, _ in COLUMNS:
            vals = [100 * r["summary"]["metrics"][key] for r in mine if key in r["summary"]["metrics"]]
            std = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells.append(f"{statistics.mean(vals):.2f} ± {std:.2f}" if vals else "-")
        per_seed = ", ".join(
            f"{100 * r['summary']['metrics'].get('val/zs_top1', float('nan')):.1f} / "
            f"{100 * r['summary']['metrics'].get('val/i2t_r1', float('nan')):.1f}" for r in mine
        )
        params = f"{mine[0]['params']:,}" if mine[0].get("params") is not None else "?"
        lines.append(f"| {model} | {params} | {len(mine)} | " + " | ".join(cells) + f" | {per_seed} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    """Zero-shot top-1, retrieval R@1 and training loss per epoch: mean line and min-max band per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = (("val/zs_top1", "held-out zero-shot top-1 (%)", 100), ("val/i2t_r1", "i2t R@1 (%)", 100),
              ("train/loss_epoch", "training loss", 1))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), dpi=90)
    for model, color in zip(MODELS + EXTRA, ("tab:red", "tab:blue", "tab:orange")):
        for ax, (key, label, scale) in zip(axes, panels):
            ys = [r["curves"][key] for r in runs if r["model"] == model and r["curves"].get(key)]
            if not ys:
                continue
            n = min(len(y) for y in ys)
            arr = scale * np.array([y[:n] for y in ys])
            x = np.arange(1, n + 1)
            ax.plot(x, arr.mean(0), color=color, label=f"{model} (n={len(ys)})")
            ax.fill_between(x, arr.min(0), arr.max(0), color=color, alpha=0.2)
            ax.set(xlabel="epoch", ylabel=label)
    axes[0].legend()
    fig.suptitle("coloured MNIST digits, nano CLIP, differential vs softmax attention (matched parameters)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def count_params(model: str) -> int:
    """Parameters of an open_clip model by name (diffzoo's configs registered first)."""
    import open_clip

    import diffzoo.models.clip  # noqa: F401  (registers diffzoo's CLIP configs with open_clip)

    return sum(p.numel() for p in open_clip.create_model(model).parameters())


def main(argv: list[str] | None = None) -> list[dict]:
    return compare_main(argv, __doc__, OUT, MODELS, run_one, count_params, table, plot)


if __name__ == "__main__":
    main()
