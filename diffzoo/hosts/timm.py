"""diffzoo's attention inside timm: the adapters timm's ``VisionTransformer`` takes as ``attn_layer=``.

:class:`TimmDiffAttention` is :class:`diffzoo.layers.DiffAttention` (V1) behind timm's attention constructor
and ``forward(x, attn_mask=None, is_causal=False)``; :class:`TimmDiffAttentionV2` does the same for
:class:`diffzoo.layers.DiffAttentionV2`. :func:`attention_layer` picks the class for an attention spec (timm's
own ``Attention`` for softmax) and :func:`building_model` is the construction context in which
:func:`diffzoo.models.vit.vision_transformer` hands every layer the model's spec and its block index.
:func:`register_attend_hook` gives timm's own ``Attention`` (the softmax ViT baselines) the attend hook of
diffzoo's layers (:meth:`diffzoo.layers.AttentionBase.register_attend_hook`) without copying its ``forward``.
Everything
diffzoo knows about timm's attention API lives here; the registered ``diffvit_*`` / ``softvit_*`` models are in
:mod:`diffzoo.models.vit`.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import Attention as TimmAttention
from timm.layers import register_notrace_module
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from ..kernels import attention, attention_maps
from ..layers import DiffAttention, DiffAttentionV2, combine_v1, combine_v2, diff_heads_for_baseline
from ..layers.attention import AttendHook, AttentionBase
from ..layers.spec import AttnSpec, get_spec

__all__ = [
    "TimmDiffAttention",
    "TimmDiffAttentionV2",
    "attention_layer",
    "building_model",
    "diff_head_layout",
    "register_attend_hook",
]


def _refuse_timm_only_options(qk_norm: bool, scale_norm: bool) -> None:
    if qk_norm or scale_norm:
        name = "qk_norm" if qk_norm else "scale_attn_norm"
        raise ValueError(
            f"{name}=True is a timm Attention option that diffzoo's differential attention does not implement; "
            "leave it False (differential V1 already normalises each head's output)"
        )


def diff_head_layout(dim: int, num_heads: int) -> tuple[int, int, int]:
    """Differential V1 ``(heads, kv_heads, head_dim)`` for a softmax baseline of ``num_heads`` heads.

    An even count ``2H`` gives ``H`` heads of the baseline's width; an odd count keeps its heads at half
    width (``dim // (2 * num_heads)``). Either way the projections have the baseline's shapes.
    """
    return diff_heads_for_baseline(dim, num_heads, head_dim=None if num_heads % 2 == 0 else dim // (2 * num_heads))


@dataclass
class _Building:
    """The attention spec and backend of the model :func:`diffzoo.models.vit.vision_transformer` is building; timm builds the blocks in
    order, so the n-th layer constructed is block n's."""

    spec: AttnSpec
    backend: str | None
    built: int = 0


_BUILDING = threading.local()


@contextmanager
def building_model(spec: AttnSpec, backend: str | None) -> Iterator[None]:
    """While timm builds a model in this context, every :class:`TimmDiffAttention` / :class:`TimmDiffAttentionV2`
    it constructs takes ``spec``'s lambda rule and sub-norm, ``backend``, and its block index by build order."""
    outer = getattr(_BUILDING, "model", None)
    _BUILDING.model = _Building(spec, backend)
    try:
        yield
    finally:
        _BUILDING.model = outer


class _TimmForward:
    """timm's attention ``forward(x, attn_mask=None, is_causal=False)`` over a diffzoo attention layer.

    Eager calls, ``torch.compile``, ``torch.export`` and ``torch.fx.symbolic_trace`` go through
    :meth:`diffzoo.layers.AttentionBase.forward`, i.e. diffzoo's kernel backends (recorded as single calls
    in a traced graph) and the attend hook (``register_attend_hook``) of :mod:`diffzoo.analysis`. TorchScript
    cannot follow the backend selection (Python control flow at call time), so a scripted ViT runs
    :meth:`_forward_graph`:
    the same math from ``F.scaled_dot_product_attention`` calls, equal to the eager result up to
    floating-point rounding. (diffzoo's own layers refuse ``torch.jit.script``; these timm adapters
    script because timm's ViT API promises it.)

    ``attn_mask`` follows timm: bool (True = attend) or additive float, broadcastable to
    ``(B, heads, N, N)``; give masks a head dimension of 1, since the differential layer has fewer
    heads than the baseline's ``num_heads``.
    """

    __jit_unused_properties__ = ["proj"]

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        depth: int = 0,
        lambda_init: float | None = None,
        backend: str | None = None,
        sub_norm: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        _refuse_timm_only_options(qk_norm, scale_norm)
        building = getattr(_BUILDING, "model", None)
        if building is not None:  # inside vision_transformer: the model's spec, the block index by build order
            spec, depth = building.spec, building.built
            building.built += 1
            backend = building.backend if backend is None else backend
        else:
            spec = AttnSpec(self._kind, self._kind, lambda_init=lambda_init, sub_norm=sub_norm)
        self._init_layer(
            dim, num_heads, depth, spec, qkv_bias=qkv_bias, proj_bias=proj_bias, attn_drop=attn_drop,
            proj_drop=proj_drop, backend=backend,
        )
        self.baseline_heads = num_heads
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    @property
    def proj(self) -> nn.Linear:
        """timm's name of the output projection (``VisionTransformer(fix_init=True)`` rescales it)."""
        return self.out_proj

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """``x (B, N, dim)`` -> ``(B, N, dim)``."""
        if torch.jit.is_scripting():
            return self._forward_graph(x, attn_mask, is_causal)
        return self._forward_kernels(x, attn_mask, is_causal)

    @torch.jit.unused
    def __prepare_scriptable__(self) -> nn.Module:
        return self  # scripted through _forward_graph (see the class docstring)

    @torch.jit.unused
    def _forward_kernels(self, x: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        return AttentionBase.forward(self, x, attn_mask=attn_mask, causal=is_causal)

    def reset_parameters(self) -> None:
        """Re-draw the parameters that are not in a child ``nn.Linear`` (timm's ``init_weights`` calls
        this after it initialised the projections)."""
        self._reset_extra()


class TimmDiffAttention(_TimmForward, DiffAttention):
    """:class:`diffzoo.layers.DiffAttention` (V1) with timm's attention constructor, for ``attn_layer=``.

    Args:
        dim: model width.
        num_heads: heads of the softmax baseline (converted as described in the module docstring).
        qkv_bias, proj_bias, attn_drop, proj_drop: as timm's ``Attention``.
        qk_norm, scale_norm: must be False (timm options diffzoo's attention does not have).
        norm_layer: accepted for timm's signature; unused.
        depth: 0-based block index; sets ``lambda_init`` by the paper's schedule unless
            ``lambda_init`` is given.
        lambda_init: constant ``lambda_init`` (DiffCLIP: 0.8).
        backend: diffzoo kernel backend of this layer (None follows :mod:`diffzoo.kernels`).
        sub_norm: the per-head RMSNorm and ``(1 - lambda_init)`` scale (False: the ``diff_nonorm`` ablation).

    Built by :func:`vision_transformer` (timm's ``Block`` passes no depth to a non-timm layer), a layer
    takes ``lambda_init``, ``sub_norm`` and the backend from the model's attention spec and its depth from
    the order timm builds the blocks in, all during construction.
    """

    _kind = "diff"

    def _init_layer(self, dim: int, num_heads: int, depth: int, spec: AttnSpec, **kwargs: Any) -> None:
        heads, kv_heads, head_dim = diff_head_layout(dim, num_heads)
        DiffAttention.__init__(self, dim, heads, kv_heads, head_dim, lambda_init=spec.lambda_init_at(depth),
                               depth=depth, sub_norm=spec.sub_norm, **kwargs)

    def _reset_extra(self) -> None:
        self.reset_lambda()
        if self.use_sub_norm:
            nn.init.ones_(self.sub_norm.weight)

    def _forward_graph(self, x: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        B, N, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(B, N, 2 * H, d).transpose(1, 2)  # heads (2i, 2i+1) = (q1, q2) of head i
        k = self.k_proj(x).view(B, N, 2 * H, d).transpose(1, 2)
        v = self.v_proj(x).view(B, N, H, 2 * d).transpose(1, 2).repeat_interleave(2, dim=1)  # (B, 2H, N, 2d)
        p = self.attn_drop if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
        o = self.head_norm(combine_v1(a, self.lambda_full().to(a.dtype)))  # (B, H, N, 2d)
        return self.proj_drop(self.out_proj(o.transpose(1, 2).reshape(B, N, H * 2 * d)))


class TimmDiffAttentionV2(_TimmForward, DiffAttentionV2):
    """:class:`diffzoo.layers.DiffAttentionV2` with timm's attention constructor, for ``attn_layer=``.

    ``num_heads`` (the baseline's) is V2's output head count; ``2 * num_heads`` query heads are
    computed. Arguments as :class:`TimmDiffAttention`; ``depth`` is unused, ``lambda_init`` must
    stay None (V2 predicts lambda per token) and ``sub_norm`` True (V2 has none).
    """

    _kind = "diff_v2"

    def _init_layer(self, dim: int, num_heads: int, depth: int, spec: AttnSpec, **kwargs: Any) -> None:
        DiffAttentionV2.__init__(self, dim, num_heads, **kwargs)

    def _reset_extra(self) -> None:
        pass  # lambda_proj is an nn.Linear: timm's init covers it

    def _forward_graph(self, x: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        B, N, _ = x.shape
        H, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(B, N, 2 * H, d).transpose(1, 2)  # query pairs (2i, 2i+1) share kv head i
        k = self.k_proj(x).view(B, N, H, d).transpose(1, 2).repeat_interleave(2, dim=1)
        v = self.v_proj(x).view(B, N, H, d).transpose(1, 2).repeat_interleave(2, dim=1)
        p = self.attn_drop if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
        o = combine_v2(a, self.token_lambda(x))  # (B, H, N, d)
        return self.proj_drop(self.out_proj(o.transpose(1, 2).reshape(B, N, H * d)))


# timm's FX tools keep these layers whole, so traced models call the eager kernels (identical outputs).
register_notrace_module(TimmDiffAttention)
register_notrace_module(TimmDiffAttentionV2)

_ATTN_LAYERS: dict[str, type[nn.Module]] = {
    "diff": TimmDiffAttention, "diff_v2": TimmDiffAttentionV2, "softmax": TimmAttention,
}


def attention_layer(attn: str | AttnSpec) -> type[nn.Module]:
    """The ``attn_layer`` class for timm's ViT of the attention spec ``attn``: diffzoo's adapter for the differential
    kinds, timm's own ``Attention`` for softmax."""
    return _ATTN_LAYERS[get_spec(attn).kind]


# -- the attend hook on timm's own Attention ---------------------------------------------------------
_HOOKS = "_diffzoo_attend_hooks"  # instance attribute of a hooked timm Attention: {id: hook}
_SDPA_ARGS = ("attn_mask", "dropout_p", "is_causal", "scale")


def _timm_attend(module: nn.Module, dropout_p: float, scale: float | None, x: Tensor, q: Tensor, k: Tensor,
                 v: Tensor, masks: dict, return_attn: bool, backend: str | None) -> tuple[Tensor, dict | None]:
    """The softmax attention timm's layer asked ``F.scaled_dot_product_attention`` for, through diffzoo's kernels
    (the ``sdpa`` backend makes the same call)."""
    out = attention(q, k, v, dropout_p=dropout_p, scale=scale, backend=backend, **masks)
    return out, ({"attn": attention_maps(q, k, scale=scale, **masks)} if return_attn else None)


class _AttendInstead(TorchFunctionMode):
    """While a hooked timm ``Attention`` runs its own ``forward``, its ``F.scaled_dot_product_attention`` call
    becomes the attend step with the layer's hooks around it; every other call runs unchanged."""

    def __init__(self, module: nn.Module, x: Tensor) -> None:
        super().__init__()
        self.module, self.x, self.calls = module, x, 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v, *rest = args
        call = {**dict(zip(_SDPA_ARGS, rest)), **kwargs}
        scale = call.get("scale")
        masks = dict(attn_mask=call.get("attn_mask"), key_padding_mask=None, causal=bool(call.get("is_causal", False)))
        step: Callable[..., tuple[Tensor, dict | None]] = functools.partial(
            _timm_attend, self.module, float(call.get("dropout_p", 0.0)),
            self.module.scale if scale is None else scale)
        for hook in list(self.module.__dict__[_HOOKS].values()):
            step = functools.partial(hook, self.module, step)
        self.calls += 1
        return step(self.x, q, k, v, masks, False, None)[0]


def _install(module: nn.Module) -> None:
    """Route ``module``'s attention call through its hooks: module hooks around ``forward`` hold the mode."""
    modes: list[_AttendInstead] = []

    def enter(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        mode = _AttendInstead(mod, args[0] if args else kwargs["x"])
        mode.__enter__()
        modes.append(mode)

    def leave(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        mode = modes.pop()
        mode.__exit__(None, None, None)
        if mode.calls == 0 and output is not None:
            raise RuntimeError(
                f"{type(mod).__name__}.forward made no F.scaled_dot_product_attention call, so diffzoo's attend "
                "hook cannot see its attention (timm's Attention with fused_attn=True makes one)"
            )

    module.__dict__["_diffzoo_timm_state"] = (
        module.fused_attn,
        module.register_forward_pre_hook(enter, with_kwargs=True),
        module.register_forward_hook(leave, with_kwargs=True, always_call=True),
    )
    module.fused_attn = True  # timm's public switch: attend with one F.scaled_dot_product_attention call


def _uninstall(module: nn.Module) -> None:
    fused, pre, post = module.__dict__.pop("_diffzoo_timm_state")
    pre.remove()
    post.remove()
    module.fused_attn = fused
    module.__dict__.pop(_HOOKS, None)


class _TimmHandle(RemovableHandle):
    """Removes one attend hook of a timm ``Attention``; the last one removed restores the layer."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module.__dict__[_HOOKS])
        self._module = module

    def remove(self) -> None:
        super().remove()
        hooks = self._module.__dict__.get(_HOOKS)
        if hooks is not None and not hooks:
            _uninstall(self._module)


def register_attend_hook(module: nn.Module, hook: AttendHook) -> RemovableHandle:
    """:meth:`diffzoo.layers.AttentionBase.register_attend_hook` for a diffzoo layer, and the same hook for timm's
    own ``Attention``: its ``forward`` runs as timm wrote it, and its ``F.scaled_dot_product_attention`` call
    becomes the attend step (``inner`` attends through :mod:`diffzoo.kernels`, whose ``sdpa`` backend makes the
    same call; ``return_attn=True`` also gives ``{"attn"}``). While a timm layer holds a hook its ``fused_attn``
    is True; removing the last hook restores it. A timm ``forward`` that makes no such call raises instead of
    running unobserved.
    """
    if isinstance(module, AttentionBase):
        return module.register_attend_hook(hook)
    if type(module) is not TimmAttention:
        raise TypeError(f"{type(module).__name__} is neither a diffzoo attention layer nor timm's Attention")
    if _HOOKS not in module.__dict__:
        module.__dict__[_HOOKS] = OrderedDict()  # RemovableHandle holds a weakref
        _install(module)
    handle = _TimmHandle(module)
    module.__dict__[_HOOKS][handle.id] = hook
    return handle
