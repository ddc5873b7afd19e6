"""Bad samples: evaluation leaves them out and reports them, every bad file or shard is counted once,
a corrupt shard is read once, a transform failing on one sample skips it, and DeiT's RandAugment
never fails on timm's 0-bit posterize."""

from __future__ import annotations

import io
import json
import logging
import random
import tarfile
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from torch.utils.data import DataLoader

from diffzoo.data import ImageFolderDataModule, RobustImageFolder, ShardImageDataset, SpeechCommandsDataModule
from diffzoo.data.augment import posterize
from diffzoo.data.image_text import ShardImageTextDataset

from test_data_vision import COLORS, make_folder, make_image, make_shards, write_shard  # tests/ is on sys.path
from test_speech_data import make_speech_commands

CONFIGS = Path(__file__).resolve().parents[1] / "recipes" / "configs"


def break_images(folder: Path, names: list[str]) -> list[Path]:
    """Overwrite ``names`` (relative to ``folder``) with bytes no decoder reads."""
    paths = [folder / n for n in names]
    for p in paths:
        p.write_bytes(b"this is not an image")
    return paths


def tensor_tf(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1) / 255.0


def deit_transform(config: str = "vit_deit_small.yaml") -> ImageFolderDataModule:
    """The DataModule's transforms built from a recipe config's ``data.init_args`` as the recipe builds them."""
    args = yaml.safe_load((CONFIGS / config).read_text())["data"]["init_args"]
    keys = ("img_size", "in_chans", "auto_augment", "re_prob", "color_jitter", "interpolation", "crop_pct", "mean", "std")
    dm = ImageFolderDataModule.__new__(ImageFolderDataModule)
    defaults = dict(in_chans=3, mean=None, std=None)
    dm._init_transforms(**{k: args.get(k, defaults.get(k)) for k in keys})
    return dm


def rand_augment(transform):
    return next(t for t in transform.transforms if type(t).__name__ == "RandAugment")


# -- evaluation leaves unreadable samples out and says how many --------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_folder_validation_leaves_unreadable_images_out(tmp_path: Path, workers: int) -> None:
    root = make_folder(tmp_path / "ds")  # 3 classes x 4 images per split
    # the first two (one whole batch of 2) and one more: nothing is scored twice, no batch is empty
    bad = break_images(root / "val", ["class0/img0.jpeg", "class0/img1.jpeg", "class2/img3.jpeg"])
    dm = ImageFolderDataModule(root, img_size=16, batch_size=2, num_workers=workers, auto_augment=None, re_prob=0)
    dm.setup("validate")
    labels = [int(y) for _, ys in dm.val_dataloader() for y in ys]
    assert Counter(labels) == Counter({0: 2, 1: 4, 2: 3})  # the 9 readable images, each once
    assert dm.val_set.num_bad == len(bad) == 3
    labels_again = [int(y) for _, ys in dm.val_dataloader() for y in ys]
    assert sorted(labels_again) == sorted(labels) and dm.val_set.num_bad == 3  # a second pass counts nothing new


def test_speech_validation_leaves_unusable_clips_out(tmp_path: Path) -> None:
    root = make_speech_commands(tmp_path)
    base = root / "SpeechCommands" / "speech_commands_v0.02"
    (base / "no" / "s1_nohash_0.wav").write_bytes(b"RIFF\x00\x00\x00\x00not a wave file")  # in the validation list
    dm = SpeechCommandsDataModule(str(root), num_classes=35, batch_size=4, num_workers=0)
    dm.setup("validate")
    labels = [int(y) for _, ys, _ in dm.val_dataloader() for y in ys]
    names = [dm.classes[y] for y in labels]
    assert len(dm.val_set) == 6 and sorted(names) == ["bed", "cat", "dog", "left", "yes"]  # "no" left out, once
    assert dm.val_set.num_bad == 1


def test_vit_validation_logs_evaluated_and_skipped(tmp_path: Path) -> None:
    from diffzoo.tasks import ImageClassificationTask

    root = make_folder(tmp_path / "ds")
    break_images(root / "val", ["class1/img0.jpeg", "class1/img2.jpeg"])
    dm = ImageFolderDataModule(root, img_size=16, batch_size=4, num_workers=0, auto_augment=None, re_prob=0)
    task = ImageClassificationTask("diffvit_nano_patch7_28", num_classes=3, in_chans=3, img_size=16,
                                   model_kwargs=dict(patch_size=4))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    with pytest.warns(UserWarning, match="2 unusable sample"):
        metrics = trainer.validate(task, datamodule=dm, verbose=False)[0]
    assert metrics["val/evaluated"] == 10 and metrics["val/skipped"] == 2


