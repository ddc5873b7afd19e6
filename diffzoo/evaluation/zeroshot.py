"""Zero-shot classification and image-text retrieval for any open_clip-style model (DiffCLIP evaluation).

DiffCLIP (arXiv 2503.06626) reports zero-shot ImageNet top-1 and image<->text retrieval recall. Everything
here uses only the open_clip model contract (``encode_image`` / ``encode_text(normalize=...)``), so it
scores diffzoo's DiffCLIP models and any open_clip model alike:

* zero-shot classification: class embeddings from ``open_clip.build_zero_shot_classifier`` (templates
  averaged per class), top-k accuracy of ``image_features @ classifier``;
* retrieval: Recall@k both ways from a relevance matrix between images and texts. Several captions per
  image (COCO / Flickr) and identical captions shared by several images (the coloured digits) are both
  handled: a query counts as found when any relevant item is among its top k.

Load the model to score with :func:`diffzoo.weights.load_clip`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from .metrics import finite_rows

__all__ = [
    "caption_relevance",
    "encode_pairs",
    "pair_retrieval",
    "retrieval_recall",
    "topk_hits",
    "zero_shot_accuracy",
    "zero_shot_classifier",
]


def _batches(loader: Iterable) -> int | None:
    """Number of batches for the progress bar, or None for a stream without a length (e.g. shards)."""
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:  # DataLoader over an IterableDataset with no __len__ of its own
        return None


def _autocast(device: torch.device, precision: str):
    if precision in ("fp32", "32", "32-true"):
        return nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is None:
        raise ValueError(f"precision={precision!r}; expected 'fp32', 'bf16' or 'fp16'")
    return torch.autocast(device.type, dtype=dtype)


def _progress(items: Iterable, enabled: bool, desc: str, total: int | None = None) -> Iterable:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, leave=False)


# -- zero-shot classification ---------------------------------------------------------------------
def zero_shot_classifier(
    model: nn.Module,
    tokenizer: Callable,
    classnames: Sequence[str],
    templates: Sequence[str | Callable],
    device: str | torch.device = "cpu",
    classes_per_batch: int = 10,
    progress: bool = False,
) -> Tensor:
    """Class embeddings ``(E, C)``: each class's prompts encoded, normalised and averaged (open_clip's
    ``build_zero_shot_classifier``). ``templates`` are ``str.format`` strings (``"a photo of a {}."``)."""
    import open_clip

    if not classnames:
        raise ValueError("no class names given")
    if not templates:
        raise ValueError("no prompt templates given")
    was_training = model.training
    model.eval()
    try:
        return open_clip.build_zero_shot_classifier(
            model, tokenizer, list(classnames), list(templates), num_classes_per_batch=classes_per_batch,
            device=device, use_tqdm=progress,
        ).float()
    finally:
        model.train(was_training)


def topk_hits(logits: Tensor, labels: Tensor, ks: Sequence[int] = (1, 5)) -> dict[int, int]:
    """How many rows of ``logits`` ``(B, C)`` have their label among the ``k`` largest (``k`` capped at C).

    A row holding a NaN or an infinity counts as a miss."""
    kmax = min(max(ks), logits.shape[-1])
    top = logits.topk(kmax, dim=-1).indices  # (B, kmax)
    correct = (top == labels[:, None]) & finite_rows(logits)[:, None]  # a NaN / inf row is never a hit
    return {k: int(correct[:, : min(k, kmax)].any(dim=1).sum()) for k in ks}


@torch.no_grad()
def zero_shot_accuracy(
    model: nn.Module,
    classifier: Tensor,
    loader: Iterable[tuple[Tensor, Tensor]],
    ks: Sequence[int] = (1, 5),
    device: str | torch.device = "cpu",
    hard_negative: Tensor | None = None,
    precision: str = "fp32",
    progress: bool = False,
) -> dict[str, float]:
    """Top-k accuracy of zero-shot classification over ``loader`` batches ``(images, labels)``.

    Args:
        classifier: ``(E, C)`` from :func:`zero_shot_classifier`.
        hard_negative: optional ``(C,)`` class index each class is contrasted with; adds ``"pair"``: the
            fraction of images whose true class scores above its hard negative (e.g. colours swapped).
        precision: autocast for the image encoder (``fp32``, ``bf16``, ``fp16``).

    Returns:
        ``{"top1": ..., "top5": ..., ["pair": ...], "n": images}`` (accuracies in 0..1).
    """
    device = torch.device(device)
    classifier = classifier.to(device)
    was_training = model.training
    model.eval()
    hits = {k: 0 for k in ks}
    pair, n = 0, 0
    total = _batches(loader)
    try:
        for images, labels in _progress(loader, progress, "zero-shot", total):
            images, labels = images.to(device), torch.as_tensor(labels).to(device)
            with _autocast(device, precision):
                feats = model.encode_image(images, normalize=True)
            logits = feats.float() @ classifier  # (B, C)
            for k, v in topk_hits(logits, labels, ks).items():
                hits[k] += v
            if hard_negative is not None:
                neg = hard_negative.to(device)[labels]
                pair += int((logits.gather(1, labels[:, None]) > logits.gather(1, neg[:, None])).sum())
            n += len(labels)
    finally:
        model.train(was_training)
    if n == 0:
        raise ValueError("the zero-shot loader yielded no images")
    out = {f"top{k}": hits[k] / n for k in ks}
    if hard_negative is not None:
        out["pair"] = pair / n
    out["n"] = n
    return out


# -- retrieval ------------------------------------------------------------------------------------
def caption_relevance(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Merge identical captions: ``(first, image_to_text)`` for ``(N, L)`` tokens of N image-caption pairs.

    ``first`` ``(U,)`` indexes one pair per distinct caption (use it to pick text features);
    ``image_to_text`` ``(N,)`` is each image's distinct-caption index. Relevance is
    ``image_to_text[:, None] == arange(U)``.
    """
    unique, inverse = torch.unique(tokens, dim=0, return_inverse=True)
    first = torch.full((len(unique),), len(tokens), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(tokens)), reduce="amin")
    return first, inverse


