"""A preallocated key/value cache for incremental decoding."""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys ``(B, k_heads, max_seq_len, k_dim)`` and values ``(B, v_heads, max_seq_len, v_dim)``.

    :meth:`update` appends the keys/values of new tokens and returns everything cached so far, in the
    dtype of the keys it was given. Build one per attention layer with
    ``attn.make_kv_cache(batch_size, max_seq_len)``.

    With ``dtype=None`` (the default) the buffers are allocated at the first :meth:`update`, in the
    dtype (and, without ``device``, on the device) of the keys it receives, so a cache follows the
    activations: bf16 under ``torch.autocast``, the parameter dtype otherwise. A fixed ``dtype`` stores
    every token in that dtype (e.g. a bf16 cache for an fp32 model, to halve its memory).
    """

    def __init__(
        self,
        batch_size: int,
        max_seq_len: int,
        k_heads: int,
        k_dim: int,
        v_heads: int,
        v_dim: int,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        sizes = dict(batch_size=batch_size, max_seq_len=max_seq_len, k_heads=k_heads, k_dim=k_dim, v_heads=v_heads, v_dim=v_dim)
        for name, value in sizes.items():
            if value < 0:
                raise ValueError(f"KVCache {name}={value} must be >= 0")
        self._k_shape = (batch_size, k_heads, max_seq_len, k_dim)
        self._v_shape = (batch_size, v_heads, max_seq_len, v_dim)
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.seq_len = 0
        if dtype is not None:
            self._allocate(dtype, device)
        else:
            self._device = device

    def _allocate(self, dtype: torch.dtype, device: torch.device | None) -> None:
        self.k = torch.zeros(self._k_shape, dtype=dtype, device=device)
        self.v = torch.zeros(self._v_shape, dtype=dtype, device=device)

    @property
    def max_seq_len(self) -> int:
        return self._k_shape[2]

    @property
    def dtype(self) -> torch.dtype | None:
        """dtype of the stored keys/values (None until the first update of a cache that follows its inputs)."""
        return None if self.k is None else self.k.dtype

    def reset(self) -> None:
        """Forget every cached token (the buffers are reused)."""
        self.seq_len = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k (B, k_heads, n, k_dim)``, ``v (B, v_heads, n, v_dim)``; return all cached k, v.

        The returned tensors have ``k.dtype``; they are views of the cache when its dtype is the same.
        """
        n = k.shape[2]
        ks, vs = self._k_shape, self._v_shape
        if tuple(k.shape[:2]) != ks[:2] or k.shape[3] != ks[3] or tuple(v.shape[:2]) != vs[:2] or v.shape[3] != vs[3]:
            raise ValueError(
                f"kv-cache holds k {ks} / v {vs}, got k {tuple(k.shape)} / v {tuple(v.shape)}"
            )
        if v.shape[2] != n:
            raise ValueError(f"kv-cache update got {n} keys but {v.shape[2]} values")
        if self.seq_len + n > self.max_seq_len:
            raise ValueError(f"kv-cache overflow: {self.seq_len} cached + {n} new > max_seq_len={self.max_seq_len}")
        if self.k is None:
            self._allocate(k.dtype, k.device if self._device is None else self._device)
        assert self.k is not None and self.v is not None
        self.k[:, :, self.seq_len : self.seq_len + n] = k
        self.v[:, :, self.seq_len : self.seq_len + n] = v
        self.seq_len += n
        return self.k[:, :, : self.seq_len].to(k.dtype), self.v[:, :, : self.seq_len].to(v.dtype)
