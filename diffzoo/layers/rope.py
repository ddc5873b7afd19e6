"""Rotary position embeddings (Su et al., RoFormer, arXiv 2104.09864), rotate-half layout."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._tracing import is_fx_tracing


class RotaryEmbedding(nn.Module):
    """Rotates pairs of channels ``(x[..., i], x[..., i + dim/2])`` by position-dependent angles.

    Applied to every query and key head of width ``dim``; in differential attention that is each
    half-head ``q1, q2, k1, k2`` separately. Holds no parameters; the angles ``position * theta_i``
    are formed from the positions of each call (fp32), so any position works without a table to
    grow and the module has no data-dependent sizes (``torch.compile`` and ``torch.export`` trace it
    whole).

    Args:
        dim: head width (even).
        base: angle base, ``theta_i = base ** (-2i / dim)``.
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RotaryEmbedding needs an even head width, got dim={dim}")
        self.dim, self.base = dim, base
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.inv_freq: Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate ``x (B, heads, N, dim)`` at ``positions`` (``(N,)`` or ``(B, N)`` ints, default ``0..N-1``)."""
        N = x.shape[-2]
        if not is_fx_tracing():
            if x.shape[-1] != self.dim:
                raise ValueError(f"RotaryEmbedding(dim={self.dim}) got input width {x.shape[-1]}")
            if positions is not None and positions.shape[-1] != N:
                raise ValueError(f"positions has {positions.shape[-1]} entries for {N} tokens")
        if positions is None:
            positions = torch.arange(N, device=x.device)
        freqs = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq  # (N, dim/2) or (B, N, dim/2)
        cos, sin = freqs.cos().unsqueeze(-3), freqs.sin().unsqueeze(-3)  # a heads axis to broadcast over
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}"
