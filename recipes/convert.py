"""Convert a pretrained softmax model to differential attention: ``python -m recipes.convert``.

    python -m recipes.convert --from timm:vit_tiny_patch16_224 --weights vit_tiny.safetensors --attn diff_v2 --out DIR
    python -m recipes.convert --from open_clip:ViT-B-32 --weights open_clip_model.safetensors --out DIR
    python -m recipes.convert --from hf:path/to/llama_dir --attn diff_v2 --out DIR
    python -m recipes.convert --from diffzoo:softvit_nano_patch7_28 --weights outputs/.../model.safetensors --out DIR
    python -m recipes.convert --from diffzoo:lm_nano --weights outputs/lm/.../model.safetensors --attn diff --out DIR
    python -m recipes.convert --from diffzoo:lm --model-kwargs '{"vocab_size": 128, "dim": 64, "depth": 2, "num_heads": 4}' \
        --weights outputs/mqar/.../model.safetensors --out DIR        # any LMConfig shape, e.g. an MQAR run's

Writes ``DIR/model.safetensors`` and ``DIR/convert.json`` (how to rebuild: :func:`diffzoo.weights.load_converted`;
recipes start from it with ``--model.init_from DIR``). Without ``--weights`` the source is the library's
randomly initialised model (nothing is downloaded); ``--pretrained [TAG]`` uses timm's or open_clip's local
cache. The conversion is checked on a random batch and the largest output difference is printed and stored.
``--attn softmax`` writes the source unchanged in the same format (the control arm of a fine-tuning comparison).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from diffzoo.weights.convert import ATTN_KINDS
from recipes._cli import one_line_errors


def _state_dict(path: str) -> dict[str, torch.Tensor]:
    from diffzoo.weights.io import read_state_dict

    return read_state_dict(path, what="--weights")


def _load_strict(model: nn.Module, sd: dict[str, torch.Tensor], path: str) -> None:
    from diffzoo.weights.export import load_tied

    missing, unexpected = load_tied(model, sd)
    if missing or unexpected:
        raise ValueError(
            f"--weights {path} does not fit the source model ({len(missing)} missing, e.g. {missing[:2]}; "
            f"{len(unexpected)} unexpected, e.g. {unexpected[:2]}); check --from and --model-kwargs"
        )


def _max_diff(a: Any, b: Any) -> float:
    if isinstance(a, (tuple, list)):
        return max(_max_diff(x, y) for x, y in zip(a, b) if isinstance(x, torch.Tensor))
    if isinstance(a, dict):
        return max(_max_diff(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    return float((a.float() - b.float()).abs().max())


def _keep_or(attn: str, model: nn.Module, convert: Callable[[], nn.Module]) -> nn.Module:
    """``--attn softmax``: a copy of the source (nothing converted); otherwise ``convert()``."""
    return copy.deepcopy(model) if attn == "softmax" else convert()


def _lm_shape(config: Any) -> str:
    """The ``recipes.mqar`` flags that build an LM of ``config``'s shape."""
    return (f"--model.dim {config.dim} --model.depth {config.depth} --model.num_heads {config.baseline_heads} "
            f"--model.intermediate_size {config.intermediate_size}")


def _check_timm_name(name: str) -> None:
    """Raise a one-line ``ValueError`` (with close matches) unless ``name`` is in timm's registry."""
    import difflib

    import timm

    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
    raise ValueError(f"--from timm:{name}: unknown timm model{hint}")


