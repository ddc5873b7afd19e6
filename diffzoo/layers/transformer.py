"""A stack of :class:`~diffzoo.layers.Block`: the trunk of every diffzoo model not built on a host library's class.

:class:`Transformer` owns what each model family used to repeat around its blocks: the linear
drop-path schedule, gradient checkpointing, passing masks, RoPE positions and kv-caches down to every
block, and returning selected block outputs (:meth:`Transformer.forward_intermediates`).

The stack *is* the list of its blocks (an :class:`torch.nn.ModuleList`), so a model that stores it as
``self.blocks`` keeps the state-dict names ``blocks.{i}.…`` and ``model.blocks[i]`` of a plain list.

    from diffzoo.layers import Transformer

    stack = Transformer(dim=128, depth=4, baseline_heads=4, attn="diff", causal=True, drop_path_rate=0.1)
    y = stack(x, key_padding_mask=padding)                  # (B, N, 128)
    y, feats = stack.forward_intermediates(x, indices=[1, 3])  # outputs of blocks 1 and 3
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..kernels._masks import check_dropout_p
from .attention import AttentionBase
from .block import Block
from .heads import check_positive_int
from .kv_cache import KVCache

__all__ = ["GradCheckpointingMixin", "Transformer", "drop_path_rates", "take_indices"]


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Stochastic-depth probability of each of ``depth`` blocks: 0 for the first, rising linearly to ``rate``."""
    check_dropout_p(rate, "drop_path_rate")
    check_positive_int("depth", depth)
    return [rate * i / max(depth - 1, 1) for i in range(depth)]


def take_indices(depth: int, indices: int | Sequence[int] | None) -> tuple[list[int], int]:
    """Block indices to return from a stack of ``depth`` blocks, and the largest of them.

    ``None`` takes every block, an int ``n`` the last ``n`` blocks, a sequence those blocks (negative
    indices count from the end), as timm's and open_clip's ``forward_intermediates`` read them.
    """
    if indices is None:
        take = list(range(depth))
    elif isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} blocks; the stack has {depth} (use 1..{depth})")
        take = list(range(depth - indices, depth))
    else:
        take = []
        for i in indices:
            j = i + depth if i < 0 else i
            if not 0 <= j < depth:
                raise ValueError(f"block index {i} is outside a stack of {depth} blocks (use {-depth}..{depth - 1})")
            take.append(j)
    if not take:
        raise ValueError("indices selects no block; pass None (all), a count or a list of block indices")
    return take, max(take)