def test_clip_zeroshot_folder_reports_evaluated_and_skipped(tmp_path: Path, capsys) -> None:
    from recipes import clip_zeroshot

    from test_clip_data import register_tiny_clip

    tiny = register_tiny_clip(tmp_path / "configs")
    folder = tmp_path / "folder"
    for c, name in enumerate(("red", "green", "blue")):
        (folder / name).mkdir(parents=True)
        for j in range(4):
            make_image(COLORS[c], seed=j).save(folder / name / f"{j}.png")
    break_images(folder, ["red/0.png", "green/3.png", "blue/1.png"])
    out = tmp_path / "zs.json"
    report = clip_zeroshot.main(["--model", tiny, "--folder", str(folder), "--templates", "simple", "--batch-size", "4",
                                 "--no-progress", "--out", str(out)])
    result = report["results"]["folder"]
    assert result["n"] == 9 and result["skipped"] == 3 and result["classes"] == 3
    assert json.loads(out.read_text())["results"]["folder"] == result
    printed = capsys.readouterr().out
    assert "| folder | n | 9 |" in printed and "| folder | skipped | 3 |" in printed


# -- each bad file / shard / sample counted once ---------------------------------------------------
def test_bad_files_are_counted_once_across_workers_and_epochs(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds")
    # four bad files in a row: each is also met as the stand-in of the ones before it
    break_images(root / "train", [f"class1/img{j}.jpeg" for j in range(4)])
    ds = RobustImageFolder(root / "train", transform=tensor_tf)
    loader = DataLoader(ds, batch_size=3, num_workers=2)
    for _ in range(2):
        labels = [int(y) for _, ys in loader for y in ys]
        assert len(labels) == 12 and 1 not in labels  # full batches, class 1 replaced by readable images
    assert ds.num_bad == 4


def test_corrupt_shard_is_counted_once_and_read_once(tmp_path: Path, monkeypatch, caplog) -> None:
    import webdataset as wds

    paths = make_shards(tmp_path, n_shards=4, per_shard=5)
    Path(paths[2]).write_bytes(Path(paths[2]).read_bytes()[:1500])  # truncated tar
    opened: Counter = Counter()
    real = wds.tarfile_samples

    def spy(sources, *args, **kwargs):
        opened.update(s["url"] for s in sources)
        return real(sources, *args, **kwargs)

    monkeypatch.setattr(wds, "tarfile_samples", spy)
    caplog.set_level(logging.WARNING, logger="diffzoo.data")
    # a 40-sample epoch through a 1000-sample shuffle buffer reads the 4 shards about 50 times each
    ds = ShardImageDataset(paths, transform=lambda im: 0, samples_per_epoch=40, shuffle_buffer=1000, seed=0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert len(list(ds)) == 40
    assert ds.num_bad == 1
    assert opened[paths[2]] == 1 and opened[paths[0]] > 10
    assert caplog.text.count("corrupt shard") == 1
    # across DataLoader workers too
    ds = ShardImageDataset(paths, transform=lambda im: 0, samples_per_epoch=40, shuffle_buffer=1000, seed=0)
    assert len(list(DataLoader(ds, batch_size=None, num_workers=2))) == 40
    assert ds.num_bad == 1


def test_bad_sample_in_a_cycled_shard_is_counted_once(tmp_path: Path) -> None:
    good = write_shard(tmp_path / "a.tar", [(make_image(COLORS[0], seed=i), 0) for i in range(3)])
    with tarfile.open(good, "a") as tar:
        for name, data in (("zzz.jpg", b"not a jpeg"), ("zzz.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ds = ShardImageDataset([str(good)], transform=lambda im: 0, samples_per_epoch=60, shuffle_buffer=1)
    assert len(list(DataLoader(ds, batch_size=None, num_workers=2))) == 60  # the shard is read ~10 times
    assert ds.num_bad == 1


def test_all_shards_corrupt_still_raise(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, n_shards=2, per_shard=2)
    for p in paths:
        Path(p).write_bytes(b"\x00garbage" * 100)
    ds = ShardImageDataset(paths, transform=lambda im: 0, samples_per_epoch=8)
    with pytest.raises(RuntimeError, match=r"no readable sample: all 2 shard\(s\) are corrupt"):
        list(ds)


# -- a transform failing on one sample skips it ------------------------------------------------------
class FailsOnRed:
    """A transform that raises for pure-red-dominated images (as an augmentation bug would for one input)."""

    def __call__(self, img: Image.Image) -> torch.Tensor:
        x = tensor_tf(img)
        if x[0].mean() > 0.7:
            raise ValueError("injected transform failure")
        return x


def test_transform_failure_is_skipped_and_counted_once_folder(tmp_path: Path, caplog) -> None:
    d = tmp_path / "train"
    for c in range(3):
        (d / f"class{c}").mkdir(parents=True)
        for j in range(2):
            make_image(COLORS[c] if (c, j) == (0, 1) else (0, 128, 128), seed=j).save(d / f"class{c}" / f"{j}.png")
    ds = RobustImageFolder(d, transform=FailsOnRed())
    caplog.set_level(logging.WARNING, logger="diffzoo.data")
    for _ in range(3):  # three epochs: the sample fails every time, is replaced, and counted once
        items = [ds[i] for i in range(len(ds))]
        assert all(isinstance(x, torch.Tensor) for x, _ in items)
    assert ds.num_bad == 1
    assert caplog.text.count("injected transform failure") == 1 and "1.png" in caplog.text
    # evaluation: left out, not replaced
    val = RobustImageFolder(d, transform=FailsOnRed(), substitute=False)
    assert [val[i] is None for i in range(len(val))] == [False, True, False, False, False, False]


def test_transform_failure_is_skipped_and_counted_once_shards(tmp_path: Path) -> None:
    items = [(make_image(COLORS[0] if i == 2 else COLORS[1], seed=i), i) for i in range(5)]
    shard = write_shard(tmp_path / "s.tar", items)
    ds = ShardImageDataset([str(shard)], transform=FailsOnRed(), samples_per_epoch=20, shuffle_buffer=1)
    labels = [y for _, y in ds]
    assert len(labels) == 20 and 2 not in labels
    assert ds.num_bad == 1
    val = ShardImageTextDataset([str(shard)], transform=FailsOnRed(), caption_key="cls", shuffle=False)
    assert [c for _, c in val] == ["0", "1", "3", "4"] and val.num_bad == 1


# -- DeiT's RandAugment and timm's 0-bit posterize ----------------------------------------------------
def test_posterize_keeps_pillow_results_and_zero_bits_is_black() -> None:
    from PIL import ImageOps

    img = make_image((200, 120, 40), size=8)
    for bits in range(1, 8):
        assert np.array_equal(np.asarray(posterize(img, bits)), np.asarray(ImageOps.posterize(img, bits)))
    assert posterize(img, 8) is img
    assert not np.asarray(posterize(img, 0)).any() and posterize(img, 0).mode == "RGB"
    assert not np.asarray(posterize(img.convert("L"), 0)).any()


@pytest.mark.parametrize("config", ["vit_deit_small.yaml", "vit_deit_small_shards.yaml"])
def test_deit_posterize_at_full_magnitude_does_not_raise(config: str) -> None:
    ra = rand_augment(deit_transform(config).train_transform)
    op = next(o for o in ra.ops if o.name == "PosterizeIncreasing")
    op.prob, op.magnitude_std, op.magnitude = 1.0, 0.0, 10  # the draw that asks for 0 bits
    assert not np.asarray(op(make_image((200, 120, 40)))).any()


def test_deit_rand_augment_runs_over_thousands_of_images() -> None:
    ra = rand_augment(deit_transform().train_transform)
    random.seed(0)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)) for _ in range(32)]
    for i in range(4000):  # about 6 draws of the 0-bit posterize
        out = ra(images[i % len(images)])
        assert out.size == (12, 12)


@pytest.mark.slow
def test_deit_train_transform_runs_over_thousands_of_images() -> None:
    tf = deit_transform().train_transform
    random.seed(1)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (int(s), int(s), 3), dtype=np.uint8)) for s in rng.integers(8, 64, 32)]
    for i in range(3000):
        assert tf(images[i % len(images)]).shape == (3, 224, 224)
