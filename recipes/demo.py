"""A one-minute demo of diffzoo.layers on CPU: matched parameters, backends, and a tiny training run.

    python -m recipes.demo [--steps 150]

Trains a differential and a softmax encoder of matched size on a synthetic needle task (find the
value stored next to a marker token among random distractors) and prints both losses.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from diffzoo.kernels import diff_attention
from diffzoo.layers import Block, count_parameters


class Encoder(nn.Module):
    def __init__(self, attn: str, vocab: int = 64, dim: int = 64, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, attn=attn, depth=i, rope=True) for i in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, N, dim)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))  # predict from the first (query) token


def needle_batch(batch: int, length: int, vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token 0 is the query; a marker (token 1) is followed by the answer somewhere in the sequence."""
    tokens = torch.randint(2, vocab, (batch, length), generator=generator)
    tokens[:, 0] = 0
    pos = torch.randint(1, length - 1, (batch,), generator=generator)
    answer = torch.randint(2, vocab, (batch,), generator=generator)
    rows = torch.arange(batch)
    tokens[rows, pos] = 1
    tokens[rows, pos + 1] = answer
    return tokens, answer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--length", type=int, default=32)
    args = parser.parse_args(argv)

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 8, 64, 16, generator=g), torch.randn(1, 8, 64, 16, generator=g), torch.randn(1, 4, 64, 32, generator=g)
    lam = torch.tensor(0.5)
    ref = diff_attention(q, k, v, lam, backend="reference")
    for backend in ("sdpa", "blockwise"):
        err = (diff_attention(q, k, v, lam, backend=backend) - ref).abs().max().item()
        print(f"backend {backend:9s} max |difference| to reference: {err:.2e}")

    for attn in ("diff", "softmax"):
        torch.manual_seed(0)
        model = Encoder(attn)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        data = torch.Generator().manual_seed(1)
        t0, losses = time.perf_counter(), []
        for _ in range(args.steps):
            tokens, answer = needle_batch(64, args.length, 64, data)
            loss = nn.functional.cross_entropy(model(tokens), answer)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        tail = sum(losses[-20:]) / 20
        print(
            f"{attn:8s} attention: {count_parameters(model):,} parameters, loss {losses[0]:.3f} -> {tail:.3f} "
            f"(mean of last 20 steps) in {time.perf_counter() - t0:.1f} s"
        )


if __name__ == "__main__":
    main()