class Transformer(nn.ModuleList):
    """``depth`` :class:`Block` s run in order, with drop-path schedule, checkpointing, masks and caches.

    Args:
        dim: model width.
        depth: number of blocks.
        baseline_heads: heads of the softmax baseline (``Block``'s ``num_heads``; ``attn="diff"``
            turns them into half as many differential heads).
        drop_path_rate: stochastic depth of the last block; block ``i`` gets ``rate * i / (depth - 1)``.
        block_kwargs: every other :class:`Block` argument (``attn``, ``num_kv_heads``, ``mlp_hidden_dim``,
            ``causal``, ``rope`` - one :class:`RotaryEmbedding` is shared by all blocks -, norms, ...).
            Block ``i`` is built with ``depth=i`` (the differential ``lambda_init`` schedule).

    ``forward`` and :meth:`forward_intermediates` pass ``key_padding_mask``, ``attn_mask``, ``causal``
    and ``positions`` to every block's attention and ``kv_caches[i]`` to block ``i``. With
    :meth:`set_grad_checkpointing` each block's activations are recomputed in the backward pass
    (only while gradients are enabled and no kv-cache is passed: a recomputation would append to the
    cache twice).
    """

    def __init__(self, dim: int, depth: int, baseline_heads: int, *, drop_path_rate: float = 0.0,
                 **block_kwargs: Any) -> None:
        for reserved in ("depth", "drop_path", "num_heads"):
            if reserved in block_kwargs:
                raise TypeError(
                    f"Transformer sets the blocks' {reserved!r} itself; pass depth=, drop_path_rate= or "
                    "baseline_heads= instead"
                )
        rates = drop_path_rates(drop_path_rate, depth)
        super().__init__(Block(dim, baseline_heads, depth=i, drop_path=rates[i], **block_kwargs) for i in range(depth))
        self.drop_path_rate = drop_path_rate
        self.grad_checkpointing = False

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):  # a slice is a plain list of blocks, not a new stack
            return nn.ModuleList(list(self._modules.values())[idx])
        return super().__getitem__(idx)

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of storing them."""
        self.grad_checkpointing = enable

    def make_kv_caches(self, batch_size: int, max_seq_len: int, dtype: torch.dtype | None = None) -> list[KVCache]:
        """One empty :class:`KVCache` per block (``dtype=None``: the activations' dtype)."""
        layers = [cast(AttentionBase, blk.attn) for blk in self]
        return [attn.make_kv_cache(batch_size, max_seq_len, dtype=dtype) for attn in layers]

    def _run(self, x: Tensor, stop: int, take: Iterable[int], kv_caches: Sequence[KVCache] | None,
             attn_kwargs: dict[str, Any]) -> tuple[Tensor, list[Tensor]]:
        if kv_caches is not None and len(kv_caches) != len(self):
            raise ValueError(f"got {len(kv_caches)} kv-caches for {len(self)} blocks; use make_kv_caches()")
        wanted = set(take)
        ckpt = self.grad_checkpointing and kv_caches is None and torch.is_grad_enabled()
        out = []
        for i, blk in enumerate(self):
            if i == stop:
                break
            kw = attn_kwargs if kv_caches is None else {**attn_kwargs, "kv_cache": kv_caches[i]}
            x = checkpoint(blk, x, use_reentrant=False, **kw) if ckpt else blk(x, **kw)
            if i in wanted:
                out.append(x)
        return x, out

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool | None = None,
        positions: Tensor | None = None,
        kv_caches: Sequence[KVCache] | None = None,
    ) -> Tensor:
        """``x (B, N, dim)`` through every block; the masks are those of :class:`AttentionBase.forward`."""
        kw = dict(key_padding_mask=key_padding_mask, attn_mask=attn_mask, causal=causal, positions=positions)
        return self._run(x, len(self), (), kv_caches, kw)[0]

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | Sequence[int] | None = None,
        *,
        stop_early: bool = False,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool | None = None,
        positions: Tensor | None = None,
        kv_caches: Sequence[KVCache] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """The outputs of selected blocks, ``(x, [block outputs (B, N, dim)])``.

        Args:
            indices: blocks to return (see :func:`take_indices`): None = all, ``n`` = the last ``n``.
            stop_early: stop after the last selected block; ``x`` is then that block's output.
            key_padding_mask, attn_mask, causal, positions, kv_caches: as in :meth:`forward`.

        Returns:
            the final hidden states (of the last block run) and the selected outputs in block order.
        """
        take, last = take_indices(len(self), indices)
        kw = dict(key_padding_mask=key_padding_mask, attn_mask=attn_mask, causal=causal, positions=positions)
        return self._run(x, last + 1 if stop_early else len(self), take, kv_caches, kw)

    def extra_repr(self) -> str:
        return f"drop_path_rate={self.drop_path_rate}"


class GradCheckpointingMixin:
    """For a model whose ``self.blocks`` is a :class:`Transformer`: timm's and open_clip's
    ``set_grad_checkpointing`` / ``grad_checkpointing`` act on the stack."""

    blocks: Transformer

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass (not while kv-caches are passed)."""
        self.blocks.set_grad_checkpointing(enable)

    @property
    def grad_checkpointing(self) -> bool:
        return self.blocks.grad_checkpointing
