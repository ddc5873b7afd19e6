"""Zero-shot classification and image-text retrieval of a CLIP model: ``python -m recipes.clip_zeroshot``.

    python -m recipes.clip_zeroshot --model DiffCLIP-ViT-B-16 --checkpoint outputs/clip/version_0/checkpoints/last.ckpt \\
        --imagenet-dir /data/imagenet/val                       # 1000 wnid folders -> open_clip's class names
    python -m recipes.clip_zeroshot --checkpoint outputs/clip/version_0/model.safetensors --embedded
    python -m recipes.clip_zeroshot --model ViT-B-16 --pretrained openai --folder /data/pets/test --classnames names.txt
    python -m recipes.clip_zeroshot --model DiffCLIP-ViT-B-16 --checkpoint ... --shards "/data/cc3m-val/{0000..0003}.tar"

Sources (any combination, at least one): ``--imagenet-dir`` (ImageNet layout: 1000 WordNet-id class
folders; sorted wnids index open_clip's ``IMAGENET_CLASSNAMES``; prompts ``OPENAI_IMAGENET_TEMPLATES``),
``--folder`` (class names = folder names, ``_`` read as a space, or ``--classnames``: one name a line in
sorted-folder order, or ``folder<TAB>name`` lines), ``--shards`` (``{jpg,txt}`` pairs: retrieval R@1/5/10,
identical captions merged), ``--embedded`` (the coloured digits: zero-shot on the held-out colour pairs,
retrieval on the seen-pair validation digits; ``--split-seed`` must match training's).

``--checkpoint`` takes a diffzoo Lightning checkpoint, a ``model.safetensors`` export, an open_clip
checkpoint or a plain state dict; ``--model`` may be left out when the checkpoint names its model.
Prints a table and writes JSON (``--out``). Unreadable images and corrupt shards or samples are left out
(never replaced by another sample): each source reports ``n`` (images or pairs evaluated) and ``skipped``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Run every requested evaluation; returns ``{"model": ..., "results": {source: metrics}}``."""
    import open_clip

    from diffzoo.data.image_text import (
        CAPTION_TEMPLATES,
        ColoredDigits,
        ShardImageTextDataset,
        ToFloatTensor,
        clip_image_settings,
        colored_digit_splits,
        digit_classes,
        zeroshot_folder,
    )
    from diffzoo.data.skipping import EvalDataLoader
    from diffzoo.evaluation.zeroshot import encode_pairs, pair_retrieval, zero_shot_accuracy, zero_shot_classifier
    from diffzoo.weights.clip import check_model_name, checkpoint_model_name, load_clip

    for name, path in (("--imagenet-dir", args.imagenet_dir), ("--folder", args.folder)):
        if path is not None and not Path(path).is_dir():
            raise FileNotFoundError(f"{name} {path}: no such folder")
    if args.classnames is not None and not Path(args.classnames).is_file():
        raise FileNotFoundError(f"--classnames {args.classnames}: no such file")
    model_name = args.model
    if model_name is None:
        if args.checkpoint is None:
            raise ValueError("--model is required without --checkpoint: name an open_clip model, "
                             "e.g. --model DiffCLIP-nano")
        if not (model_name := checkpoint_model_name(args.checkpoint)):
            raise ValueError(f"--checkpoint {args.checkpoint} does not name its model: add --model NAME")
    check_model_name(model_name)
    device = _device(args.device)
    model, preprocess, tokenizer = load_clip(model_name, args.pretrained, args.checkpoint, device=device)
    progress = not args.no_progress
    templates = open_clip.OPENAI_IMAGENET_TEMPLATES if args.templates == "openai" else open_clip.SIMPLE_IMAGENET_TEMPLATES

    def loader(dataset) -> DataLoader:
        return EvalDataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers, shuffle=False)

    def limited(dataset):
        if args.limit is None or not hasattr(dataset, "__len__"):
            return dataset
        return torch.utils.data.Subset(dataset, range(min(args.limit, len(dataset))))

    results: dict[str, dict[str, float]] = {}
    run = dict(device=device, precision=args.precision, progress=progress)
    for name, root, imagenet in (("imagenet", args.imagenet_dir, True), ("folder", args.folder, False)):
        if root is None:
            continue
        dataset, classnames = zeroshot_folder(root, preprocess, imagenet=imagenet, classnames_file=args.classnames)
        classifier = zero_shot_classifier(model, tokenizer, classnames, templates, device, progress=progress)
        results[name] = zero_shot_accuracy(model, classifier, loader(limited(dataset)), **run)
        results[name].update(skipped=dataset.num_bad, classes=len(classnames))
    if args.shards:
        dataset = ShardImageTextDataset(args.shards, preprocess, tokenizer, shuffle=False)
        img, txt, tok = encode_pairs(model, loader(dataset), **run)
        results["shards"] = pair_retrieval(img, txt, tok, progress=progress)
        results["shards"].update(n=len(img), skipped=dataset.num_bad)
    if args.embedded:
        size, mean, std = clip_image_settings(model)
        transform = ToFloatTensor(size, mean, std)
        splits = colored_digit_splits(seed=args.split_seed)
        test = ColoredDigits(**splits["test"], transform=transform, target="label")
        val = ColoredDigits(**splits["val"], transform=transform, tokenizer=tokenizer)
        classnames, index = digit_classes()
        swap = torch.tensor([index[(d, b, f)] for (d, f, b) in index])
        classifier = zero_shot_classifier(model, tokenizer, classnames, list(CAPTION_TEMPLATES), device, progress=progress)
        zs = zero_shot_accuracy(model, classifier, loader(limited(test)), hard_negative=swap, **run)
        img, txt, tok = encode_pairs(model, loader(limited(val)), **run)
        results["embedded"] = {**{f"zs_{k}": v for k, v in zs.items()}, **pair_retrieval(img, txt, tok)}
    return {"model": model_name, "checkpoint": args.checkpoint, "pretrained": args.pretrained, "results": results}


