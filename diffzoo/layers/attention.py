"""Attention modules: the shared projection/mask/RoPE/kv-cache plumbing and standard softmax attention.

Every attention in diffzoo (softmax baseline, differential V1 and V2) derives from
:class:`AttentionBase`, so all of them take the same ``forward`` arguments and the same masks.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ..kernels import attention, attention_maps
from ..kernels._masks import check_dropout_p
from ._tracing import is_fx_tracing
from .heads import check_positive_int, resolve_heads
from .kv_cache import KVCache
from .rope import RotaryEmbedding

RopeArg = RotaryEmbedding | bool | None

#: ``hook(module, inner, x, q, k, v, masks, return_attn, backend) -> (out, maps)``, see
#: :meth:`AttentionBase.register_attend_hook`
AttendHook = Callable[..., tuple[Tensor, dict[str, Tensor] | None]]

# torch.fx records the kernels as single calls (their input checks and backend choice need real tensors).
torch.fx.wrap("attention")
torch.fx.wrap("attention_maps")


class AttentionBase(nn.Module):
    """Projections, input checks, rotary embeddings and kv-cache shared by all attention variants.

    Subclasses set ``q_heads``, ``k_heads``, ``v_heads``, ``head_dim`` (query/key width), ``v_dim`` and
    implement :meth:`_attend`, which maps ``q (B, q_heads, Nq, d)``, ``k (B, k_heads, Nk, d)``,
    ``v (B, v_heads, Nk, v_dim)`` to ``(B, heads, Nq, width)``. ``forward`` reaches it through
    :meth:`attend`, which runs the hooks of :meth:`register_attend_hook` around it.
    """

    def __init__(
        self,
        dim: int,
        *,
        q_heads: int,
        k_heads: int,
        v_heads: int,
        head_dim: int,
        v_dim: int,
        out_in: int,
        kv_dim: int | None = None,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        causal: bool = False,
        rope: RopeArg = None,
        rope_base: float = 10000.0,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("head_dim", head_dim)
        check_dropout_p(attn_drop, "attn_drop")
        check_dropout_p(proj_drop, "proj_drop")
        self.dim = dim
        self.kv_dim = dim if kv_dim is None else kv_dim
        self.q_heads, self.k_heads, self.v_heads = q_heads, k_heads, v_heads
        self.head_dim, self.v_dim = head_dim, v_dim
        self.causal = causal
        self.attn_drop = attn_drop
        self.backend = backend  # a plain attribute: never saved in the state_dict
        self.q_proj = nn.Linear(dim, q_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(self.kv_dim, k_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(self.kv_dim, v_heads * v_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(out_in, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        if rope is True:
            rope = RotaryEmbedding(head_dim, base=rope_base)
        elif rope is False:
            rope = None
        if rope is not None and rope.dim != head_dim:
            raise ValueError(f"RotaryEmbedding(dim={rope.dim}) does not match head_dim={head_dim}")
        self.rope = rope
        self._attend_hooks: OrderedDict[int, AttendHook] = OrderedDict()  # RemovableHandle holds a weakref

    def register_attend_hook(self, hook: AttendHook) -> RemovableHandle:
        """Run ``hook`` around this layer's attention step; ``handle.remove()`` takes it off again.

        ``hook(module, inner, x, q, k, v, masks, return_attn, backend)`` is called instead of the step and
        returns what ``inner(x, q, k, v, masks, return_attn, backend)`` returns: ``(out, maps)``, ``out`` of
        shape ``(B, heads, Nq, width)`` before the output projection, ``maps`` a dict of fp32 attention
        maps (``{"attn"}`` or ``{"attn1", "attn2", "lambda"}``) when ``return_attn`` is True, else None.
        ``q (B, q_heads, Nq, d)``, ``k``, ``v`` are head-major, with RoPE applied and the kv-cache appended;
        ``x`` is the layer's input and ``masks`` the dict of ``attn_mask``, ``key_padding_mask`` and
        ``causal``. A hook may look at them, call ``inner`` more than once (e.g. with ``return_attn=True``
        on a slice of the batch) or change the arguments it passes on. Hooks registered later run
        outside earlier ones. They are not part of the ``state_dict``. :mod:`diffzoo.analysis` records
        maps, logit outliers and low-bit attention through this hook.
        """
        handle = RemovableHandle(self._attend_hooks)
        self._attend_hooks[handle.id] = hook
        return handle

    def attend(
        self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, masks: dict, return_attn: bool = False,
        backend: str | None = None,
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        """The attention step of ``forward``: :meth:`_attend` with the registered attend hooks around it."""
        if not self._attend_hooks:
            return self._attend(x, q, k, v, masks, return_attn, backend)
        call: Callable[..., tuple[Tensor, dict[str, Tensor] | None]] = self._attend
        for hook in list(self._attend_hooks.values()):
            call = functools.partial(hook, self, call)
        return call(x, q, k, v, masks, return_attn, backend)

    def __prepare_scriptable__(self) -> AttentionBase:
        # torch.jit.script calls this on every submodule before compiling: fail here, with the reason,
        # rather than deep inside TorchScript's compiler (or, behind a caller that catches it, silently).
        raise RuntimeError(
            f"{type(self).__name__} cannot be compiled with torch.jit.script: diffzoo chooses the attention "
            "kernel in Python at call time (diffzoo.kernels backends), which TorchScript cannot express; "
            "use torch.compile(model) or torch.export.export(model, args) instead"
        )

    # -- helpers -------------------------------------------------------------------------------
    def make_kv_cache(
        self, batch_size: int, max_seq_len: int, dtype: torch.dtype | None = None, device: Any = None
    ) -> KVCache:
        """An empty :class:`KVCache` shaped for this layer's keys and values.

        ``dtype=None`` stores keys/values in the dtype of the activations (bf16 under ``torch.autocast``);
        ``device`` defaults to the layer's.
        """
        return KVCache(
            batch_size, max_seq_len, self.k_heads, self.head_dim, self.v_heads, self.v_dim,
            dtype=dtype, device=device or self.k_proj.weight.device,
        )

    def _check_tokens(self, t: Tensor, name: str, width: int) -> None:
        if is_fx_tracing():
            return  # proxies carry no shape to check
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must have shape (batch, tokens, {width}), got {tuple(t.shape)}")
        if t.shape[-1] != width:
            raise ValueError(f"{name} has width {t.shape[-1]}, but this {type(self).__name__} expects {width}")
        w = self.q_proj.weight
        if t.device != w.device:
            raise ValueError(f"{name} is on {t.device} but the {type(self).__name__} parameters are on {w.device}")
        if t.dtype != w.dtype and not torch.is_autocast_enabled(t.device.type):
            raise ValueError(
                f"{name} is {t.dtype} but the {type(self).__name__} parameters are {w.dtype}; "
                "cast one of them (.to(dtype)) or run under torch.autocast"
            )

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool | None = None,
        positions: Tensor | None = None,
        kv_cache: KVCache | None = None,
        return_attn: bool = False,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """Attend from ``x`` to itself, or to ``context`` (cross-attention).

        Args:
            x: ``(B, Nq, dim)`` queries (and keys/values for self-attention).
            context: ``(B, Nk, kv_dim)`` keys/values for cross-attention; no RoPE and no cache then.
            key_padding_mask: bool ``(B, Nk)``, True marks padding; with a kv-cache, ``Nk`` counts
                every cached token including the new ones.
            attn_mask: bool (True = attend) or additive float, broadcastable to ``(B, heads, Nq, Nk)``.
            causal: override the layer's ``causal`` flag; aligned to the last key (works with a cache).
            positions: RoPE positions ``(Nq,)`` or ``(B, Nq)``; default continues the cache (or ``0..Nq-1``).
            kv_cache: a :class:`KVCache` from :meth:`make_kv_cache`, updated in place.
            return_attn: also return a dict of attention maps (fp32) for analysis.
            backend: kernel backend for this call (see :mod:`diffzoo.kernels`).

        Returns:
            ``(B, Nq, dim)``, or ``(output, maps)`` with ``return_attn=True``.
        """
        self._check_tokens(x, "x", self.dim)
        B, N, _ = x.shape
        if context is not None:
            self._check_tokens(context, "context", self.kv_dim)
            if not is_fx_tracing() and context.shape[0] != B:
                raise ValueError(f"context batch {context.shape[0]} differs from x batch {B}")
            if kv_cache is not None:
                raise ValueError("kv_cache is for incremental self-attention; it cannot be combined with context")
        elif self.kv_dim != self.dim:
            raise ValueError(f"this layer was built for cross-attention (kv_dim={self.kv_dim}); pass context=")
        kv_in = x if context is None else context
        Nk = kv_in.shape[1]
        causal = self.causal if causal is None else causal
        # Head-major copies made here, so the projection outputs are freed at once; kernels that need
        # contiguous heads (blockwise, triton) then copy nothing and hold no second set of q, k, v.
        q = self.q_proj(x).view(B, N, self.q_heads, self.head_dim).transpose(1, 2).contiguous()  # (B, q_heads, N, d)
        k = self.k_proj(kv_in).view(B, Nk, self.k_heads, self.head_dim).transpose(1, 2).contiguous()  # (B, k_heads, Nk, d)
        v = self.v_proj(kv_in).view(B, Nk, self.v_heads, self.v_dim).transpose(1, 2).contiguous()  # (B, v_heads, Nk, dv)
        if self.rope is not None and context is None:
            if positions is None:
                start = 0 if kv_cache is None else kv_cache.seq_len
                positions = torch.arange(start, start + N, device=x.device)
            q, k = self.rope(q, positions), self.rope(k, positions)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        masks = dict(attn_mask=attn_mask, key_padding_mask=key_padding_mask, causal=causal)
        out, maps = self.attend(x, q, k, v, masks, return_attn, backend or self.backend)
        out = out.transpose(1, 2).reshape(B, N, self.out_proj.in_features)  # (B, N, heads * width)
        out = self.proj_drop(self.out_proj(out))
        if return_attn:
            assert maps is not None  # every _attend returns maps when asked for them
            return out, maps
        return out

    def _dropout_p(self) -> float:
        return self.attn_drop if self.training else 0.0

    def _attend(
        self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, masks: dict, return_attn: bool, backend: str | None
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        raise NotImplementedError


class Attention(AttentionBase):
    """Standard multi-head softmax attention with grouped-query heads: the matched baseline.

    Args:
        dim: model width.
        num_heads: query heads.
        num_kv_heads: key/value heads (``num_heads`` by default; 1 = multi-query).
        head_dim: head width, default ``dim // num_heads``.
        kv_dim: width of ``context`` for cross-attention (default ``dim``).
        qkv_bias, proj_bias: biases of the q/k/v and output projections.
        causal: default causal flag of ``forward``.
        rope: a :class:`RotaryEmbedding`, True to build one, or None.
        attn_drop, proj_drop: dropout on the attention map / after the output projection.
        backend: default kernel backend (``None`` follows the global selection).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        kv_dim: int | None = None,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        causal: bool = False,
        rope: RopeArg = None,
        rope_base: float = 10000.0,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        backend: str | None = None,
    ) -> None:
        num_kv_heads, head_dim = resolve_heads(dim, num_heads, num_kv_heads, head_dim)
        super().__init__(
            dim, q_heads=num_heads, k_heads=num_kv_heads, v_heads=num_kv_heads, head_dim=head_dim, v_dim=head_dim,
            out_in=num_heads * head_dim, kv_dim=kv_dim, qkv_bias=qkv_bias, proj_bias=proj_bias, causal=causal,
            rope=rope, rope_base=rope_base, attn_drop=attn_drop, proj_drop=proj_drop, backend=backend,
        )
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads

    def _attend(self, x, q, k, v, masks, return_attn, backend):
        out = attention(q, k, v, dropout_p=self._dropout_p(), backend=backend, **masks)
        maps = {"attn": attention_maps(q, k, **masks)} if return_attn else None
        return out, maps
