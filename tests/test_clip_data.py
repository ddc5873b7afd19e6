"""diffzoo.data.image_text: coloured digits (captions, held-out pairs) and {jpg,txt} shards, including broken data."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from diffzoo.data import image_text as it
from diffzoo.data import load_mnist_5k
from diffzoo.data import shards as shards_mod

TINY_CLIP = "TinyCLIP-test"
TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def register_tiny_clip(folder: Path) -> str:
    """Register a stock open_clip CLIP small enough for CPU tests as ``TinyCLIP-test``."""
    import open_clip

    if open_clip.get_model_config(TINY_CLIP) is None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{TINY_CLIP}.json").write_text(json.dumps(TINY_CLIP_CONFIG))
        open_clip.add_model_config(folder)
    return TINY_CLIP


@pytest.fixture(scope="module")
def splits() -> dict:
    return it.colored_digit_splits(num_val=60, num_test=120, colorings=2, seed=0, limit=540, num_val_heldout=60)


# -- coloured digits ------------------------------------------------------------------------------
def test_captions_match_pixel_colours_and_digits(splits) -> None:
    grey, labels = load_mnist_5k()
    rgb = torch.tensor(list(it.PALETTE.values()))
    for name, split in splits.items():
        ds = it.ColoredDigits(**split, target="caption")
        for i in range(0, len(ds), max(1, len(ds) // 6)):
            img, cap = ds.images[i], ds.captions[i]
            words = cap.split()  # "a red seven on a blue background"
            fg, digit, bg = it.COLOR_NAMES.index(words[1]), it.DIGIT_WORDS.index(words[2]), it.COLOR_NAMES.index(words[5])
            assert cap == f"a {words[1]} {words[2]} on a {words[5]} background" and fg != bg
            assert torch.equal(img[:, 0, 0], rgb[bg].to(torch.uint8)), f"{name}[{i}]: corner is not the {words[5]} background"
            # the brightest stroke pixels carry the foreground colour
            c = int((rgb[fg] - rgb[bg]).abs().argmax())
            alpha = (img[c].float() - rgb[bg][c]) / (rgb[fg][c] - rgb[bg][c]).float()
            y, x = np.unravel_index(int(alpha.argmax()), alpha.shape)
            assert (img[:, y, x].int() - rgb[fg]).abs().max() <= 3
            # the recovered stroke map is a real MNIST image of the captioned digit
            recovered = (alpha * 255).round()
            same_digit = grey[labels == digit].float()
            found = False
            for oy in range(5):
                for ox in range(5):
                    crop = recovered[oy : oy + 28, ox : ox + 28]
                    if recovered.sum() - crop.sum() > 1:  # ink outside this window
                        continue
                    found |= bool(((same_digit - crop).abs().amax(dim=(1, 2)) <= 3).any())
            assert found, f"{name}[{i}]: no MNIST {words[2]} under the caption {cap!r}"
            assert int(ds.digits[i]) == digit


def test_heldout_pairs_never_in_training(splits) -> None:
    held = set(it.heldout_pairs())
    pairs = {k: set(zip(v["fg"].tolist(), v["bg"].tolist())) for k, v in splits.items()}
    assert pairs["train"].isdisjoint(held) and pairs["val"].isdisjoint(held)
    assert pairs["test"] <= held and len(pairs["test"]) == len(held) == 6
    assert pairs["val_heldout"] <= held and len(pairs["val_heldout"]) == 6
    assert {(b, f) for f, b in held} <= pairs["train"]  # the swapped pairs are trained on
    assert len(pairs["train"]) == 24  # every seen pair is used
    assert len(splits["train"]["images"]) == 2 * 300 and len(splits["test"]["images"]) == 120
    # train / val / test digit images are disjoint: no stroke map is shared across splits
    def strokes(split: dict) -> set:
        return {bytes((split["images"][i].int() - split["images"][i, :, :1, :1].int()).abs().amax(0).ne(0).numpy())
                for i in range(len(split["images"]))}
    s = {k: strokes(v) for k, v in splits.items()}
    assert s["train"].isdisjoint(s["test"]) and s["val"].isdisjoint(s["test"])
    assert s["val_heldout"].isdisjoint(s["test"]) and s["val_heldout"].isdisjoint(s["train"])
    again = it.colored_digit_splits(num_val=60, num_test=120, colorings=2, seed=0, limit=540, num_val_heldout=60)
    assert torch.equal(again["test"]["images"], splits["test"]["images"])


def test_the_four_splits_are_disjoint_mnist_images_and_val_heldout_comes_out_of_training() -> None:
    grey, labels = load_mnist_5k()
    full = it.colored_digit_splits()  # the defaults: 1,000 test, 500 val, 500 val-heldout, 3,000 train
    sizes = {k: len(v["index"]) for k, v in full.items()}
    assert sizes == {"test": 1000, "val": 500, "val_heldout": 500, "train": 3000}
    sets = {k: set(v["index"].tolist()) for k, v in full.items()}
    assert all(len(sets[k]) == sizes[k] for k in sets)  # one colouring: no image twice within a split
    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert sets[a].isdisjoint(sets[b]), (a, b)
    assert set().union(*sets.values()) == set(range(len(grey)))  # every digit image is used once
    for split in full.values():  # the index names the MNIST image that was drawn
        assert torch.equal(split["digits"], labels[split["index"]])
    # num_test / num_val keep their meaning: test and val are the same images in the same colours with
    # or without a val-heldout split; the val-heldout images are taken from the training images
    none = it.colored_digit_splits(num_val_heldout=0)
    for k in ("test", "val"):
        assert torch.equal(none[k]["index"], full[k]["index"]) and torch.equal(none[k]["images"], full[k]["images"])
    assert sets["val_heldout"] | sets["train"] == set(none["train"]["index"].tolist()) and not len(none["val_heldout"]["index"])
    with pytest.raises(ValueError, match="num_val_heldout=300 leave no training digits out of 400"):
        it.colored_digit_splits(num_val=50, num_test=50, limit=400, num_val_heldout=300)


def test_dataset_targets_and_transforms(splits) -> None:
    def tokenizer(texts: list[str]) -> torch.Tensor:
        return torch.tensor([[len(t), sum(map(ord, t)) % 1000] for t in texts])

    ds = it.ColoredDigits(**splits["val"], tokenizer=tokenizer)
    x, tok = ds[3]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert torch.equal(tok, tokenizer([ds.captions[3]])[0])
    names, _ = it.digit_classes()
    labelled = it.ColoredDigits(**splits["test"], target="label", transform=it.ToFloatTensor(48))
    x, y = labelled[5]
    assert x.shape == (3, 48, 48) and "a " + names[y] == labelled.captions[5]
    import torchvision.transforms as T

    pil = it.ColoredDigits(**splits["test"], target="label", transform=T.ToTensor(), as_pil=True)
    assert torch.allclose(pil[0][0], splits["test"]["images"][0].float() / 255)
    assert ds.images.dtype == torch.uint8
    with pytest.raises(ValueError, match="needs a tokenizer"):
        it.ColoredDigits(**splits["val"])


def _stroke_maps(images: torch.Tensor) -> set[bytes]:
    """Each image's stroke map (pixels unlike the corner, the background), cropped to its ink: the MNIST image
    it was drawn from, whatever its colours and offset on the canvas."""
    out = set()
    for img in images:
        ink = (img - img[:, :1, :1]).abs().amax(0) > 1e-6
        rows, cols = ink.any(1).nonzero().flatten(), ink.any(0).nonzero().flatten()
        crop = ink[int(rows[0]) : int(rows[-1]) + 1, int(cols[0]) : int(cols[-1]) + 1]
        out.add(bytes(crop.numpy()) + bytes(str(tuple(crop.shape)), "ascii"))
    return out


def test_datamodule_batches_and_hard_negatives(tmp_path: Path) -> None:
    import open_clip

    tokenizer = open_clip.get_tokenizer(register_tiny_clip(tmp_path))
    dm = it.ColoredDigitsDataModule(tokenizer=tokenizer, image_size=32, batch_size=32, limit=450, num_val=50,
                                    num_test=100, num_val_heldout=60, colorings=1)
    assert "tokenizer" not in dm.hparams  # an object: kept out of hyper-parameters and checkpoints
    assert dm.has_test_split
    dm.setup("fit")
    x, tok = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 3, 32, 32) and tok.shape == (32, 16) and tok.dtype == torch.long
    assert len(dm.train_set) == 240
    held = {(it.COLOR_NAMES[f], it.COLOR_NAMES[b]) for f, b in it.heldout_pairs()}

    def batches(loader) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*loader)
        return torch.cat(xs), torch.cat(ys)

    # validation: seen-pair retrieval on the val images, held-out-pair zero-shot on the val-heldout images
    (val_x, val_tok), (vh_x, vh_y) = (batches(loader) for loader in dm.val_dataloader())
    assert val_tok.shape == (50, 16) and vh_y.shape == (60,) and len(dm.zeroshot_classnames) == 300
    for label in vh_y.tolist():
        words = dm.zeroshot_classnames[label].split()
        assert (words[0], words[4]) in held
        swapped = dm.zeroshot_classnames[int(dm.zeroshot_hard_negative[label])].split()
        assert (swapped[0], swapped[1], swapped[4]) == (words[4], words[1], words[0])
    seen_captions = {c for c in dm.val_set.captions}
    assert all((c.split()[1], c.split()[5]) not in held for c in seen_captions)

    # test: the same held-out-pair test images twice, with their captions' tokens and with their labels
    (t_x, t_tok), (tl_x, t_y) = (batches(loader) for loader in dm.test_dataloader())
    assert t_tok.shape == (100, 16) and t_y.shape == (100,) and torch.equal(t_x, tl_x)
    names = ["a " + dm.zeroshot_classnames[y] for y in t_y.tolist()]
    assert torch.equal(t_tok, tokenizer(names))  # each image's tokens are its own caption's
    assert all((n.split()[1], n.split()[5]) in held for n in names)
    assert len({(n.split()[1], n.split()[5]) for n in names}) == 6
    assert t_y.tolist() == dm.test_set.labels.tolist()

    # no validation image is a test image: by MNIST index and by the digit strokes the loaders give
    test_index = set(dm.test_set.index.tolist())
    for ds in (dm.val_set, dm.val_heldout_set, dm.train_set):
        assert test_index.isdisjoint(ds.index.tolist())
    assert set(dm.val_set.index.tolist()).isdisjoint(dm.val_heldout_set.index.tolist())
    test_strokes = _stroke_maps(t_x)
    assert len(test_strokes) > 95  # distinct MNIST images give distinct stroke maps (a few may coincide)
    assert _stroke_maps(val_x).isdisjoint(test_strokes) and _stroke_maps(vh_x).isdisjoint(test_strokes)
    # ... which would catch one: the test images drawn again in seen colours are found
    assert _stroke_maps(batches(dm._eval_loader(it.ColoredDigits(
        dm.test_set.images[:5].flip(1), dm.test_set.digits[:5], dm.test_set.fg[:5], dm.test_set.bg[:5],
        transform=dm.test_set.transform, target="label")))[0]) <= test_strokes

    # predict: the test images, zero-shot
    px, py = batches(dm.predict_dataloader())
    assert torch.equal(px, t_x) and torch.equal(py, t_y)
    assert not it.ColoredDigitsDataModule(tokenizer=tokenizer, num_test=0).has_test_split



def test_fewer_colours_keep_the_held_out_pairs_out_of_training_and_shrink_the_label_space(tmp_path: Path) -> None:
    import open_clip

    tokenizer = open_clip.get_tokenizer(register_tiny_clip(tmp_path))
    dm = it.ColoredDigitsDataModule(tokenizer=tokenizer, batch_size=32, limit=450, num_val=50, num_test=100,
                                    num_val_heldout=60, num_colors=4)
    dm.setup("fit")
    held = set(it.heldout_pairs(4))
    assert held == {(0, 1), (1, 2), (2, 3), (3, 0)}
    assert len(dm.zeroshot_classnames) == 10 * 4 * 3
    assert {w for n in dm.zeroshot_classnames for w in (n.split()[0], n.split()[4])} == {"red", "green", "blue", "yellow"}
    pairs = {k: set(zip(ds.fg.tolist(), ds.bg.tolist())) for k, ds in
             (("train", dm.train_set), ("val", dm.val_set), ("val_heldout", dm.val_heldout_set), ("test", dm.test_set))}
    # every seen pair is trained on, no held-out pair is; the held-out splits use exactly the held-out pairs
    assert pairs["train"] == set(it.color_pairs(4)) - held and pairs["val"] <= pairs["train"]
    assert pairs["test"] == held and pairs["val_heldout"] == held
    # labels index the four-colour class list, and a label names its image's digit and colours
    for ds in (dm.test_set, dm.val_heldout_set):
        for y, d, f, b in zip(ds.labels.tolist(), ds.digits.tolist(), ds.fg.tolist(), ds.bg.tolist()):
            assert dm.zeroshot_classnames[y] == it.class_name(d, f, b)
    swapped = dm.zeroshot_classnames[int(dm.zeroshot_hard_negative[dm.test_set.labels[0]])].split()
    first = dm.zeroshot_classnames[int(dm.test_set.labels[0])].split()
    assert (swapped[0], swapped[4]) == (first[4], first[0])
    # the images are the ones the default draws: same MNIST split, only the colouring differs
    six = it.colored_digit_splits(num_val=50, num_test=100, limit=450, num_val_heldout=60)
    assert torch.equal(six["test"]["index"], dm.test_set.index) and torch.equal(six["train"]["index"], dm.train_set.index)
    for bad in (2, 7):
        with pytest.raises(ValueError, match=f"num_colors={bad}: expected 3 to 6"):
            it.ColoredDigitsDataModule(tokenizer=tokenizer, num_colors=bad)
    with pytest.raises(ValueError, match="colour index 5 is outside num_colors=4"):
        it.ColoredDigits(**six["test"], target="label", num_colors=4)


def test_a_digit_subset_draws_only_those_digits_and_names_only_their_classes(tmp_path: Path) -> None:
    import open_clip

    tokenizer = open_clip.get_tokenizer(register_tiny_clip(tmp_path))
    dm = it.ColoredDigitsDataModule(tokenizer=tokenizer, batch_size=32, num_val=40, num_test=80, num_val_heldout=40,
                                    limit=400, digits=[3, 1, 7])
    dm.setup("fit")
    assert len(dm.zeroshot_classnames) == 3 * 30
    assert {n.split()[1] for n in dm.zeroshot_classnames} == {"one", "three", "seven"}
    sets = [dm.train_set, dm.val_set, dm.val_heldout_set, dm.test_set]
    assert [len(ds) for ds in sets] == [240, 40, 40, 80]  # limit counts images of the kept digits
    grey, labels = load_mnist_5k()
    for ds in sets:
        assert set(ds.digits.tolist()) == {1, 3, 7} and torch.equal(labels[ds.index], ds.digits)
    for y, d, f, b in zip(dm.test_set.labels.tolist(), dm.test_set.digits.tolist(), dm.test_set.fg.tolist(),
                          dm.test_set.bg.tolist()):
        assert dm.zeroshot_classnames[y] == it.class_name(d, f, b)
    # the held-out split is still the held-out colour pairs, and the four splits share no image
    assert set(zip(dm.test_set.fg.tolist(), dm.test_set.bg.tolist())) == set(it.heldout_pairs())
    index = [set(ds.index.tolist()) for ds in sets]
    assert sum(map(len, index)) == len(set().union(*index))
    for bad in ([4], [2, 2, 5], [0, 10]):
        with pytest.raises(ValueError, match="expected at least two distinct digits from 0 to 9"):
            it.ColoredDigitsDataModule(tokenizer=tokenizer, digits=bad)
    with pytest.raises(ValueError, match=r"digits \[0, 2\] are outside class_digits=\[1, 3\]"):
        it.ColoredDigits(torch.zeros(3, 3, 32, 32, dtype=torch.uint8), torch.tensor([0, 1, 2]), torch.zeros(3, dtype=torch.long),
                         torch.ones(3, dtype=torch.long), target="label", class_digits=[1, 3])

# -- shards ---------------------------------------------------------------------------------------
COLOURS = [(250, 0, 0), (0, 250, 0), (0, 0, 250)]


def _pairs(n: int, start: int = 0) -> list[tuple[np.ndarray, str]]:
    return [(np.full((12, 12, 3), COLOURS[(start + i) % 3], np.uint8), f"café ☕ picture {start + i}") for i in range(n)]


def test_shard_writer_and_reader_round_trip(tmp_path: Path) -> None:
    paths = it.write_image_text_shards(_pairs(7), tmp_path / "s-%03d.tar", max_per_shard=3, image_format="png")
    assert [Path(p).name for p in paths] == ["s-000.tar", "s-001.tar", "s-002.tar"]
    ds = it.ShardImageTextDataset(str(tmp_path / "s-{000..002}.tar"), transform=lambda im: im.getpixel((5, 5)),
                                  shuffle=False)
    items = list(ds)
    assert items == [(COLOURS[i % 3], f"café ☕ picture {i}") for i in range(7)] and ds.num_bad == 0
    tok = it.ShardImageTextDataset(paths, transform=lambda im: 0, tokenizer=lambda t: torch.tensor([[len(t[0])]]),
                                   shuffle=False)
    assert [int(t) for _, t in tok] == [len(f"café ☕ picture {i}") for i in range(7)]
    with pytest.raises(ValueError, match="shard-index field"):
        it.write_image_text_shards(_pairs(1), tmp_path / "plain.tar")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_corrupt_samples_and_shards_are_skipped_and_counted(tmp_path: Path, caplog) -> None:
    good, = it.write_image_text_shards(_pairs(2), tmp_path / "good-%d.tar")
    with tarfile.open(good, "a") as tar:
        _add(tar, "bad_image.jpg", b"not a jpeg")
        _add(tar, "bad_image.txt", b"fine caption")
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, "JPEG")
        _add(tar, "no_caption.jpg", buf.getvalue())
        _add(tar, "bad_utf8.jpg", buf.getvalue())
        _add(tar, "bad_utf8.txt", b"\xff\xfe caption")
    broken, = it.write_image_text_shards(_pairs(4, start=10), tmp_path / "broken-%d.tar")
    Path(broken).write_bytes(Path(broken).read_bytes()[:1200])  # truncated tar
    caplog.set_level(logging.WARNING, logger="diffzoo.data")
    ds = it.ShardImageTextDataset([good, broken], transform=lambda im: 0, shuffle=False)
    captions = [c for _, c in ds]
    assert captions[:2] == ["café ☕ picture 0", "café ☕ picture 1"]
    assert all(c.startswith("café") for c in captions) and len(captions) < 6
    assert ds.num_bad >= 4  # three bad samples + the truncated shard
    for key in ("bad_image", "no_caption", "bad_utf8", "broken-0.tar"):
        assert key in caplog.text, key


def test_shards_split_by_rank_and_worker(tmp_path: Path, monkeypatch) -> None:
    paths = [it.write_image_text_shards(_pairs(3, start=3 * s), tmp_path / f"p{s}-%d.tar")[0] for s in range(4)]
    seen = []
    for rank in (0, 1):
        monkeypatch.setattr(shards_mod, "_rank_world", lambda r=rank: (r, 2))  # training's own split
        monkeypatch.setenv("RANK", str(rank))  # evaluation splits with webdataset, which reads these
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = it.ShardImageTextDataset(paths, transform=lambda im: 0, shuffle=False)
        seen.append({c for _, c in DataLoader(ds, batch_size=None, num_workers=2)})
        train = it.ShardImageTextDataset(paths, transform=lambda im: 0, samples_per_epoch=10, shuffle=False)
        assert len(train) == 5 and len(list(DataLoader(train, batch_size=None, num_workers=2))) == 5
    assert seen[0].isdisjoint(seen[1]) and len(seen[0]) == len(seen[1]) == 6
    assert seen[0] | seen[1] == {f"café ☕ picture {i}" for i in range(12)}


# -- zero-shot folders ----------------------------------------------------------------------------
def test_imagenet_folder_checks_and_classnames(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        it.imagenet_classnames(tmp_path / "missing")
    few = tmp_path / "few"
    for w in ("n01440764", "n01443537", "cats"):
        (few / w).mkdir(parents=True)
    with pytest.raises(ValueError, match="3 class folders"):
        it.imagenet_classnames(few)
    full = tmp_path / "full"
    for i in range(1000):
        (full / f"n{10000000 + i:08d}").mkdir(parents=True)
    wnids, names = it.imagenet_classnames(full)
    assert len(wnids) == 1000 and names[0] == "tench" and names[999] == "toilet paper"
    (tmp_path / "names.txt").write_text("n10000001\tsecond\nn10000000\tfirst\n")
    assert it.read_classnames(tmp_path / "names.txt", ["n10000000", "n10000001"]) == ["first", "second"]
    with pytest.raises(ValueError, match="2 class names for 3"):
        (tmp_path / "two.txt").write_text("a\nb\n")
        it.read_classnames(tmp_path / "two.txt", ["x", "y", "z"])


def test_image_text_datamodules_take_the_model_inputs_and_name_a_missing_tokenizer(tmp_path: Path) -> None:
    """The model's size and normalisation reach the images; without a tokenizer setup says what is missing."""
    import open_clip

    model = open_clip.create_model(register_tiny_clip(tmp_path))
    size, mean, std = it.clip_image_settings(model)
    assert size == 32 and mean == tuple(open_clip.OPENAI_DATASET_MEAN) and std == tuple(open_clip.OPENAI_DATASET_STD)
    dm = it.ColoredDigitsDataModule(tokenizer=open_clip.get_tokenizer(TINY_CLIP), image_size=40, mean=(0.5,) * 3,
                                    std=(0.25,) * 3, batch_size=8, limit=100, num_val=10, num_test=10,
                                    num_val_heldout=10)
    dm.setup("fit")
    x, _ = dm.train_set[0]
    raw = dm.train_set.images[0].float()[None] / 255
    expected = torch.nn.functional.interpolate(raw, size=(40, 40), mode="bicubic", align_corners=False)[0].clamp(0, 1)
    torch.testing.assert_close(x, (expected - 0.5) / 0.25)
    with pytest.raises(ValueError, match="ColoredDigitsDataModule needs the model's tokenizer"):
        it.ColoredDigitsDataModule(limit=100, num_val=10, num_test=10, num_val_heldout=10).setup("fit")
    shards = it.write_image_text_shards(_pairs(2), tmp_path / "t-%d.tar")
    with pytest.raises(ValueError, match="ImageTextShardDataModule needs the model's tokenizer"):
        it.ImageTextShardDataModule(shards, train_samples=2).setup("fit")

