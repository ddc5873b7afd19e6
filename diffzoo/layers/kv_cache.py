"""A preallocated key/value cache for incremental decoding."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


class KVCache:
    """Keys ``(B, k_heads, max_seq_len, k_dim)`` and values ``(B, v_heads, max_seq_len, v_dim)``.

    :meth:`update` appends the keys/values of new tokens and returns everything cached so far.
    Build one per attention layer with ``attn.make_kv_cache(batch_size, max_seq_len)``.
    """

    def __init__(
        self,
        batch_size: int,
        max_seq_len: int,
        k_heads: int,
        k_dim: int,
        v_heads: int,
        v_dim: int,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device] = None,
    ) -> None:
        self.k = torch.zeros(batch_size, k_heads, max_seq_len, k_dim, dtype=dtype, device=device)
        self.v = torch.zeros(batch_size, v_heads, max_seq_len, v_dim, dtype=dtype, device=device)
        self.seq_len = 0

    @property
    def max_seq_len(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        """Forget every cached token (the buffers are reused)."""
        self.seq_len = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k (B, k_heads, n, k_dim)``, ``v (B, v_heads, n, v_dim)``; return all cached k, v."""
        n = k.shape[2]
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3] or v.shape[3] != self.v.shape[3]:
            raise ValueError(
                f"kv-cache holds k {tuple(self.k.shape)} / v {tuple(self.v.shape)}, got k {tuple(k.shape)} / v {tuple(v.shape)}"
            )
        if self.seq_len + n > self.max_seq_len:
            raise ValueError(f"kv-cache overflow: {self.seq_len} cached + {n} new > max_seq_len={self.max_seq_len}")
        self.k[:, :, self.seq_len : self.seq_len + n] = k
        self.v[:, :, self.seq_len : self.seq_len + n] = v
        self.seq_len += n
        return self.k[:, :, : self.seq_len], self.v[:, :, : self.seq_len]