def retrieval_recall(
    image_features: Tensor,
    text_features: Tensor,
    relevance: Tensor | None = None,
    text_to_image: Tensor | None = None,
    image_to_text: Tensor | None = None,
    ks: Sequence[int] = (1, 5, 10),
    chunk: int = 1024,
    progress: bool = False,
) -> dict[str, float]:
    """Image->text and text->image Recall@k from L2-normalised embeddings.

    Which texts belong to which images, by one of (default: pair ``i`` with text ``i``):

    Args:
        image_features: ``(Ni, E)``.
        text_features: ``(Nt, E)``.
        relevance: bool ``(Ni, Nt)``, True where text j describes image i.
        text_to_image: ``(Nt,)`` the image of each text (several captions per image).
        image_to_text: ``(Ni,)`` the text of each image (one caption shared by several images).
        ks: recall cut-offs (capped at the number of candidates).
        chunk: query rows scored at a time.

    Returns:
        ``{"i2t_r1": ..., "t2i_r1": ..., ..., "mean_recall": ...}`` in 0..1: the fraction of images whose
        top-k texts hold a relevant one, and of texts whose top-k images hold a relevant one.
    """
    ni, nt = len(image_features), len(text_features)
    if sum(x is not None for x in (relevance, text_to_image, image_to_text)) > 1:
        raise ValueError("pass at most one of relevance, text_to_image, image_to_text")
    if text_to_image is not None:
        relevance = torch.zeros(ni, nt, dtype=torch.bool)
        relevance[text_to_image.long(), torch.arange(nt)] = True
    elif image_to_text is not None:
        relevance = torch.zeros(ni, nt, dtype=torch.bool)
        relevance[torch.arange(ni), image_to_text.long()] = True
    elif relevance is None:
        if ni != nt:
            raise ValueError(f"{ni} images and {nt} texts: pass relevance / text_to_image / image_to_text")
        relevance = torch.eye(ni, dtype=torch.bool)
    if tuple(relevance.shape) != (ni, nt):
        raise ValueError(f"relevance has shape {tuple(relevance.shape)}, expected ({ni}, {nt})")
    img, txt, rel = image_features.float(), text_features.float(), relevance.to(image_features.device)
    out: dict[str, float] = {}
    for name, q, c, r in (("i2t", img, txt, rel), ("t2i", txt, img, rel.T)):
        kmax = min(max(ks), len(c))
        hits = torch.zeros(len(ks), dtype=torch.long)
        starts = range(0, len(q), chunk)
        for s in _progress(starts, progress, f"retrieval {name}", len(starts)):
            scores = q[s : s + chunk] @ c.T
            top = scores.topk(kmax, dim=1).indices  # (chunk, kmax)
            # relevance of the ranked candidates; a query with a NaN / inf score finds nothing
            found = r[s : s + chunk].gather(1, top) & finite_rows(scores)[:, None]
            for i, k in enumerate(ks):
                hits[i] += int(found[:, : min(k, kmax)].any(dim=1).sum())
        for i, k in enumerate(ks):
            out[f"{name}_r{k}"] = float(hits[i]) / max(1, len(q))
    out["mean_recall"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in ks) / (2 * len(ks))
    return out


@torch.no_grad()
def encode_pairs(
    model: nn.Module,
    loader: Iterable[tuple[Tensor, Tensor]],
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    progress: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Normalised ``(image_features, text_features, tokens)`` of every ``(images, tokens)`` batch, on the CPU."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    imgs, txts, toks = [], [], []
    total = _batches(loader)
    try:
        for images, tokens in _progress(loader, progress, "encoding pairs", total):
            with _autocast(device, precision):
                imgs.append(model.encode_image(images.to(device), normalize=True).float().cpu())
                txts.append(model.encode_text(tokens.to(device), normalize=True).float().cpu())
            toks.append(tokens.cpu())
    finally:
        model.train(was_training)
    if not imgs:
        raise ValueError("the retrieval loader yielded no pairs")
    return torch.cat(imgs), torch.cat(txts), torch.cat(toks)


def pair_retrieval(
    image_features: Tensor, text_features: Tensor, tokens: Tensor, ks: Sequence[int] = (1, 5, 10), progress: bool = False
) -> dict[str, float]:
    """Recall@k of image-caption pairs, identical captions merged into one text (:func:`caption_relevance`)."""
    first, image_to_text = caption_relevance(tokens)
    return retrieval_recall(image_features, text_features[first], image_to_text=image_to_text, ks=ks, progress=progress)
