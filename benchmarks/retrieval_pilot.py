"""Pilots for a needle-retrieval row: do the study's byte-level LMs copy from their context at all, and does
``lm_tiny`` learn retrieval when the training windows are dense with it?

    python -m benchmarks.retrieval_pilot copy outputs/study/lm/runs/*_seed10[0-2]/version_*/model.safetensors
    python -m benchmarks.retrieval_pilot train --steps 4000                    # 4 compact needles, 4 queries
    python -m benchmarks.retrieval_pilot train --answer-loss --letters 1 --digits 2

``copy`` scores exported language models (``model.safetensors`` of ``python -m recipes.lm``) on contexts cut
from the held-out tenth of the embedded text: next-byte accuracy over the first and the second occurrence of a
repeated span (held-out text, and random lowercase letters that no language prior predicts), and exact match on
the needle contexts of the ``needle`` family (``diffzoo.data.needles``). A model that copies from its context
predicts the second occurrence far better than the first (in-context copying, the "induction" behaviour).

``train`` trains one model with the study's recipe (AdamW, its weight decay, betas, clipping, warm-up and
cosine, ``diffzoo.study.recipe.RECIPE``) on 129-byte windows of training text holding ``--needles`` compact
needles ``" ABC=123. "`` and ending with ``--queries`` questions about them (``diffzoo.data.needles.recall_window``),
and prints the exact-match retrieval of 256 held-out windows every 500 steps. ``--answer-loss`` trains on the
answer bytes only (MQAR's objective); otherwise on every byte (an LM's). One thread, the study's batch of 16.

This is a pilot loop, not a recipe: no checkpoints, no records. docs/study.md lists what it printed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

WINDOW = 129  # tokens of a context: 128 inputs and their targets, the LM family's windows
HELD_OUT = 0.1  # the last tenth of the corpus, the LM family's validation and test text


def corpus_split() -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) bytes of the embedded text, split as the LM family splits it."""
    from diffzoo.data.text import ByteTokenizer, pydoc_topics_text

    tokens = np.asarray(ByteTokenizer().encode(pydoc_topics_text()), dtype=np.int64)
    cut = int(len(tokens) * (1 - HELD_OUT))
    return tokens[:cut], tokens[cut:]


def repeated_spans(text: np.ndarray, count: int, prefix: int, span: int, rng: np.random.Generator,
                   random_letters: bool = False) -> Tensor:
    """``(count, prefix + 2 * span)`` contexts: ``prefix`` bytes of text, then a span twice (the bytes that follow
    the prefix in ``text``, or random lowercase letters)."""
    rows = []
    for _ in range(count):
        o = int(rng.integers(0, len(text) - prefix - span))
        s = rng.integers(97, 123, span) if random_letters else text[o + prefix : o + prefix + span]
        rows.append(np.concatenate([text[o : o + prefix], s, s]))
    return torch.as_tensor(np.stack(rows), dtype=torch.long)


def copy_accuracy(predict: Callable[[Tensor], Tensor], contexts: Tensor, prefix: int, span: int) -> tuple[float, float]:
    """Next-token accuracy % over the first and the second occurrence of the span (its first token excluded:
    nothing before it says which span comes). ``predict`` maps inputs ``(B, N)`` to predicted tokens ``(B, N)``."""
    pred = predict(contexts[:, :-1])
    target = contexts[:, 1:]
    first = slice(prefix, prefix + span - 1)  # predictions of the span's 2nd..last tokens, first occurrence
    second = slice(prefix + span, prefix + 2 * span - 1)
    return (100 * (pred[:, first] == target[:, first]).float().mean().item(),
            100 * (pred[:, second] == target[:, second]).float().mean().item())


def exact_matches(logits_of: Callable[[Tensor], Tensor], windows: Tensor,
                  answers: Sequence[Sequence[tuple[int, int]]]) -> float:
    """% of answers whose every byte the model predicts (greedy, teacher-forced), scored by
    :func:`diffzoo.evaluation.retrieval.answer_hits`. ``logits_of`` maps inputs ``(B, N)`` to logits ``(B, N, V)``;
    ``answers[i]`` holds the ``(start, end)`` spans of window ``i``."""
    from diffzoo.evaluation.retrieval import answer_hits

    logits = logits_of(windows[:, :-1])
    rows = [i for i, spans in enumerate(answers) for _ in spans]
    spans = [span for spans in answers for span in spans]
    return 100 * answer_hits(logits[rows], windows[rows], spans).float().mean().item()


def _logits(model: torch.nn.Module) -> Callable[[Tensor], Tensor]:
    def forward(tokens: Tensor) -> Tensor:
        was = model.training
        model.eval()
        with torch.no_grad():
            out = model(tokens)
        model.train(was)
        return out
    return forward


