"""Feed-forward layers."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn


class Mlp(nn.Module):
    """``fc2(drop(act(fc1(x))))``, the ViT/CLIP feed-forward."""

    def __init__(
        self, dim: int, hidden_dim: int, act_layer: Callable[[], nn.Module] = nn.GELU, bias: bool = True, drop: float = 0.0
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)`` (Shazeer, arXiv 2002.05202), the LLaMA feed-forward."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False, drop: float = 0.0) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w3 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.w2(F.silu(self.w1(x)) * self.w3(x)))
