"""Normalisation layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in fp32 and cast back.

    Args:
        dim: width of the normalised (last) dimension.
        eps: added to the mean square.
        elementwise_affine: learn a per-channel weight, initialised to 1.
    """

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        w = None if self.weight is None else self.weight.float()
        return F.rms_norm(x.float(), (self.dim,), w, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def build_norm(kind: str, dim: int, eps: float | None = None) -> nn.Module:
    """``"layernorm"`` (eps 1e-6, as timm's ViT) or ``"rmsnorm"`` (eps 1e-6)."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=1e-6 if eps is None else eps)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=1e-6 if eps is None else eps)
    raise ValueError(f"unknown norm {kind!r}; expected 'layernorm' or 'rmsnorm'")