def table(report: dict[str, Any]) -> str:
    """Markdown table: one row per source, the metrics in percent."""
    lines = [f"model: {report['model']}" + (f"  checkpoint: {report['checkpoint']}" if report["checkpoint"] else ""),
             "", "| source | metric | value |", "|---|---|---|"]
    for source, metrics in report["results"].items():
        for key, value in metrics.items():
            shown = f"{100 * value:.2f} %" if isinstance(value, float) else str(value)
            lines.append(f"| {source} | {key} | {shown} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipes.clip_zeroshot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="open_clip model name (default: the one the checkpoint names)")
    p.add_argument("--checkpoint", default=None, help="Lightning .ckpt, .safetensors, open_clip checkpoint or state dict")
    p.add_argument("--pretrained", default=None, help="open_clip pretrained tag or file")
    p.add_argument("--imagenet-dir", default=None, help="ImageNet-layout folder with 1000 wnid class folders")
    p.add_argument("--folder", default=None, help="any <dir>/<class>/<image> folder")
    p.add_argument("--classnames", default=None, help="class names for --folder (one a line, or folder<TAB>name)")
    p.add_argument("--shards", default=None, help="{jpg,txt} shards (brace pattern) for retrieval R@1/5/10")
    p.add_argument("--embedded", action="store_true", help="the coloured-digit held-out pairs and validation digits")
    p.add_argument("--split-seed", type=int, default=0, help="split seed of the coloured digits (as in training)")
    p.add_argument("--templates", choices=("openai", "simple"), default="openai", help="ImageNet prompt set")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="score only the first N images of each folder / split")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--out", type=Path, default=Path("outputs/clip_zeroshot/results.json"), help="JSON report")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser()
    args = p.parse_args(argv)
    if not (args.imagenet_dir or args.folder or args.shards or args.embedded):
        p.error("nothing to evaluate: pass --imagenet-dir, --folder, --shards and/or --embedded")
    if args.classnames and not args.folder:
        p.error("--classnames belongs to --folder")
    start = time.time()
    try:
        report = evaluate(args)
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    report["seconds"] = round(time.time() - start, 1)
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"written: {args.out}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