def _check_out(out: str, overwrite: bool) -> None:
    """Refuse an output folder that already holds converted weights unless ``overwrite``."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is a file, not a folder")
    held = [f for f in ("model.safetensors", "convert.json") if os.path.exists(os.path.join(out, f))]
    if held and not overwrite:
        raise ValueError(f"--out {out} already holds {' and '.join(held)}: choose another folder, or pass --overwrite "
                         "to replace them")


def convert(args: argparse.Namespace) -> dict[str, Any]:
    """Run one conversion; returns the written ``convert.json`` content."""
    from diffzoo.weights import convert as cv

    _check_out(args.out, getattr(args, "overwrite", False))
    family, _, name = args.source.partition(":")
    kwargs = json.loads(args.model_kwargs) if args.model_kwargs else {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"--model-kwargs {args.model_kwargs!r} must be a JSON object")
    torch.manual_seed(args.seed)
    spec = None if args.attn == "softmax" else cv.conversion_spec(args.attn, args.lambda_init)
    meta: dict[str, Any] = {"format": "diffzoo.convert", "version": 1, "source": args.source, "attn": args.attn,
                            "lambda_init": spec.lambda_init if spec is not None else None}
    if args.weights and family == "hf":
        raise ValueError("--weights does not apply to hf: sources; the folder holds the weights")
    lm_source = family == "diffzoo" and (name == "lm" or name.startswith("lm_"))
    if family in ("timm", "diffzoo") and not lm_source:
        import timm

        import diffzoo.models  # noqa: F401

        if family == "diffzoo" and not name.startswith("softvit_"):
            raise ValueError(f"--from diffzoo:{name}: expected a softvit_* model, an lm_* preset or lm")
        _check_timm_name(name)
        model = timm.create_model(name, pretrained=bool(args.pretrained), **kwargs)
        if args.weights:
            from diffzoo.models.vit import checkpoint_filter_fn

            _load_strict(model, checkpoint_filter_fn(_state_dict(args.weights), model), args.weights)
        model.eval()
        c, h, w = model.pretrained_cfg.get("input_size", (3, 224, 224))
        if "img_size" in kwargs:
            h = w = int(kwargs["img_size"])
        if "in_chans" in kwargs:
            c = int(kwargs["in_chans"])
        x = torch.randn(args.calib_batch, c, h, w)
        out = _keep_or(args.attn, model, lambda: cv.convert_timm_vit(
            model, args.attn, lambda_init=args.lambda_init, calibration=x, seed=args.seed)).eval()
        run = lambda m: m(x)  # noqa: E731
        meta.update(family="timm", build={"model": name, "kwargs": kwargs})
        diff_name = name.replace("softvit_", "diffvit_", 1) if name.startswith("softvit_") else None
        if args.attn == "softmax":
            meta["rebuild_hint"] = f"--model.model {name}" if diff_name else f"{name} (diffzoo.weights.load_converted)"
        else:
            meta["rebuild_hint"] = (
                f"--model.model {diff_name} --model.attn {args.attn}" if diff_name
                else f"{name} with its attention converted (diffzoo.weights.load_converted)"
            )
    elif family == "open_clip":
        import open_clip

        from diffzoo.weights.clip import check_model_name

        check_model_name(name)
        pretrained = args.pretrained if isinstance(args.pretrained, str) else None
        model = open_clip.create_model(name, pretrained=pretrained, **kwargs)
        if args.weights:
            _load_strict(model, _state_dict(args.weights), args.weights)
        model.eval()
        size = model.visual.image_size
        size = size if isinstance(size, (tuple, list)) else (size, size)
        img = torch.randn(args.calib_batch, 3, *size)
        txt = torch.randint(0, model.vocab_size, (args.calib_batch, model.context_length))
        run = lambda m: m(img, txt)  # noqa: E731
        out = _keep_or(args.attn, model, lambda: cv.convert_open_clip(
            model, args.attn, lambda_init=args.lambda_init, calibration=run, seed=args.seed)).eval()
        converted = "" if args.attn == "softmax" else " with converted attention"
        meta.update(family="open_clip", build={"model": name, "kwargs": kwargs},
                    rebuild_hint=f"the open_clip model{converted} (diffzoo.weights.load_converted)")
    elif family in ("hf", "diffzoo"):
        if family == "hf":
            from transformers import LlamaForCausalLM

            if not os.path.isdir(name):
                raise FileNotFoundError(f"--from hf:{name}: not a local folder (save_pretrained output)")
            source = LlamaForCausalLM.from_pretrained(name, local_files_only=True, torch_dtype=torch.float32).eval()
            model = cv.from_hf_llama(source).eval()
        else:
            from diffzoo.models.lm import CausalLM, LMConfig

            if name == "lm":  # no preset: LMConfig's defaults and --model-kwargs
                model = CausalLM(LMConfig(**{**kwargs, "attn": "softmax"}))
            else:
                model = CausalLM.from_preset(name, **{**kwargs, "attn": "softmax"})
            if args.weights:
                _load_strict(model, _state_dict(args.weights), args.weights)
            model.eval()
        tokens = torch.randint(0, model.config.vocab_size, (args.calib_batch, 64))
        run = lambda m: m(tokens)  # noqa: E731
        out = _keep_or(args.attn, model, lambda: cv.convert_lm(
            model, args.attn, lambda_init=args.lambda_init, calibration=tokens, seed=args.seed)).eval()
        config = {k: v for k, v in vars(out.config).items()}
        meta.update(family="lm", build={"config": config},
                    rebuild_hint=f"--model.attn {args.attn} and the source's shape (recipes.lm: --model.model_kwargs "
                                 f"'{json.dumps(config)}'; recipes.mqar: {_lm_shape(out.config)})")
    else:
        raise ValueError(f"--from {args.source!r}: expected timm:NAME, open_clip:NAME, hf:DIR or diffzoo:NAME")
    with torch.no_grad():
        meta["check"] = {"max_abs_diff": _max_diff(run(model), run(out)), "inputs": "random batch"}
    cv.save_converted(out, args.out, meta)
    return meta


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (default ``sys.argv[1:]``), convert, write ``--out``."""
    p = argparse.ArgumentParser(prog="python -m recipes.convert", description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="source", required=True, help="timm:NAME, open_clip:NAME, hf:DIR or diffzoo:NAME")
    p.add_argument("--weights", help="local weight file of the source (safetensors or a weights-only torch file)")
    p.add_argument("--pretrained", nargs="?", const=True, default=False,
                   help="use timm's / open_clip's locally cached pretrained weights (open_clip: the TAG)")
    p.add_argument("--attn", default="diff_v2", choices=[*ATTN_KINDS, "softmax"],
                   help="diff_v2 (exact), diff / diff_nonorm / diff_const (V1, calibrated start) or softmax "
                        "(the source unchanged)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the model.safetensors and convert.json that --out already holds")
    p.add_argument("--lambda-init", type=float, default=None,
                   help="constant lambda_init of a V1 --attn (default: diff_const's 0.8, else 0.0)")
    p.add_argument("--calib-batch", type=int, default=8, help="random calibration/check batch size")
    p.add_argument("--model-kwargs", help="JSON object of extra model arguments, e.g. '{\"img_size\": 32}'")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    with one_line_errors(p.prog):
        if args.pretrained:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        meta = convert(args)
    print(f"{args.source} -> {args.attn}: max |output difference| on a random batch = {meta['check']['max_abs_diff']:.3g}; "
          f"wrote {args.out}/model.safetensors and convert.json", file=sys.stdout)
    return meta


if __name__ == "__main__":
    main()
