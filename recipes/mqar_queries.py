"""Accuracy by query index of trained MQAR runs, beside the elimination shortcut:
``python -m recipes.mqar_queries RUN [RUN ...]``.

With distinct queries, a model can answer query ``i`` of ``P`` pairs with probability ``1 / (P - i)``
without binding any key to its value, by choosing among the pair values that no earlier query has
taken (see :mod:`diffzoo.data.mqar`). This tool reloads each run's exported weights (``model.safetensors``
of its newest ``version_N``), scores its fixed test (or validation) sequences query by query, and prints
one row per variant and data set-up: the mean accuracy at each query index, the level of the shortcut,
and how many runs sit on it (every query within ``--tolerance`` of the shortcut's level).

    python -m recipes.mqar_queries outputs/study/mqar/runs/*_filler16
    python -m recipes.mqar_queries outputs/study/mqar/runs/diff_lr0.001_seed10? --split val --out queries.md
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch
import yaml

from diffzoo.data.mqar import MQARDataModule, accuracy_by_query, elimination_accuracy
from diffzoo.study.runs import latest_log_dir
from diffzoo.tasks.mqar import MQARTask
from diffzoo.weights.export import load_tied
from diffzoo.weights.io import read_weights

_NOT_SHAPE = ("lr", "weight_decay", "betas", "warmup_steps", "min_lr_ratio", "init_from", "train_only",
              "unfreeze_after")
_DATA_KEYS = ("num_pairs", "num_queries", "filler", "seq_len", "key_vocab", "value_vocab", "query_replacement",
              "num_val", "num_test")


def load_run(folder: Path) -> tuple[torch.nn.Module, MQARDataModule, dict]:
    """The trained model, the run's data module and its config, from a run folder (``RUN/version_N``)."""
    log_dir = latest_log_dir(folder)
    weights = log_dir / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} does not exist: the run did not finish (no exported weights)")
    config = yaml.safe_load((log_dir / "config.yaml").read_text())
    data = MQARDataModule(**{k: v for k, v in config["data"].items() if k in _DATA_KEYS})
    model_args = {k: v for k, v in config["model"].items() if k not in _NOT_SHAPE}
    model = MQARTask(**{**model_args, "vocab_size": data.vocab_size}).model
    missing, unexpected = load_tied(model, read_weights(weights))
    if missing or unexpected:
        raise ValueError(f"{weights} does not fit the model of {log_dir / 'config.yaml'}: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.eval(), data, config


@torch.no_grad()
def score_run(folder: Path, split: str = "test", batch_size: int = 250) -> dict:
    """Accuracy by query index of one run on its fixed ``split``, with the shortcut's levels."""
    model, data, config = load_run(folder)
    tokens, labels = data.eval_set(split)
    correct = total = 0
    for t, y in zip(tokens.split(batch_size), labels.split(batch_size)):
        c, n = accuracy_by_query(model(t), y)
        correct, total = correct + c, total + n
    spec = data.spec
    return {"run": str(folder), "variant": config["model"]["attn"],
            "setup": {k: getattr(spec, k) for k in ("num_pairs", "num_queries", "filler", "query_replacement")},
            "by_query": (correct / total).tolist(), "elimination": elimination_accuracy(spec)}


def table(scored: list[dict], tolerance: float) -> str:
    """Markdown: one row per (set-up, variant), the shortcut's level under each set-up."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in scored:
        groups[(tuple(sorted(r["setup"].items())), r["variant"])].append(r)
    q = max(len(r["by_query"]) for r in scored)
    head = ("| set-up | variant | runs | mean | " + " | ".join(f"q{i + 1}" for i in range(q))
            + f" | on the shortcut (±{tolerance:g}) |")
    lines = [head, "|" + "---|" * (q + 5)]
    seen = set()
    for (setup, variant), rs in sorted(groups.items()):
        words = ", ".join(f"{k} {v}" for k, v in setup)
        if setup not in seen:
            seen.add(setup)
            e = rs[0]["elimination"]
            cells = [f"{100 * x:.1f}" for x in e] + [""] * (q - len(e))
            lines.append(f"| {words} | *elimination, no recall* | – | {100 * sum(e) / len(e):.1f} | "
                         + " | ".join(cells) + " | – |")
        by_q = torch.tensor([r["by_query"] for r in rs]).mean(0).tolist()
        on = sum(all(abs(a - b) <= tolerance for a, b in zip(r["by_query"], r["elimination"])) for r in rs)
        cells = [f"{100 * x:.1f}" for x in by_q] + [""] * (q - len(by_q))
        lines.append(f"| {words} | {variant} | {len(rs)} | {100 * sum(by_q) / len(by_q):.1f} | "
                     + " | ".join(cells) + f" | {on} of {len(rs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run folders (each holding version_N with model.safetensors)")
    p.add_argument("--split", choices=("test", "val"), default="test")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="a run is on the shortcut when every query's accuracy is this close to its level")
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    runs = [r for r in args.runs if r.is_dir()]  # a shell glob also matches the runs' .log files
    if not runs:
        p.error("no run folders among the arguments")
    try:
        scored = [score_run(r, args.split) for r in runs]
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    text = (f"Accuracy % by query index ({args.split} split), mean over runs; the elimination row is the "
            "accuracy of answering without recall.\n\n" + table(scored, args.tolerance))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return scored


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
