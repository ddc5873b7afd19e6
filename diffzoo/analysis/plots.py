"""Figures of the attention-noise measurements (matplotlib, drawn off-screen with Agg).

Every function takes analysis results and an output path, writes one PNG and returns the path. Only
``matplotlib.figure.Figure`` is used (no pyplot), so no global backend state changes. Differential
maps are signed: they are drawn with a diverging colour map centred on 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from .maps import AttentionRecord, LayerAttention, token_attention
from .outliers import OutlierRecord

__all__ = [
    "plot_image_attention",
    "plot_lambda_by_depth",
    "plot_metric_vs_bits",
    "plot_outliers_by_layer",
    "plot_spectrogram_attention",
    "plot_text_attention",
]

PathLike = str | Path


def _figure(nrows: int, ncols: int, size: tuple[float, float], **kwargs: Any):
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as err:  # an optional dependency: fail at use time with a hint
        raise ModuleNotFoundError("diffzoo.analysis.plots needs matplotlib: pip install matplotlib") from err
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kwargs)
    return fig, axes


def _save(fig, path: PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    return path


def _branches(layer: LayerAttention) -> list[tuple[str, str]]:
    """``(label, which)`` of the maps to draw: both branches and their difference, or the softmax map."""
    if layer.differential:
        return [("attn1", "attn1"), ("attn2", "attn2"), ("attn1 - λ attn2", "effective")]
    return [("attn", "effective")]


def _np(x: Any) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float32)


def _signed_limits(w: np.ndarray, which: str, positive: str = "inferno") -> dict:
    """Colour map and limits: diverging around 0 for a signed map, ``positive`` from 0 otherwise."""
    if which == "effective" and (w < 0).any():
        v = float(np.abs(w).max()) or 1.0
        return dict(cmap="coolwarm", vmin=-v, vmax=v)
    return dict(cmap=positive, vmin=0.0, vmax=float(w.max()) or 1.0)


def plot_image_attention(
    image: Tensor, layer: LayerAttention, path: PathLike, *, sample: int = 0, query: Any = 0,
    num_prefix_tokens: int = 1, grid: tuple[int, int] | None = None, head: int | None = None,
    alpha: float = 0.6,
) -> Path:
    """The query's (class token's) attention over the patch grid, overlaid on the image.

    Panels: the image, then ``attn1``, ``attn2`` and ``attn1 - lam attn2`` (differential layers) or the
    softmax map, each mean over heads (or ``head``).

    Args:
        image: ``(C, H, W)`` (any range: it is min-max scaled for display).
        layer: a recorded layer; ``sample`` picks the batch item of its maps.
        query: query token(s) (the class token is 0).
        num_prefix_tokens: keys before the patches (class token), left out.
        grid: patch grid ``(rows, cols)``; default square.
    """
    img = _np(image)
    img = img.transpose(1, 2, 0) if img.ndim == 3 else img
    img = (img - img.min()) / max(float(img.max() - img.min()), 1e-12)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    H, W = img.shape[:2]
    panels = _branches(layer)
    fig, axes = _figure(1, 1 + len(panels), (2.6 * (1 + len(panels)), 2.8))
    axes[0, 0].imshow(img, cmap="gray" if img.ndim == 2 else None)
    axes[0, 0].set_title("image")
    for ax, (label, which) in zip(axes[0, 1:], panels):
        w = _np(token_attention(layer, query, sample, which, head))[num_prefix_tokens:]
        rows, cols = grid or (int(round(math.sqrt(w.size))),) * 2
        if rows * cols != w.size:
            raise ValueError(f"{w.size} patch tokens do not form a {rows}x{cols} grid; pass grid=")
        ax.imshow(img, cmap="gray" if img.ndim == 2 else None)
        im = ax.imshow(w.reshape(rows, cols), extent=(0, W, H, 0), alpha=alpha, interpolation="nearest",
                       **_signed_limits(w, which))
        fig.colorbar(im, ax=ax, shrink=0.8)
        ax.set_title(label)
    for ax in axes[0]:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{layer.name}: attention of query {query}")
    return _save(fig, path)


def plot_spectrogram_attention(
    spec: Tensor, layer: LayerAttention, path: PathLike, *, sample: int = 0, query: Any = 0,
    patch_time: int = 1, freq_tokens: int = 1, num_prefix_tokens: int = 1, head: int | None = None,
) -> Path:
    """The log-mel spectrogram with the query's attention per time frame under it.

    Tokens are time-major (``T' x F'``, as :class:`~diffzoo.models.SpeechTransformer`); the attention of
    the ``freq_tokens`` tokens of one time step is summed, and each time token spans ``patch_time``
    frames on the shared frame axis.

    Args:
        spec: ``(n_mels, frames)`` log-mel (e.g. ``model.frontend(wave)[0][i]``).
        layer: a recorded layer of the speech encoder.
    """
    s = _np(spec)
    fig, axes = _figure(2, 1, (7.0, 4.5), sharex=True, gridspec_kw=dict(height_ratios=(2, 1)))
    axes[0, 0].imshow(s, origin="lower", aspect="auto", cmap="magma", extent=(0, s.shape[1], 0, s.shape[0]))
    axes[0, 0].set_ylabel("mel band")
    ax = axes[1, 0]
    for label, which in _branches(layer):
        w = _np(token_attention(layer, query, sample, which, head))[num_prefix_tokens:]
        w = w.reshape(-1, freq_tokens).sum(1)  # (T',)
        edges = np.arange(len(w) + 1) * patch_time
        ax.stairs(w, edges, label=label)
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("frame")
    ax.set_ylabel("attention")
    ax.legend(fontsize=7)
    fig.suptitle(f"{layer.name}: attention of query {query} over time")
    return _save(fig, path)


def _token_labels(tokens: str | bytes | Sequence[Any] | Tensor) -> list[str]:
    if isinstance(tokens, str):
        tokens = list(tokens)
    elif isinstance(tokens, (bytes, Tensor)):
        tokens = [int(t) for t in tokens]
    out = []
    for t in tokens:
        ch = chr(t) if isinstance(t, int) else str(t)
        out.append(ch if ch.isprintable() and ch != " " else {" ": "␣", "\n": "⏎"}.get(ch, "·"))
    return out


def plot_text_attention(
    tokens: str | bytes | Sequence[Any] | Tensor, weights: Tensor | Mapping[str, Tensor], path: PathLike,
    *, width: int = 64, title: str | None = None,
) -> Path:
    """Tokens coloured by attention: each character (byte) in a cell, wrapped every ``width`` tokens.

    Args:
        tokens: a string, bytes, byte ids or token strings, ``N`` of them.
        weights: ``(N,)`` attention per token, or ``{label: (N,)}`` for several strips (e.g. both branches).
    """
    labels = _token_labels(tokens)
    named = {"attention": weights} if isinstance(weights, (Tensor, np.ndarray)) else dict(weights)
    N, rows = len(labels), math.ceil(len(labels) / width)
    fig, axes = _figure(len(named), 1, (min(0.16 * width, 14.0) + 1.0, 0.3 * rows * len(named) + 0.8))
    for ax, (label, w) in zip(axes[:, 0], named.items()):
        w = _np(w).reshape(-1)
        if w.size != N:
            raise ValueError(f"{label}: {w.size} weights for {N} tokens")
        grid = np.full(rows * width, np.nan)
        grid[:N] = w
        limits = _signed_limits(w, "effective", positive="Oranges")  # light: black letters stay legible
        im = ax.imshow(grid.reshape(rows, width), aspect="auto", interpolation="nearest", **limits)
        for i, ch in enumerate(labels):
            ax.text(i % width, i // width, ch, ha="center", va="center", fontsize=6, family="monospace")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(label, fontsize=7)
        fig.colorbar(im, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_lambda_by_depth(models: Mapping[str, AttentionRecord | Sequence[float]], path: PathLike) -> Path:
    """Lambda of every layer against depth, one line per model (softmax layers, NaN, are skipped).

    Args:
        models: ``{label: AttentionRecord or per-layer lambdas}``.
    """
    fig, axes = _figure(1, 1, (5.0, 3.5))
    ax = axes[0, 0]
    for label, lams in models.items():
        y = np.asarray(lams.lambdas() if isinstance(lams, AttentionRecord) else list(lams), dtype=float)
        ax.plot(np.arange(len(y)), y, marker="o", label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel("λ")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_outliers_by_layer(records: Mapping[str, OutlierRecord], path: PathLike) -> Path:
    """Top-1 / median (solid) and top-k mean / median (dashed) by layer, logits and hidden states.

    Args:
        records: ``{label: OutlierRecord}``, e.g. ``{"diff": ..., "softmax": ...}``.
    """
    fig, axes = _figure(1, 2, (9.0, 3.5))
    for ax, kind in zip(axes[0], ("logits", "hidden")):
        for i, (label, rec) in enumerate(records.items()):
            colour = f"C{i}"
            for stat, style in (("top1_ratio", "-"), ("topk_ratio", "--")):
                y = rec.table(kind, stat)
                if y:
                    ax.plot(np.arange(len(y)), y, style, color=colour, marker="o",
                            label=f"{label} {stat.split('_')[0]}")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel("magnitude / median")
        ax.set_title("attention logits" if kind == "logits" else "hidden states")
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_metric_vs_bits(
    results: Mapping[str, Mapping[int | None, float]], path: PathLike, metric: str = "metric"
) -> Path:
    """The task metric against the attention-logit bit width, one line per model.

    Args:
        results: ``{label: metric_vs_bits(...)}``; the key ``None`` is drawn as "fp32".
    """
    keys = sorted({b for r in results.values() for b in r}, key=lambda b: -math.inf if b is None else -b)
    names = ["fp32" if b is None else f"{b}-bit" for b in keys]
    fig, axes = _figure(1, 1, (5.0, 3.5))
    ax = axes[0, 0]
    for label, r in results.items():
        ax.plot([names[keys.index(b)] for b in keys if b in r], [float(r[b]) for b in keys if b in r],
                marker="o", label=label)
    ax.set_xlabel("attention logits")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    return _save(fig, path)

