"""Key-information retrieval of a trained LM: ``python -m recipes.lm_retrieval --weights model.safetensors``.

Contexts of distractor text from the held-out end of the corpus (default: the embedded pydoc topics)
with N needles ``" The key of ABC is 123. "`` at chosen depths, ending in a query for one of them.
Prints exact-match accuracy by context length, needle count and depth, and the paper's attention to
the answer and to the noise (docs/design.md, "Attention noise"); ``--json`` saves every cell.

    python -m recipes.lm_retrieval --weights outputs/lm/version_0/model.safetensors
    python -m recipes.lm_retrieval --weights ... --lengths 128 256 --needles 1 2 4 6 --samples 20
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diffzoo.data.text import get_tokenizer, load_tokens, tokenize_corpus
from diffzoo.evaluation.retrieval import evaluate_retrieval
from diffzoo.weights.export import load_lm


def evaluate_weights(
    weights: str,
    corpus: str | None = None,
    tokenizer: str = "byte",
    val_fraction: float = 0.1,
    cache_dir: str = "outputs/cache/text",
    **kwargs: Any,
) -> list[dict]:
    """Load exported weights and run :func:`diffzoo.evaluation.retrieval.evaluate_retrieval` on held-out text."""
    model = load_lm(weights)
    tokens = load_tokens(tokenize_corpus(corpus, tokenizer, cache_dir))
    held_out = tokens[int(len(tokens) * (1 - val_fraction)):]
    return evaluate_retrieval(model, held_out, get_tokenizer(tokenizer), **kwargs)


def summarize(rows: list[dict], key: str) -> str:
    """Markdown table: accuracy and attention scores grouped by ``key``."""
    lines = [f"| {key} | contexts | accuracy % | attn to answer | attn to noise |", "|---|---|---|---|---|"]
    for g in sorted({r[key] for r in rows}):
        rs = [r for r in rows if r[key] == g]
        n = sum(r["n"] for r in rs)
        acc = 100 * sum(r["correct"] for r in rs) / n
        ans = sum(r["score_answer"] * r["n"] for r in rs) / n
        noise = sum(r["score_noise"] * r["n"] for r in rs) / n
        lines.append(f"| {g} | {n} | {acc:.1f} | {ans:.3f} | {noise:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", required=True, help="model.safetensors written by python -m recipes.lm")
    p.add_argument("--corpus", default=None, help="text file(s) of the distractors (default: embedded topics)")
    p.add_argument("--tokenizer", default="byte")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 192, 256])
    p.add_argument("--needles", type=int, nargs="+", default=[1, 2, 4, 6])
    p.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--samples", type=int, default=8, help="contexts per (length, needles, depth) cell")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every cell here")
    args = p.parse_args(argv)
    if not Path(args.weights).is_file():
        raise SystemExit(f"--weights {args.weights} does not exist")
    try:
        rows = evaluate_weights(
            args.weights, args.corpus, args.tokenizer, lengths=args.lengths, needle_counts=args.needles,
            depths=args.depths, samples=args.samples, seed=args.seed,
        )
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    for key in ("length", "needles", "depth"):
        print(summarize(rows, key) + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
