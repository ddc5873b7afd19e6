"""Attention maps of any diffzoo model, and the paper's attention-noise scores over them.

Ye et al., "Differential Transformer", ICLR 2025 (arXiv 2410.05258), Section 3.4 / Table 3; the
definitions are those of docs/design.md, "Attention noise".

:func:`record_attention` makes every :class:`~diffzoo.layers.AttentionBase` module of a model compute
its attention maps during an ordinary ``model(...)`` call, without the model's ``forward`` knowing::

    with record_attention(model, batch=slice(0, 4)) as rec:
        logits = model(images)                      # unchanged output
    rec[0].attn1, rec[0].attn2, rec[0].diff          # (4, H, N, N) fp32 maps of the first layer

Scores over the recorded maps, for query tokens ``G`` and relevant ("answer") tokens ``A``:

* answer share ``mean_{i in G} sum_{j in A} a_ij / sum_j a_ij`` with ``a = attn1 - lam * attn2`` for
  differential layers (row sum ``1 - lam``) and the softmax map otherwise;
* entropy ``-sum_j p_ij log p_ij`` (nats) of ``p_ij = |a_ij| / sum_j |a_ij|``: for a softmax map the
  ordinary attention entropy, for a signed differential map the entropy of its normalised magnitude;
* negative share ``sum_j max(-a_ij, 0) / sum_j |a_ij|``: the fraction of a row's absolute mass that
  the differential map subtracts (0 for softmax maps).

Each is computed per sample and head, averaged over the query rows of ``G`` that have attention mass
(fully masked rows are skipped), then averaged over heads and layers. Modality helpers define ``G``
and ``A``: image patches covering the object, speech tokens with energy, the needles of a text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
from timm.layers import Attention as TimmAttention
from torch import Tensor, nn

from ..hosts.timm import register_attend_hook
from ..layers import Attention, AttentionBase, DiffAttention, DiffAttentionV2

__all__ = [
    "AttentionNoise",
    "AttentionRecord",
    "LayerAttention",
    "LayerSelection",
    "answer_share",
    "attention_entropy",
    "attention_layers",
    "attention_noise",
    "class_token_query",
    "effective_map",
    "image_relevant_tokens",
    "needle_relevance",
    "negative_share",
    "record_attention",
    "speech_relevance",
    "speech_relevant_tokens",
    "timm_attention_seam",
    "token_attention",
    "vit_relevance",
]

# Which attention layers to analyse: None (all), indices into the model's attention layers in depth
# order, module names (``"blocks.3.attn"``), or a predicate ``(name, module) -> bool``.
LayerSelection = None | Sequence[int | str] | Callable[[str, nn.Module], bool]
MapsLike = Union["AttentionRecord", Sequence["LayerAttention"], Sequence[dict], dict]


# -- timm's own attention (the softmax ViT baselines) -------------------------------------------
def _pass_on(module: nn.Module, inner: Callable, *args: Any) -> Any:
    return inner(*args)


@contextlib.contextmanager
def timm_attention_seam(model: nn.Module | Sequence[nn.Module]) -> Iterator[None]:
    """Make every timm ``Attention`` of ``model`` (or of a list of layers) attend through :mod:`diffzoo.kernels`
    while the context is open.

    Inside, such a layer runs timm's own ``forward``; its attention call goes through diffzoo's kernels (the
    ``sdpa`` backend makes timm's own ``F.scaled_dot_product_attention`` call), so backends such as
    :func:`~diffzoo.analysis.low_bit_attention` apply to it, and recorders see it through the attend hook
    (:func:`diffzoo.hosts.timm.register_attend_hook`). The layers are restored on exit.
    """
    layers = model.modules() if isinstance(model, nn.Module) else model
    handles = []
    try:
        for m in layers:
            if type(m) is TimmAttention:
                handles.append(register_attend_hook(m, _pass_on))
        yield
    finally:
        for h in reversed(handles):
            h.remove()


def _attention_dropout(module: nn.Module) -> float:
    p = module.attn_drop
    return p.p if isinstance(p, nn.Dropout) else float(p)


# -- finding and patching the attention layers --------------------------------------------------
def attention_layers(model: nn.Module, layers: LayerSelection = None) -> list[tuple[int, str, AttentionBase]]:
    """``(index, name, module)`` of the model's attention layers (``named_modules`` order = depth order).

    Attention layers are diffzoo's (:class:`~diffzoo.layers.AttentionBase`) and timm's own ``Attention``
    (the softmax ViT baselines, see :func:`timm_attention_seam`). ``index`` counts every attention
    layer of the model, also when ``layers`` selects only some.
    """
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, AttentionBase) or type(m) is TimmAttention]
    found = [(i, n, m) for i, (n, m) in enumerate(mods)]
    if not found:
        raise ValueError(
            f"{type(model).__name__} contains no attention layer diffzoo can record "
            "(diffzoo.layers.AttentionBase or timm.layers.Attention)"
        )
    if layers is None:
        return found
    if callable(layers):
        return [t for t in found if layers(t[1], t[2])]
    names = {t[1]: t for t in found}
    out = []
    for key in layers:
        if isinstance(key, str):
            if key not in names:
                raise ValueError(f"no attention layer named {key!r}; the model has {list(names)}")
            out.append(names[key])
        else:
            if not -len(found) <= int(key) < len(found):
                raise ValueError(f"attention layer index {key} out of range: the model has {len(found)} layers")
            out.append(found[int(key)])
    return sorted(set(out), key=lambda t: t[0])


@contextlib.contextmanager
def _wrap_attend(
    modules: Sequence[tuple[int, str, AttentionBase]], make: Callable[[int, str, AttentionBase, Callable], Callable]
) -> Iterator[None]:
    """Run ``make(index, name, module, inner)(x, q, k, v, masks, return_attn, backend)`` as each layer's attend
    step, through the public attend hook (:meth:`diffzoo.layers.AttentionBase.register_attend_hook`, for timm's
    ``Attention`` :func:`diffzoo.hosts.timm.register_attend_hook`); the hooks are removed on exit."""
    handles = []
    try:
        for index, name, module in modules:
            def hook(m: nn.Module, inner: Callable, *args: Any, _index: int = index, _name: str = name) -> Any:
                return make(_index, _name, m, inner)(*args)

            handles.append(register_attend_hook(module, hook))
        yield
    finally:
        for h in reversed(handles):
            h.remove()


def _layer_kind(module: nn.Module, maps: dict) -> str:
    if isinstance(module, DiffAttentionV2):
        return "diff_v2"
    if isinstance(module, DiffAttention):
        return "diff"
    if isinstance(module, Attention) or "attn" in maps:
        return "softmax"
    return "diff"


def _slice_masks(masks: dict, batch: slice, B: int) -> dict:
    out = dict(masks)
    if masks.get("key_padding_mask") is not None:
        out["key_padding_mask"] = masks["key_padding_mask"][batch]
    am = masks.get("attn_mask")
    if am is not None and am.dim() == 4 and am.shape[0] == B:
        out["attn_mask"] = am[batch]
    return out


# -- recorded maps --------------------------------------------------------------------------------
def effective_map(maps: dict[str, Tensor]) -> Tensor:
    """The map a layer applies to its values: ``attn`` (softmax) or ``attn1 - lambda * attn2``.

    ``lambda`` is a scalar (V1) or ``(B, H, Nq)`` per token and head (V2). Returns ``(B, H, Nq, Nk)``.
    """
    if "attn" in maps:
        return maps["attn"]
    lam = maps["lambda"].float()
    if lam.dim() > 0:
        lam = lam[..., None]  # (B, H, Nq, 1)
    return maps["attn1"] - lam * maps["attn2"]


@dataclass
class LayerAttention:
    """The maps of one call of one attention layer.

    Attributes:
        name: module name in the model (``"blocks.2.attn"``).
        index: position among the model's attention layers (depth order).
        kind: ``"softmax"``, ``"diff"`` (V1) or ``"diff_v2"``.
        maps: the layer's own dict: ``{"attn"}`` or ``{"attn1", "attn2", "lambda"}``, fp32, detached.
        call: 0 for the layer's first call inside the recorder, 1 for the next, ...
    """

    name: str
    index: int
    kind: str
    maps: dict[str, Tensor]
    call: int = 0

    @property
    def differential(self) -> bool:
        return "attn" not in self.maps

    @property
    def attn(self) -> Tensor:
        """Softmax layers: ``(B, H, Nq, Nk)``; differential layers: the combined map (see :attr:`diff`)."""
        return effective_map(self.maps)

    @property
    def attn1(self) -> Tensor:
        """First softmax map ``(B, H, Nq, Nk)`` of a differential layer."""
        return self.maps["attn1"]

    @property
    def attn2(self) -> Tensor:
        """Second (subtracted) softmax map ``(B, H, Nq, Nk)`` of a differential layer."""
        return self.maps["attn2"]

    @property
    def diff(self) -> Tensor:
        """``attn1 - lambda * attn2`` ``(B, H, Nq, Nk)``, the map multiplied with the values (computed on access)."""
        if not self.differential:
            raise AttributeError(f"{self.name} is a softmax layer; use .attn")
        return effective_map(self.maps)

    @property
    def lam(self) -> Tensor | None:
        """Scalar lambda (V1), ``(B, H, Nq)`` (V2) or None (softmax)."""
        return self.maps.get("lambda")

    def lambda_value(self) -> float:
        """Lambda as one number: V1's scalar, V2's mean over tokens and heads, NaN for softmax."""
        lam = self.lam
        return float("nan") if lam is None else float(lam.float().mean())


class AttentionRecord:
    """What :func:`record_attention` collected: one :class:`LayerAttention` per layer call, in call order.

    Index by position (``rec[0]``) or module name (``rec["blocks.0.attn"]``, its first call).
    """

    def __init__(self) -> None:
        self.layers: list[LayerAttention] = []

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[LayerAttention]:
        return iter(self.layers)

    def __getitem__(self, key: int | str) -> LayerAttention:
        if isinstance(key, str):
            for layer in self.layers:
                if layer.name == key:
                    return layer
            raise KeyError(f"no recorded layer {key!r}; recorded: {self.names}")
        return self.layers[key]

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def maps(self) -> list[dict[str, Tensor]]:
        """The layers' maps dicts in call order (what :func:`attention_noise` and the retrieval scores read)."""
        return [layer.maps for layer in self.layers]

    def lambdas(self) -> list[float]:
        """:meth:`LayerAttention.lambda_value` per recorded layer (NaN for softmax layers)."""
        return [layer.lambda_value() for layer in self.layers]

    def clear(self) -> None:
        self.layers.clear()


@contextlib.contextmanager
def record_attention(
    model: nn.Module,
    layers: LayerSelection = None,
    batch: None | int | slice = None,
    device: None | str | torch.device = None,
) -> Iterator[AttentionRecord]:
    """Record the attention maps of every (selected) attention layer while the model runs as usual.

    Each selected layer's output is computed exactly as without the recorder; its maps are then
    computed by the layer's own ``return_attn`` path under ``torch.no_grad()`` on the selected batch
    items only, so the peak memory per layer is ``len(batch) * H * Nq * Nk`` fp32 maps. With attention
    dropout in training mode the extra call runs under a forked RNG, so the model's random stream is
    unchanged. When the caller already asks a layer for ``return_attn``, those maps are reused.

    Args:
        model: any module containing :class:`~diffzoo.layers.AttentionBase` layers (or one itself).
        layers: which layers to record (see :data:`LayerSelection`); others run untouched.
        batch: keep only these batch items (an index or a slice) of every map.
        device: move the maps there (e.g. ``"cpu"``), default: where they are computed.

    Yields:
        an :class:`AttentionRecord`, filled as the model runs; one entry per layer call.
    """
    record = AttentionRecord()
    calls: dict[str, int] = {}
    if isinstance(batch, int):
        batch = slice(batch, batch + 1 if batch != -1 else None)

    def make(index: int, name: str, module: AttentionBase, inner: Callable) -> Callable:
        def _attend(x, q, k, v, masks, return_attn, backend):
            out, maps = inner(x, q, k, v, masks, return_attn, backend)
            if maps is not None:
                kept = {key: (t.detach()[batch] if batch is not None and t.dim() > 0 else t.detach()) for key, t in maps.items()}
            else:
                b = slice(None) if batch is None else batch
                fork = module.training and _attention_dropout(module) > 0
                devices = [q.device.index] if q.device.type == "cuda" else []
                with torch.no_grad(), torch.random.fork_rng(devices=devices, enabled=fork):
                    _, kept = inner(x[b], q[b], k[b], v[b], _slice_masks(masks, b, x.shape[0]), True, backend)
                kept = {key: t.detach() for key, t in kept.items()}
            if device is not None:
                kept = {key: t.to(device) for key, t in kept.items()}
            call = calls.get(name, 0)
            calls[name] = call + 1
            record.layers.append(LayerAttention(name, index, _layer_kind(module, kept), kept, call))
            return out, maps

        return _attend

    with _wrap_attend(attention_layers(model, layers), make):
        yield record


# -- scores -------------------------------------------------------------------------------------
def _as_layer_maps(layers: MapsLike) -> list[tuple[str, dict[str, Tensor]]]:
    if isinstance(layers, dict):
        layers = [layers]
    out = []
    for i, layer in enumerate(layers):
        if isinstance(layer, LayerAttention):
            out.append((layer.name, layer.maps))
        elif isinstance(layer, dict):
            out.append((f"layer{i}", layer))
        else:
            raise TypeError(f"expected LayerAttention or a maps dict, got {type(layer).__name__}")
    if not out:
        raise ValueError("no attention maps given")
    return out


def _token_mask(mask: Any, B: int, N: int, device: torch.device, what: str) -> Tensor:
    """bool ``(B, N)`` from a bool ``(B, N)`` / ``(N,)`` mask, an index or a list of indices."""
    if mask is None:
        return torch.ones(B, N, dtype=torch.bool, device=device)
    if isinstance(mask, int) or (isinstance(mask, Sequence) and not isinstance(mask, Tensor)):
        idx = [mask] if isinstance(mask, int) else list(mask)
        m = torch.zeros(N, dtype=torch.bool, device=device)
        m[torch.as_tensor(idx, dtype=torch.long, device=device)] = True
        mask = m
    mask = torch.as_tensor(mask, device=device)
    if mask.dtype != torch.bool:
        raise ValueError(f"{what} must be a bool mask, an index or a list of indices; got dtype {mask.dtype}")
    if mask.dim() == 1:
        mask = mask.expand(B, -1)
    if tuple(mask.shape) != (B, N):
        raise ValueError(f"{what} has shape {tuple(mask.shape)}; the maps need ({B}, {N}) or ({N},)")
    return mask


def _row_mean(values: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``values (B, H, Nq)`` over rows where ``valid`` holds; NaN where none does."""
    valid = valid.expand_as(values)
    total = torch.where(valid, values, torch.zeros_like(values)).sum(-1)
    return total / valid.sum(-1)


def answer_share(a: Tensor, query: Any, relevant: Any) -> Tensor:
    """``mean_{i in G} sum_{j in A} a_ij / sum_j a_ij`` per sample and head (docs/design.md, "Attention noise").

    Args:
        a: ``(B, H, Nq, Nk)`` map; for differential layers ``attn1 - lam * attn2`` (row sum ``1 - lam``).
        query: the query tokens ``G``: bool ``(B, Nq)`` / ``(Nq,)``, an index or a list of indices.
        relevant: the answer tokens ``A``: bool ``(B, Nk)`` / ``(Nk,)``, an index or a list.

    Returns:
        fp32 ``(B, H)``; rows of ``G`` without attention mass (fully masked) are left out of the mean.
    """
    B, H, Nq, Nk = a.shape
    a = a.float()
    q = _token_mask(query, B, Nq, a.device, "query")[:, None, :]
    rel = _token_mask(relevant, B, Nk, a.device, "relevant")[:, None, None, :]
    row = a.sum(-1)  # (B, H, Nq)
    valid = q & (a.abs().sum(-1) > 0)
    part = torch.where(rel, a, torch.zeros_like(a)).sum(-1)
    return _row_mean(part / torch.where(valid, row, torch.ones_like(row)), valid)


def attention_entropy(a: Tensor, query: Any = None) -> Tensor:
    """Entropy in nats of ``p_ij = |a_ij| / sum_j |a_ij|``, mean over query rows: fp32 ``(B, H)``.

    For a softmax map this is the usual attention entropy (at most ``log Nk``); for a signed
    differential map it is the entropy of its normalised magnitude.
    """
    B, H, Nq, Nk = a.shape
    m = a.float().abs()
    z = m.sum(-1, keepdim=True)
    p = m / z.clamp_min(torch.finfo(torch.float32).tiny)
    ent = -torch.xlogy(p, p).sum(-1)
    valid = _token_mask(query, B, Nq, a.device, "query")[:, None, :] & (z.squeeze(-1) > 0)
    return _row_mean(ent, valid)


def negative_share(a: Tensor, query: Any = None) -> Tensor:
    """``sum_j max(-a_ij, 0) / sum_j |a_ij|``, mean over query rows: fp32 ``(B, H)`` (0 for softmax maps)."""
    B, H, Nq, Nk = a.shape
    a = a.float()
    z = a.abs().sum(-1)
    neg = (-a).clamp_min(0).sum(-1) / z.clamp_min(torch.finfo(torch.float32).tiny)
    valid = _token_mask(query, B, Nq, a.device, "query")[:, None, :] & (z > 0)
    return _row_mean(neg, valid)


@dataclass
class AttentionNoise:
    """Scores of :func:`attention_noise`, each fp32 ``(L, B, H)`` (layers, samples, heads).

    Attributes:
        names: the layers' names.
        answer: answer share (None when no relevant tokens were given).
        entropy: entropy of the normalised absolute map (nats).
        negative: share of negative mass.
        lambdas: per layer lambda as one number (NaN for softmax).
    """

    names: list[str]
    answer: Tensor | None
    entropy: Tensor
    negative: Tensor
    lambdas: list[float]

    def per_layer(self) -> dict[str, list[float]]:
        """Every score per layer, averaged over samples and heads (NaN-aware)."""
        out = {"entropy": self.entropy, "negative": self.negative}
        if self.answer is not None:
            out["answer"] = self.answer
        return {k: v.flatten(1).nanmean(1).tolist() for k, v in out.items()}

    def summary(self) -> dict[str, float]:
        """Every score averaged over layers, samples and heads."""
        return {k: float(torch.tensor(v).nanmean()) for k, v in self.per_layer().items()}

    def per_sample(self, score: str = "answer") -> Tensor:
        """One score per sample ``(B,)``: the mean over heads, then over layers."""
        t = getattr(self, score)
        if t is None:
            raise ValueError("no relevant tokens were given, so there is no answer share")
        return t.nanmean(-1).mean(0)


def attention_noise(layers: MapsLike, query: Any = None, relevant: Any = None) -> AttentionNoise:
    """Answer share, entropy and negative share of every layer's effective map.

    Args:
        layers: an :class:`AttentionRecord`, a list of :class:`LayerAttention`, or a list of maps dicts
            as attention layers give them with ``return_attn=True`` (all must share ``B`` and ``Nq, Nk``).
        query: the query tokens ``G`` (see :func:`answer_share`); None = every token.
        relevant: the answer tokens ``A``; None skips the answer share.

    Returns:
        an :class:`AttentionNoise`. ``attention_noise(maps, G, A).per_sample()`` equals the first value
        of :func:`diffzoo.evaluation.retrieval.attention_scores` ``(maps, G, A, noise)`` (tested).
    """
    items = _as_layer_maps(layers)
    ans, ent, neg = [], [], []
    for _, maps in items:
        a = effective_map(maps)
        if relevant is not None:
            ans.append(answer_share(a, query, relevant))
        ent.append(attention_entropy(a, query))
        neg.append(negative_share(a, query))
    lambdas = [float("nan") if "lambda" not in m else float(m["lambda"].float().mean()) for _, m in items]
    return AttentionNoise(
        names=[n for n, _ in items], answer=torch.stack(ans) if ans else None, entropy=torch.stack(ent),
        negative=torch.stack(neg), lambdas=lambdas,
    )


def token_attention(
    layer: LayerAttention | dict, query: Any = 0, sample: int = 0, which: str = "effective",
    head: int | None = None,
) -> Tensor:
    """Attention of the query token(s) to every key, ``(Nk,)`` fp32: what the plots draw.

    Args:
        layer: a recorded layer or a maps dict.
        query: query token index, list or bool mask (mean over them).
        sample: batch item.
        which: ``"effective"`` (``attn`` / ``attn1 - lam attn2``), ``"attn1"`` or ``"attn2"``.
        head: one head, or None for the mean over heads.
    """
    maps = layer.maps if isinstance(layer, LayerAttention) else layer
    a = effective_map(maps) if which == "effective" else maps[which]
    a = a[sample].float()  # (H, Nq, Nk)
    a = a.mean(0) if head is None else a[head]
    q = _token_mask(query, 1, a.shape[0], a.device, "query")[0]
    return a[q].mean(0)


# -- modality helpers: which tokens are relevant ----------------------------------------------------
def class_token_query(batch_size: int, num_tokens: int, index: int = 0, device: Any = None) -> Tensor:
    """bool ``(B, N)`` with only the pooling (class) token ``index`` as the query."""
    q = torch.zeros(batch_size, num_tokens, dtype=torch.bool, device=device)
    q[:, index] = True
    return q


def image_relevant_tokens(
    images: Tensor, patch_size: int | Sequence[int], threshold: float = 0.5, num_prefix_tokens: int = 1,
    min_fraction: float = 0.0,
) -> Tensor:
    """Patches covering the object of an image on a dark background: bool ``(B, prefix + patches)``.

    A patch is relevant when the fraction of its pixels whose channel mean exceeds ``threshold`` is
    above ``min_fraction`` (default: any pixel). Patches are numbered row-major as timm's
    ``PatchEmbed`` flattens them; the prefix (class) tokens are never relevant.

    Args:
        images: ``(B, C, H, W)`` in the units of ``threshold`` (e.g. raw pixels in [0, 1]).
    """
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    x = images.float().mean(1)  # (B, H, W)
    B, H, W = x.shape
    if H % ph or W % pw:
        raise ValueError(f"image size {(H, W)} is not a multiple of the patch size {(ph, pw)}")
    frac = (x > threshold).float().reshape(B, H // ph, ph, W // pw, pw).mean((2, 4)).flatten(1)
    rel = frac > min_fraction
    return torch.cat([rel.new_zeros(B, num_prefix_tokens), rel], dim=1)


def vit_relevance(model: nn.Module, images: Tensor, threshold: float = 0.5, pixels: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(query, relevant)`` for a :class:`~diffzoo.models.VisionTransformer` (or any timm-like ViT).

    The query is the class token with ``global_pool="token"``, else every patch token; the relevant
    tokens are :func:`image_relevant_tokens` of ``pixels`` (default ``images``; pass the unnormalised
    images when the model input is normalised).
    """
    prefix = int(getattr(model, "num_prefix_tokens", 1))
    rel = image_relevant_tokens(images if pixels is None else pixels, model.patch_embed.patch_size, threshold, prefix)
    B, N = rel.shape
    if getattr(model, "global_pool", "token") == "token" and prefix > 0:
        query = class_token_query(B, N, device=rel.device)
    else:
        query = torch.ones(B, N, dtype=torch.bool, device=rel.device)
        query[:, :prefix] = False
    return query, rel.to(images.device)


@torch.no_grad()
def speech_relevant_tokens(
    model: nn.Module, wave: Tensor, lengths: Tensor | None = None, top_db: float = 30.0
) -> tuple[Tensor, Tensor]:
    """Tokens of a :class:`~diffzoo.models.SpeechTransformer` that carry speech energy.

    A spectrogram frame is speech when its mel power (the model's own ``MelSpectrogram``, fp32) lies
    within ``top_db`` decibels of the loudest valid frame of its clip; a token is relevant when any of
    its frames is speech and it is not padding. The framing (frames per token, token count, valid
    tokens) is the model's own (:meth:`SpeechTransformer.time_tokens`, ``valid_time_tokens``). Tokens are
    time-major (``T' x F'``) after the class token, as :meth:`SpeechTransformer.tokenize` orders them.

    Returns:
        ``(relevant, padding)``, each bool ``(B, 1 + N)`` (the class token: not relevant, not padding).
    """
    wave, lengths = model.frontend.prepare(wave, lengths)
    power = model.frontend.mel(wave.float()).sum(1)  # (B, frames)
    per_token = model.frames_per_token
    Tp = model.time_tokens(wave.shape[-1])
    frame_ok = torch.arange(power.shape[1], device=wave.device)[None] < model.frontend.num_frames(lengths)[:, None]
    db = 10 * torch.log10(power + 1e-10)
    peak = torch.where(frame_ok, db, torch.full_like(db, -torch.inf)).amax(1, keepdim=True)
    speech = (db >= peak - top_db) & frame_ok
    speech = speech[:, : Tp * per_token].reshape(-1, Tp, per_token).any(-1)  # (B, T')
    padded = torch.arange(Tp, device=wave.device)[None] >= model.valid_time_tokens(lengths)[:, None]
    Fp = model.cfg.freq_tokens
    rel = (speech & ~padded).repeat_interleave(Fp, 1)
    pad = padded.repeat_interleave(Fp, 1)
    false = rel.new_zeros(rel.shape[0], 1)
    return torch.cat([false, rel], 1), torch.cat([false, pad], 1)


def speech_relevance(
    model: nn.Module, wave: Tensor, lengths: Tensor | None = None, top_db: float = 30.0
) -> tuple[Tensor, Tensor]:
    """``(query, relevant)`` for a speech encoder: the class token queries when it pools
    (``global_pool="token"``), else every valid token; relevant = :func:`speech_relevant_tokens`."""
    rel, pad = speech_relevant_tokens(model, wave, lengths, top_db)
    if getattr(model, "global_pool", "token") == "token":
        query = class_token_query(*rel.shape, device=rel.device)
    else:
        query = ~pad
        query[:, 0] = False
    return query, rel


def needle_relevance(samples: Sequence[Any]) -> tuple[Tensor, Tensor, Tensor]:
    """``(query, answer, noise)`` bool ``(B, N)`` masks of needle-retrieval contexts.

    :func:`diffzoo.data.needles.needle_masks`, the masks :func:`diffzoo.evaluation.retrieval.evaluate_retrieval`
    scores: the queries are the positions that predict the answer tokens, the answer is the queried
    needle's value in the context, the noise the distractor text. ``samples`` are
    :class:`~diffzoo.data.needles.NeedleSample` of one length.
    """
    from ..data.needles import needle_masks  # diffzoo.data imports Lightning: only when needles are analysed

    return needle_masks(samples)
