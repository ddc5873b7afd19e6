"""The analysis half of ``python -m recipes.compare --analysis``: diffzoo.analysis on every trained model.

For each family, each collected seed, the differential model and its softmax baseline are loaded from
their exported weights and measured on the family's own held-out data (docs/design.md, "Attention noise"
and the sections after it):

* **attention noise**: the share of attention the query puts on the task's relevant tokens (ViT: class
  token -> patches covering the digit; CLIP image tower: the same on the coloured digits; speech: class
  token -> tokens with speech energy; LM: the answer position -> the needle's value tokens), the entropy
  of the (absolute, row-normalised) map and the share of negative mass, averaged over layers and heads;
* **lambda by depth** of the differential models;
* **activation outliers**: top-1 and mean top-10 magnitudes of the attention logits and of each block's
  output against their median, the largest ratio over the layers;
* **low-bit attention**: the task metric with the attention logits absmax-quantised per head to 8, 6
  and 4 bits (and unquantised on the same backend).

Plots from seed 0 go to the plots folder (``analysis_*.png``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

BITS = (None, 8, 6, 4)
PROBE = 64  # samples whose attention maps and outliers are measured


@dataclass
class Probe:
    """One trained model and the functions that measure it."""

    model: nn.Module
    evaluate: Callable[[], float]  # the task metric on the held-out set (same scale as the table)
    call: Callable[[], Any]  # one forward pass over the probe batch
    relevance: tuple[Tensor, Tensor]  # (query, relevant) bool masks (B, N) of the probe batch
    plot: Callable[[Any, Path], None]  # (AttentionRecord, path) -> draws the modality's attention plot
    metric: str
    call_kwargs: dict | None = None


def _top1(logits: Tensor, y: Tensor) -> int:
    return int((logits.argmax(-1) == y).sum())


# -- families -------------------------------------------------------------------------------------
def _vit_probe(run: dict) -> Probe:
    from diffzoo.analysis.maps import vit_relevance
    from diffzoo.analysis.plots import plot_image_attention
    from diffzoo.data import DigitsDataModule
    from diffzoo.data.embedded import MNIST_MEAN, MNIST_STD
    from diffzoo.tasks.export import load_exported

    model = load_exported(run["summary"]["safetensors"]).eval()
    dm = DigitsDataModule(num_val=1000, batch_size=250)
    dm.setup()
    x, y = dm.val_set.tensors

    @torch.no_grad()
    def evaluate() -> float:
        return 100 * sum(_top1(model(x[i:i + 250]), y[i:i + 250]) for i in range(0, len(x), 250)) / len(x)

    xp = x[:PROBE]
    pixels = xp * MNIST_STD + MNIST_MEAN

    def plot(record: Any, path: Path) -> None:
        plot_image_attention(pixels[0], record[len(record) - 1], path)

    return Probe(model, evaluate, lambda: model(xp), vit_relevance(model, xp, 0.5, pixels=pixels), plot, "val top-1 %")


def _speech_probe(run: dict) -> Probe:
    from diffzoo.analysis.maps import speech_relevance
    from diffzoo.analysis.plots import plot_spectrogram_attention
    from diffzoo.data.speech import SynthKeywordsDataModule, collate_audio
    from diffzoo.tasks.export import load_exported

    model = load_exported(run["summary"]["safetensors"]).eval()
    dm = SynthKeywordsDataModule(
        num_classes=12, clips_per_word=[120, 30, 30], silence_clips=[120, 30, 30], snr_db=[0.0, 20.0],
        batch_size=120, seed=0, split_seed=0, cache_dir="data/cache/speech_synth",
    )
    dm.setup("test")
    batches = list(dm.test_dataloader())

    @torch.no_grad()
    def evaluate() -> float:
        n = sum(len(y) for _, y, _ in batches)
        return 100 * sum(_top1(model(w, lengths), y) for w, y, lengths in batches) / n

    # A probe batch of clips with every label, in test-set order (collate again: batches hold 120).
    items = [dm.test_set[i] for i in range(0, len(dm.test_set), max(1, len(dm.test_set) // PROBE))][:PROBE]
    wave, _, lengths = collate_audio(items)
    cfg = model.cfg

    def plot(record: Any, path: Path) -> None:
        with torch.no_grad():
            spec = model.frontend(wave[:1], lengths[:1])[0][0]  # (n_mels, frames)
        plot_spectrogram_attention(
            spec, record[len(record) - 1], path, patch_time=model.frames_per_token, freq_tokens=cfg.freq_tokens)

    return Probe(model, evaluate, lambda: model(wave, lengths), speech_relevance(model, wave, lengths), plot,
                 "test top-1 %")


def _lm_probe(run: dict) -> Probe:
    import numpy as np

    from diffzoo.analysis.maps import needle_relevance, token_attention
    from diffzoo.analysis.plots import plot_text_attention
    from diffzoo.data.needles import make_needle_sample
    from diffzoo.data.text import TextDataModule, get_tokenizer, load_tokens
    from diffzoo.tasks.lm import load_lm

    model = load_lm(run["summary"]["safetensors"]).eval()
    dm = TextDataModule(seq_len=256, val_windows=64, val_fraction=0.1)
    dm.setup()
    windows = torch.stack([torch.as_tensor(dm.val_set[i][0]) for i in range(len(dm.val_set))])
    targets = torch.stack([torch.as_tensor(dm.val_set[i][1]) for i in range(len(dm.val_set))])

    @torch.no_grad()
    def evaluate() -> float:
        total = 0.0
        for i in range(0, len(windows), 16):
            logits = model(windows[i:i + 16])
            total += float(nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), targets[i:i + 16].flatten(), reduction="sum"))
        return total / targets.numel()

    tokens = load_tokens(dm.token_path)
    held_out = tokens[int(len(tokens) * 0.9):]
    rng = np.random.default_rng(0)
    tok = get_tokenizer("byte")
    samples = [make_needle_sample(held_out, tok, 256, 2, float(d), rng) for d in np.linspace(0, 1, 16)]
    ids = torch.stack([s.tokens for s in samples])
    query, answer, _ = needle_relevance(samples)

    def plot(record: Any, path: Path) -> None:
        layer = record[len(record) - 1]
        q = int(query[0].nonzero()[0])
        text = bytes(int(t) for t in ids[0].tolist()).decode("latin-1")
        strips = ({"attn1": token_attention(layer, q, which="attn1"), "attn2": token_attention(layer, q, which="attn2"),
                   "attn1 - lam attn2": token_attention(layer, q)} if layer.differential
                  else {"softmax": token_attention(layer, q)})
        plot_text_attention(text, strips, path, title=f"{run['attn']}: attention of the answer position")

    return Probe(model, evaluate, lambda: model(ids), (query, answer), plot, "val loss")


def _clip_probe(run: dict) -> Probe:
    from diffzoo.analysis.maps import vit_relevance
    from diffzoo.analysis.plots import plot_image_attention
    from diffzoo.data.image_text import ColoredDigitsDataModule
    from diffzoo.tasks.zeroshot import load_clip, zero_shot_accuracy, zero_shot_classifier

    name = run["model"]
    model, _, tokenizer = load_clip(name, checkpoint=run["summary"]["safetensors"])
    dm = ColoredDigitsDataModule(model=name, batch_size=250)
    dm.setup()
    loader = dm.val_dataloader()[1]  # held-out colour pairs, (images, labels)

    @torch.no_grad()
    def evaluate() -> float:  # the text classifier is rebuilt, so quantisation reaches both towers
        classifier = zero_shot_classifier(model, tokenizer, dm.zeroshot_classnames, dm.zeroshot_templates)
        return 100 * zero_shot_accuracy(model, classifier, loader)["top1"]

    x = torch.stack([dm.test_set[i][0] for i in range(PROBE)])
    # The digit's pixels are those whose colour differs from the background (the corner pixel).
    dist = (x - x[..., :1, :1]).abs().amax(1, keepdim=True)
    pixels = dist / dist.flatten(1).amax(1).clamp_min(1e-6)[:, None, None, None]
    trunk = model.visual.trunk

    def plot(record: Any, path: Path) -> None:
        plot_image_attention(x[0] * 0.5 + 0.5, record[len(record) - 1], path)

    return Probe(model, evaluate, lambda: model.encode_image(x), vit_relevance(trunk, x, 0.5, pixels=pixels), plot,
                 "held-out zero-shot top-1 %")


PROBES: dict[str, Callable[[dict], Probe]] = {
    "vit": _vit_probe, "clip": _clip_probe, "speech": _speech_probe, "lm": _lm_probe,
}


# -- measurement ----------------------------------------------------------------------------------
def measure(probe: Probe, bits: tuple = BITS) -> tuple[dict, Any, Any]:
    """Attention noise, lambda, outliers and metric vs bits of one model; also the records (for plots)."""
    from diffzoo.analysis import attention_noise, metric_vs_bits, record_attention, record_outliers

    with torch.no_grad(), record_attention(probe.model) as rec, record_outliers(probe.model) as out:
        probe.call()  # one pass feeds both recorders
    query, relevant = probe.relevance
    noise = attention_noise(rec, query, relevant).summary()
    result = dict(
        lambdas=rec.lambdas() if any(layer.differential for layer in rec) else [],
        noise=noise,
        outliers={
            kind: {stat: max(out.table(kind, stat)) for stat in ("top1_ratio", "topk_ratio")}
            for kind in ("logits", "hidden")
        },
        bits={str(b): v for b, v in metric_vs_bits(probe.evaluate, bits, model=probe.model).items()},
    )
    return result, rec, out


def analyse(families: list, load_runs: Callable, seeds: list[int] | None, plots: Path) -> dict:
    """Measure every (family, model, seed); returns ``{family: {"diff"/"softmax": [per-seed results]}}``."""
    from diffzoo.analysis.plots import plot_lambda_by_depth, plot_metric_vs_bits, plot_outliers_by_layer

    plots.mkdir(parents=True, exist_ok=True)
    out: dict = {}
    lambdas: dict[str, list[float]] = {}
    for fam in families:
        if fam.name not in PROBES:
            print(f"[analysis] no probe for {fam.name}; skipped")
            continue
        runs = load_runs(fam)
        res: dict = {"metric": None, "diff": [], "softmax": []}
        first: dict = {}
        for kind, name in (("diff", fam.diff), ("softmax", fam.soft)):
            for run in sorted((r for r in runs if r[fam.run_key] == name), key=lambda r: r["seed"]):
                if seeds is not None and run["seed"] not in seeds:
                    continue
                print(f"[analysis] {fam.name} {name} seed {run['seed']}", flush=True)
                probe = PROBES[fam.name](run)
                result, rec, outl = measure(probe)
                res["metric"] = probe.metric
                res[kind].append(dict(seed=run["seed"], **result))
                if kind not in first:
                    first[kind] = outl
                    probe.plot(rec, plots / f"analysis_{fam.name}_{kind}_attention.png")
                    if kind == "diff":
                        lambdas[f"{fam.name} ({name})"] = result["lambdas"]
        if res["diff"] and res["softmax"]:
            plot_outliers_by_layer(first, plots / f"analysis_{fam.name}_outliers.png")
            plot_metric_vs_bits(
                {k: _mean_bits(res[k]) for k in ("diff", "softmax")}, plots / f"analysis_{fam.name}_bits.png",
                metric=res["metric"],
            )
        out[fam.name] = res
    if lambdas:
        plot_lambda_by_depth(lambdas, plots / "analysis_lambda_by_depth.png")
    return out


def _mean_bits(results: list[dict]) -> dict:
    keys = results[0]["bits"].keys()
    return {(None if k == "None" else int(k)): statistics.mean(r["bits"][k] for r in results) for k in keys}


def _ms(xs: list[float], fmt: str = ".3f") -> str:
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):{fmt}} ± {sd:{fmt}}"


def markdown(analysis: dict) -> str:
    """Three markdown tables: attention noise, outliers and metric vs bits (mean ± sd over seeds)."""
    noise = ["| family | model | seeds | attention on relevant tokens | entropy (nats) | negative share | lambda by depth |",
             "|---|---|---|---|---|---|---|"]
    outl = ["| family | model | logits top-1 / median | logits top-10 / median | hidden top-1 / median | hidden top-10 / median |",
            "|---|---|---|---|---|---|"]
    bits = ["| family | metric | model | unquantised | 8 bits | 6 bits | 4 bits |", "|---|---|---|---|---|---|---|"]
    for fam, res in analysis.items():
        for kind in ("diff", "softmax"):
            rs = res[kind]
            if not rs:
                continue
            lam = ""
            if rs[0]["lambdas"]:
                per_depth = list(zip(*[r["lambdas"] for r in rs]))
                lam = ", ".join(f"{statistics.mean(v):.2f}" for v in per_depth)
            noise.append(
                f"| {fam} | {kind} | {len(rs)} | {_ms([r['noise']['answer'] for r in rs])} | "
                f"{_ms([r['noise']['entropy'] for r in rs], '.2f')} | {_ms([r['noise']['negative'] for r in rs])} | {lam} |"
            )
            o = [r["outliers"] for r in rs]
            outl.append(
                f"| {fam} | {kind} | {_ms([x['logits']['top1_ratio'] for x in o], '.1f')} | "
                f"{_ms([x['logits']['topk_ratio'] for x in o], '.1f')} | {_ms([x['hidden']['top1_ratio'] for x in o], '.1f')} | "
                f"{_ms([x['hidden']['topk_ratio'] for x in o], '.1f')} |"
            )
            cells = [_ms([r["bits"][k] for r in rs], ".2f") for k in ("None", "8", "6", "4")]
            bits.append(f"| {fam} | {res['metric']} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(["### Attention noise", *noise, "", "### Activation outliers (largest layer)", *outl, "",
                      "### Task metric with low-bit attention logits", *bits])
