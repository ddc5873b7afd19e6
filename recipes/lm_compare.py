"""Differential vs softmax causal LM at matched parameters on the embedded corpus, several seeds.

    OMP_NUM_THREADS=1 python -m recipes.lm_compare --seeds 0 1 2 --jobs 2 [--plot docs/results/lm_curves.png]

Each run is ``python -m recipes.lm`` with the default config (``configs/lm_pydoc.yaml``: ``lm_tiny``,
byte tokens, half of the training windows retrieval contexts), once with ``--model.attn diff`` and once
with ``--model.attn softmax`` per seed (the seed sets the initialisation and the window order; the
validation split is fixed). Each trained model is then evaluated on key-information retrieval
(:func:`recipes.lm_retrieval.evaluate`) with contexts cut from the held-out split. Runs go to
``outputs/lm_compare/<attn>_seed<k>/``; the tables (mean, sample standard deviation, per seed) are
printed as markdown and everything is saved in ``outputs/lm_compare/results.json``. The command line is
the one of every comparison (``recipes._study.compare_main``): ``--models diff`` trains one attention,
``--evaluate-only`` re-runs the retrieval evaluation of the saved runs, ``--retrieval-samples`` sets its
contexts per cell; other arguments go to every ``recipes.lm`` run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from recipes._study import compare_main, read_run, recipe_command, train

ATTNS = ("diff", "softmax")
OUT = Path("outputs/lm_compare")


def train_one(attn: str, seed: int, extra: list[str]) -> dict:
    """Train one model in a fresh process; returns its summary and validation curve."""
    name = f"{attn}_seed{seed}"
    args = ["--model.attn", attn, "--seed_everything", str(seed), "--data.seed", str(seed), *extra]
    seconds = train(recipe_command("recipes.lm", OUT, name, args), OUT / f"{name}.log")
    run = read_run(OUT / name, ("val/loss", "train/loss_step"), steps=True)
    return {"model": attn, "attn": attn, "seed": seed, "seconds": seconds, **run}


def evaluate(run: dict, args: argparse.Namespace) -> dict:
    """Key-information retrieval of one trained run's exported weights (added as ``run["retrieval"]``)."""
    from recipes.lm_retrieval import evaluate_weights

    start = time.time()
    rows = evaluate_weights(run["summary"]["safetensors"], samples=args.retrieval_samples)
    return {**run, "retrieval": rows, "retrieval_seconds": time.time() - start}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retrieval-samples", type=int, default=8, help="contexts per (length, needles, depth) cell")


def tables(runs: list[dict]) -> str:
    """The loss table and the retrieval tables by length, needle count and depth."""
    parts = [loss_table(runs)]
    for key in ("length", "needles", "depth"):
        parts.append(f"\nretrieval accuracy % by {key}\n" + retrieval_table(runs, key))
    return "\n".join(parts)


def _stats(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {std:.4f}"


def loss_table(runs: list[dict]) -> str:
    """Markdown table of final validation loss and perplexity per attention."""
    lines = ["| attention | params | seeds | val loss (mean ± std) | val ppl (mean) | per seed |", "|---|---|---|---|---|---|"]
    for attn in ATTNS:
        rs = [r for r in runs if r["attn"] == attn]
        if not rs:
            continue
        losses = [r["summary"]["metrics"]["val/loss"] for r in rs]
        ppl = statistics.mean(r["summary"]["metrics"]["val/ppl"] for r in rs)
        lines.append(
            f"| {attn} | {rs[0]['summary']['parameters']:,} | {len(rs)} | {_stats(losses)} | {ppl:.3f} | "
            f"{', '.join(f'{v:.4f}' for v in losses)} |"
        )
    return "\n".join(lines)


def retrieval_table(runs: list[dict], key: str) -> str:
    """Markdown table of retrieval accuracy (and attention scores) grouped by ``key`` (length / needles / depth)."""
    groups = sorted({row[key] for r in runs for row in r.get("retrieval", [])})
    head = "| attention | " + " | ".join(f"{key}={g}" for g in groups) + " | attn to answer | attn to noise |"
    lines = [head, "|" + "---|" * (len(groups) + 3)]
    for attn in ATTNS:
        rs = [r for r in runs if r["attn"] == attn and r.get("retrieval")]
        if not rs:
            continue
        cells = []
        for g in groups:
            per_seed = []
            for r in rs:
                rows = [row for row in r["retrieval"] if row[key] == g]
                per_seed.append(100 * sum(row["correct"] for row in rows) / sum(row["n"] for row in rows))
            std = statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0
            cells.append(f"{statistics.mean(per_seed):.1f} ± {std:.1f}")
        ans = [statistics.mean(row["score_answer"] for row in r["retrieval"]) for r in rs]
        noise = [statistics.mean(row["score_noise"] for row in r["retrieval"]) for r in rs]
        lines.append(f"| {attn} | " + " | ".join(cells) + f" | {_stats(ans)} | {_stats(noise)} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    """Validation loss per step (mean and min-max band) and retrieval accuracy by needle count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    for i, (attn, color) in enumerate(zip(ATTNS, ("tab:red", "tab:blue"))):
        rs = [r for r in runs if r["attn"] == attn]
        if not rs:
            continue
        n = min(len(r["curves"]["val/loss"]) for r in rs)
        steps = [s for s, _ in rs[0]["curves"]["val/loss"][:n]]
        arr = np.array([[v for _, v in r["curves"]["val/loss"][:n]] for r in rs])
        axes[0].plot(steps, arr.mean(0), "o-", color=color, label=f"{attn} (n={len(rs)})")
        axes[0].fill_between(steps, arr.min(0), arr.max(0), color=color, alpha=0.2)
        counts = sorted({row["needles"] for r in rs for row in r.get("retrieval", [])})
        if counts:
            acc = np.array([[100 * sum(x["correct"] for x in r["retrieval"] if x["needles"] == c)
                             / sum(x["n"] for x in r["retrieval"] if x["needles"] == c) for c in counts] for r in rs])
            xs = np.arange(len(counts)) + (i - 0.5) * 0.35
            axes[1].bar(xs, acc.mean(0), 0.35, color=color, alpha=0.7, label=attn)
            axes[1].errorbar(xs, acc.mean(0), yerr=[acc.mean(0) - acc.min(0), acc.max(0) - acc.mean(0)],
                             fmt="none", color="k", capsize=3)
            axes[1].set_xticks(np.arange(len(counts)), [str(c) for c in counts])
    axes[0].set(xlabel="optimizer step", ylabel="loss (nats/byte)", title="validation loss, pydoc topics")
    axes[1].set(xlabel="needles in context", ylabel="retrieval accuracy (%)", title="key retrieval (all lengths)")
    axes[0].legend()
    axes[1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv: list[str] | None = None) -> list[dict]:
    return compare_main(argv, __doc__, OUT, ATTNS, train_one, None, tables, plot, evaluate=evaluate,
                        add_arguments=add_arguments)


if __name__ == "__main__":
    main()