def _greedy(model: torch.nn.Module) -> Callable[[Tensor], Tensor]:
    logits_of = _logits(model)
    return lambda tokens: logits_of(tokens).argmax(-1)


def run_copy(paths: Sequence[str], count: int, seed: int) -> None:
    from diffzoo.data.needles import fixed_needle_set
    from diffzoo.data.text import ByteTokenizer
    from diffzoo.evaluation.retrieval import retrieval_hits
    from diffzoo.weights import load_lm

    _, held = corpus_split()
    rng = np.random.default_rng(seed)
    prefix, span = 48, 40
    text_ctx = repeated_spans(held, count, prefix, span, rng)
    letter_ctx = repeated_spans(held, count, prefix, span, rng, random_letters=True)
    needle_set = fixed_needle_set(held, ByteTokenizer(), WINDOW, 240, seed=seed)
    print("| model | attention | text span 1st | text span 2nd | letters 1st | letters 2nd | needle exact match |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        model = load_lm(path)
        predict = _greedy(model)
        t1, t2 = copy_accuracy(predict, text_ctx, prefix, span)
        r1, r2 = copy_accuracy(predict, letter_ctx, prefix, span)
        needles = 100 * retrieval_hits(model, needle_set).float().mean().item()
        print(f"| {path} | {model.config.attn} | {t1:.1f} | {t2:.1f} | {r1:.1f} | {r2:.1f} | {needles:.1f} |", flush=True)


def run_train(args: argparse.Namespace) -> None:
    from diffzoo.data.needles import recall_window
    from diffzoo.models.lm import CausalLM, LMConfig, preset_args
    from diffzoo.study.recipe import RECIPE
    from diffzoo.tasks.optim import warmup_cosine, weight_decay_groups

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    train, held = corpus_split()
    shape = dict(needles=args.needles, queries=args.queries, letters=args.letters, digits=args.digits)
    eval_rng = np.random.default_rng(12345)
    held_windows = [recall_window(held, WINDOW, eval_rng, **shape) for _ in range(256)]
    eval_tokens = torch.as_tensor(np.stack([w.tokens for w in held_windows]))
    model = CausalLM(LMConfig(**preset_args(args.model, vocab_size=256, attn=args.attn)))
    opt = torch.optim.AdamW(weight_decay_groups(model, RECIPE.weight_decay), lr=args.lr, betas=RECIPE.betas)
    warmup = max(1, round(RECIPE.warmup_fraction * args.steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warmup, args.steps, RECIPE.min_lr_ratio))
    start = time.time()
    for step in range(1, args.steps + 1):
        batch = [recall_window(train, WINDOW, rng, **shape) for _ in range(args.batch_size)]
        tokens = torch.as_tensor(np.stack([w.tokens for w in batch]))
        targets = tokens[:, 1:].clone()
        if args.answer_loss:
            keep = torch.zeros_like(targets, dtype=torch.bool)
            for i, window in enumerate(batch):
                for s, e in window.answers:
                    keep[i, s - 1 : e - 1] = True
            targets[~keep] = -100
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE.grad_clip)
        opt.step()
        sched.step()
        if step % args.every == 0 or step == args.steps:
            acc = exact_matches(_logits(model), eval_tokens, [w.answers for w in held_windows])
            print(f"step {step}: loss {loss.item():.3f}, held-out retrieval {acc:.1f} % exact match "
                  f"(chance {100 * 10.0 ** -args.digits:g} %), {time.time() - start:.0f} s", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cp = sub.add_parser("copy", help="score exported LMs on repeated spans and needle contexts",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cp.add_argument("paths", nargs="+", help="model.safetensors files written by python -m recipes.lm")
    cp.add_argument("--count", type=int, default=256, help="contexts of each kind")
    cp.add_argument("--seed", type=int, default=0, help="seed of the contexts")
    tr = sub.add_parser("train", help="train lm_tiny on windows dense with needles and queries",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tr.add_argument("--needles", type=int, default=4)
    tr.add_argument("--queries", type=int, default=4)
    tr.add_argument("--letters", type=int, default=3, help="letters of a needle's key")
    tr.add_argument("--digits", type=int, default=3, help="digits of a needle's value")
    tr.add_argument("--answer-loss", action="store_true", help="train on the answer bytes only")
    tr.add_argument("--steps", type=int, default=4000)
    tr.add_argument("--lr", type=float, default=4e-3)
    tr.add_argument("--batch-size", type=int, default=16)
    tr.add_argument("--model", default="lm_tiny")
    tr.add_argument("--attn", default="softmax")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--every", type=int, default=500, help="steps between retrieval scores")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "copy":
        run_copy(args.paths, args.count, args.seed)
    else:
        run_train(args)


if __name__ == "__main__":
    main()
