"""diffzoo.evaluation.zeroshot (top-k, Recall@k and the zero-shot classifier on cases computed by hand) and the
CLIP loaders of diffzoo.weights.clip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from diffzoo.evaluation import zeroshot as zs
from diffzoo.weights import clip as clip_weights

# Similarities image i (rows) x text j (columns); text j belongs to image j.
#   img0: t0 first -> found at 1;  img1: t0, t1 -> found at 2;  img2: t1, t0, t2 -> found at 3
#   t0: img0 first; t1: img1 (0.7) > img2 (0.6); t2: img2 (0.2) > img1 (0.1) > img0 -> all found at 1
SIM = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.7, 0.1], [0.5, 0.6, 0.2]])


def test_topk_hits_by_hand() -> None:
    logits = torch.tensor([[0.1, 0.5, 0.2, 0.9], [0.8, 0.1, 0.3, 0.2], [0.3, 0.2, 0.1, 0.0]])
    labels = torch.tensor([1, 0, 3])  # ranks 2, 1, 4
    assert zs.topk_hits(logits, labels, (1, 2, 5)) == {1: 1, 2: 2, 5: 3}


def test_retrieval_one_caption_per_image() -> None:
    r = zs.retrieval_recall(torch.eye(3), SIM.T.clone(), ks=(1, 2, 3))
    assert r["i2t_r1"] == pytest.approx(1 / 3) and r["i2t_r2"] == pytest.approx(2 / 3) and r["i2t_r3"] == 1.0
    assert r["t2i_r1"] == 1.0 and r["t2i_r2"] == 1.0
    assert r["mean_recall"] == pytest.approx((1 / 3 + 2 / 3 + 1 + 3) / 6)
    chunked = zs.retrieval_recall(torch.eye(3), SIM.T.clone(), ks=(1, 2, 3), chunk=1)
    assert chunked == r
    with pytest.raises(ValueError, match="3 images and 2 texts"):
        zs.retrieval_recall(torch.eye(3), torch.eye(3)[:2])


def test_retrieval_several_captions_per_image_and_shared_captions() -> None:
    # 2 images, 4 texts: t0, t1 describe img0; t2, t3 describe img1.
    sim = torch.tensor([[0.1, 0.9, 0.3, 0.2],    # img0: best t1 (its own) -> found at 1
                        [0.8, 0.7, 0.6, 0.1]])   # img1: t0, t1, t2 -> its first at 3
    r = zs.retrieval_recall(torch.eye(2), sim.T.clone(), text_to_image=torch.tensor([0, 0, 1, 1]), ks=(1, 2, 3))
    assert (r["i2t_r1"], r["i2t_r2"], r["i2t_r3"]) == (0.5, 0.5, 1.0)
    # t2i per text: t0 -> img1 first (miss@1), t1 -> img0, t2 -> img1, t3 -> img0 first (miss@1)
    assert r["t2i_r1"] == 0.5 and r["t2i_r2"] == 1.0
    # the transpose: one caption shared by several images
    r2 = zs.retrieval_recall(sim.T.clone(), torch.eye(2), image_to_text=torch.tensor([0, 0, 1, 1]), ks=(1, 2))
    assert (r2["t2i_r1"], r2["i2t_r1"]) == (r["i2t_r1"], r["t2i_r1"])
    assert (r2["t2i_r2"], r2["i2t_r2"]) == (0.5, 1.0) == (r["i2t_r2"], r["t2i_r2"])
    tokens = torch.tensor([[5, 1], [7, 2], [5, 1], [9, 9], [7, 2]])
    first, image_to_text = zs.caption_relevance(tokens)
    assert torch.equal(tokens[first][image_to_text], tokens) and sorted(first.tolist()) == [0, 1, 3]


class FakeCLIP(nn.Module):
    """encode_text: one-hot of the class named in the prompt; encode_image: the image tensor itself."""

    def __init__(self, classes: list[str]) -> None:
        super().__init__()
        self.classes = classes
        self.dummy = nn.Parameter(torch.zeros(1))

    def encode_text(self, tokens: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        return nn.functional.one_hot(tokens[:, 0], len(self.classes)).float() + 0 * self.dummy

    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        return nn.functional.normalize(images, dim=-1) if normalize else images


def test_zero_shot_classifier_and_accuracy_with_a_fake_model() -> None:
    classes = ["cat", "dog", "red car", "boat", "tree", "house"]
    seen = []

    def tokenizer(texts: list[str]) -> torch.Tensor:
        seen.extend(texts)
        return torch.tensor([[next(i for i, c in enumerate(classes) if t.endswith(c + "."))] for t in texts])

    model = FakeCLIP(classes)
    w = zs.zero_shot_classifier(model, tokenizer, classes, ["a photo of a {}.", "a drawing of a {}."], classes_per_batch=4)
    assert torch.allclose(w, torch.eye(6)) and "a drawing of a red car." in seen and len(seen) == 12
    # image scores by class: label 0 ranked 1st, label 1 ranked 2nd, label 2 ranked 6th
    images = torch.tensor([[0.9, 0.1, 0.0, 0.0, 0.0, 0.0],
                           [0.0, 0.5, 0.0, 0.6, 0.1, 0.0],
                           [0.6, 0.5, 0.0, 0.4, 0.3, 0.2]])
    labels = torch.tensor([0, 1, 2])
    loader = [(images[:2], labels[:2]), (images[2:], labels[2:])]
    swap = torch.tensor([1, 0, 3, 2, 5, 4])  # class 0 vs 1: wins; 1 vs 0: wins (0.5 > 0); 2 vs 3: loses
    r = zs.zero_shot_accuracy(model, w, loader, ks=(1, 5), hard_negative=swap)
    assert r["top1"] == pytest.approx(1 / 3) and r["top5"] == pytest.approx(2 / 3) and r["n"] == 3
    assert r["pair"] == pytest.approx(2 / 3)
    assert model.training  # restored


def test_load_clip_weights_from_every_format(tmp_path: Path) -> None:
    src = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    state = src.state_dict()
    lightning = {"pytorch-lightning_version": "2.6.6", "hyper_parameters": {"model": "Tiny"},
                 "state_dict": {**{f"model.{k}": v for k, v in state.items()}, "loss_fn.x": torch.ones(1)}}
    torch.save(lightning, tmp_path / "run.ckpt")
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "oc.pt")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "m.safetensors"))
    for name in ("run.ckpt", "oc.pt", "m.safetensors"):
        dst = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
        clip_weights.load_clip_weights(dst, tmp_path / name)
        assert all(torch.equal(dst.state_dict()[k], v) for k, v in state.items()), name
    assert clip_weights.checkpoint_model_name(tmp_path / "run.ckpt") == "Tiny"
    with pytest.raises(ValueError, match=r"oc.pt does not fit the model: 2 missing"):
        clip_weights.load_clip_weights(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2)), tmp_path / "oc.pt")
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        clip_weights.load_clip_weights(src, tmp_path / "nope.ckpt")
    with pytest.raises(ValueError, match=r"^\S*m.safetensors does not fit the model: 0.bias has shape \(4,\), the "
                                         r"model's is \(5,\) \(3 shape mismatch"):  # one line, not torch's size report
        clip_weights.load_clip_weights(nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2)), tmp_path / "m.safetensors")


def test_unknown_model_name_suggests_close_ones() -> None:
    with pytest.raises(ValueError, match="unknown open_clip model 'ViT-B-61'.*ViT-B-16"):
        clip_weights.check_model_name("ViT-B-61")
    clip_weights.check_model_name("ViT-B-16")
