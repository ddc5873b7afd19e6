"""diffzoo.data: embedded digits, image folders and webdataset shards, including broken data."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from diffzoo.data import (
    DigitsDataModule,
    ImageFolderDataModule,
    RobustImageFolder,
    ShardImageDataset,
    epoch_sampler,
    expand_urls,
    load_mnist_5k,
)
from diffzoo.data import shards as shards_mod

COLORS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]


def make_image(color: tuple[int, int, int], size: int = 16, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    arr = np.clip(np.array(color)[None, None] + rng.integers(-20, 20, (size, size, 3)), 0, 255)
    return Image.fromarray(arr.astype(np.uint8))


def make_folder(root: Path, per_class: int = 4, classes: int = 3, fmt: str = "JPEG") -> Path:
    """``root/{train,val}/class{i}/img{j}.JPEG`` with one colour per class."""
    for split in ("train", "val"):
        for c in range(classes):
            d = root / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for j in range(per_class):
                make_image(COLORS[c % 3], seed=j).save(d / f"img{j}.{fmt.lower()}", fmt)
    return root


def write_shard(path: Path, items: list[tuple[Image.Image, int]], start: int = 0) -> Path:
    with tarfile.open(path, "w") as tar:
        for i, (img, label) in enumerate(items):
            buf = io.BytesIO()
            img.save(buf, "JPEG")
            for ext, data in (("jpg", buf.getvalue()), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{start + i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def make_shards(root: Path, n_shards: int = 4, per_shard: int = 5) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(n_shards):
        items = [(make_image(COLORS[(s * per_shard + i) % 3], seed=i), (s * per_shard + i) % 3) for i in range(per_shard)]
        paths.append(str(write_shard(root / f"shard-{s:03d}.tar", items, start=s * per_shard)))
    return paths


# -- embedded digits ------------------------------------------------------------------------------
def test_embedded_digits_are_real_mnist() -> None:
    images, labels = load_mnist_5k()
    assert images.shape == (5000, 28, 28) and images.dtype == torch.uint8
    assert torch.equal(labels.bincount(), torch.full((10,), 500))
    # real handwriting: dark background, bright strokes in the centre
    mean = images.float().mean(0)
    assert mean[:3].mean() < 5 and mean[10:18, 10:18].mean() > 60


def test_digits_datamodule_split_and_epoch_order() -> None:
    dm = DigitsDataModule(num_val=100, batch_size=50, limit=400, seed=3)
    dm.setup("fit")
    assert len(dm.train_set) == 300 and len(dm.val_set) == 100
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (50, 1, 28, 28) and abs(float(dm.train_set.tensors[0].mean())) < 0.3
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(0)
    e0 = [b[1] for b in loader]
    loader.sampler.set_epoch(1)
    e1 = [b[1] for b in loader]
    loader.sampler.set_epoch(0)
    assert all(torch.equal(a, b) for a, b in zip(e0, [b[1] for b in loader]))  # same epoch, same order
    assert not all(torch.equal(a, b) for a, b in zip(e0, e1))  # new epoch, new order
    assert len(e0) == 6


def test_digits_test_split_is_disjoint_and_leaves_validation_alone() -> None:
    plain = DigitsDataModule(num_val=100, limit=400)
    held = DigitsDataModule(num_val=100, num_test=50, limit=400)
    plain.setup("fit")
    held.setup("fit")
    assert not plain.has_test_split and held.has_test_split
    assert torch.equal(plain.val_set.tensors[0], held.val_set.tensors[0])  # validation digits unchanged
    assert len(held.train_set) == 250 and len(held.test_set) == 50
    rows = {tuple(t.flatten().tolist()) for t in plain.train_set.tensors[0]}
    train = {tuple(t.flatten().tolist()) for t in held.train_set.tensors[0]}
    test = {tuple(t.flatten().tolist()) for t in held.test_set.tensors[0]}
    val = {tuple(t.flatten().tolist()) for t in held.val_set.tensors[0]}
    assert train | test == rows and not train & test and not test & val  # carved out of the training digits
    x, _ = next(iter(held.test_dataloader()))
    assert torch.equal(x, held.test_set.tensors[0][: len(x)])
    x, _ = next(iter(plain.test_dataloader()))  # no test split: test scores the validation digits, as before
    assert torch.equal(x, plain.val_set.tensors[0][: len(x)])
    with pytest.raises(ValueError, match="num_test=300 leaves no training digits"):
        DigitsDataModule(num_val=100, num_test=300, limit=400).setup("fit")


def test_epoch_sampler_splits_ranks(monkeypatch) -> None:
    from diffzoo.data import modules

    monkeypatch.setattr(modules, "_rank_world", lambda: (1, 2))
    s = epoch_sampler(list(range(10)), seed=0)
    assert s.num_replicas == 2 and s.rank == 1 and len(list(s)) == 5


# -- folders --------------------------------------------------------------------------------------
def test_folder_missing_and_empty_class(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ImageFolderDataModule(tmp_path / "nope")
    root = make_folder(tmp_path / "ds")
    (root / "train" / "class9").mkdir()
    dm = ImageFolderDataModule(root, img_size=16, num_workers=0)
    assert dm.num_classes == 4
    with pytest.raises(ValueError, match="empty class folder.*class9"):
        dm.setup("fit")


def test_folder_skips_and_counts_unreadable_images(tmp_path: Path, caplog) -> None:
    root = make_folder(tmp_path / "ds")
    good = root / "train" / "class1" / "img0.jpeg"
    data = good.read_bytes()
    (root / "train" / "class1" / "img1.jpeg").write_bytes(data[: len(data) // 2])  # truncated
    (root / "train" / "class1" / "img2.jpeg").write_bytes(b"not an image at all")  # unreadable
    ds = RobustImageFolder(root / "train")
    assert ds.classes == ["class0", "class1", "class2"] and len(ds) == 12
    idx = [i for i, (p, _) in enumerate(ds.samples) if p.endswith(os.path.join("class1", "img1.jpeg"))][0]
    img, label = ds[idx]  # replaced by the next readable image
    assert isinstance(img, Image.Image) and label == 1
    assert ds.num_bad == 2
    assert "skipping unreadable image" in caplog.text and "img1.jpeg" in caplog.text
    # counted across DataLoader worker processes too
    ds2 = RobustImageFolder(root / "train", transform=lambda im: torch.tensor(np.asarray(im)).float().mean())
    assert len(list(DataLoader(ds2, batch_size=4, num_workers=2))) == 3
    assert ds2.num_bad == 2  # each bad file once, though img2 is met again as img1's stand-in


def test_folder_all_unreadable_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "train" / "a"
    d.mkdir(parents=True)
    for i in range(3):
        (d / f"{i}.png").write_bytes(b"broken")
    ds = RobustImageFolder(tmp_path / "train")
    with pytest.raises(RuntimeError, match="unreadable images in a row"):
        ds[0]


def test_folder_datamodule_batches(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "ds")
    dm = ImageFolderDataModule(root, img_size=16, batch_size=4, num_workers=0, auto_augment=None, re_prob=0)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16) and y.dtype == torch.int64
    xv, yv = next(iter(dm.val_dataloader()))
    assert xv.shape == (4, 3, 16, 16)


# -- shards ---------------------------------------------------------------------------------------
def test_expand_urls(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, n_shards=3)
    assert expand_urls(str(tmp_path / "shard-{000..002}.tar")) == paths
    with pytest.raises(FileNotFoundError, match="1 of 4 shard"):
        expand_urls(str(tmp_path / "shard-{000..003}.tar"))


def test_shards_split_by_node_and_worker(tmp_path: Path, monkeypatch) -> None:
    paths = make_shards(tmp_path, n_shards=4, per_shard=5)
    seen = {}
    for rank in (0, 1):
        monkeypatch.setattr(shards_mod, "_rank_world", lambda r=rank: (r, 2))
        ds = ShardImageDataset(paths, transform=lambda im: 0, samples_per_epoch=20, shuffle=False)
        assert len(ds) == 10
        loader = DataLoader(ds, batch_size=None, num_workers=2)
        items = list(loader)
        assert len(items) == 10
        seen[rank] = items
    # one-pass validation: each rank reads its own shards once (webdataset's split_by_node, which reads the
    # rank from RANK / WORLD_SIZE or torch.distributed, then split_by_worker); together they read everything once
    keys = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = ShardImageDataset(paths, transform=lambda im: 0, shuffle=False)
        monkeypatch.setattr(shards_mod.ShardImageDataset, "_pass", lambda self, shards: iter([(s, 0) for s in shards]))
        keys.append(sorted(s for s, _ in DataLoader(ds, batch_size=None, num_workers=2)))
        monkeypatch.undo()
    assert keys == [sorted(paths[0::2]), sorted(paths[1::2])]


def test_shard_slices_are_disjoint(tmp_path: Path, monkeypatch) -> None:
    paths = make_shards(tmp_path, n_shards=4, per_shard=3)
    read = {}
    monkeypatch.setattr(shards_mod.ShardImageDataset, "_pass", lambda self, shards: iter([(s, 0) for s in shards]))
    for rank in (0, 1):
        monkeypatch.setattr(shards_mod, "_rank_world", lambda r=rank: (r, 2))
        ds = ShardImageDataset(paths, samples_per_epoch=4, shuffle=True, shuffle_buffer=1, seed=1)
        read[rank] = {s for s, _ in ds}
    assert read[0].isdisjoint(read[1]) and read[0] | read[1] == set(paths)


def test_shards_epoch_reshuffles(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, n_shards=4, per_shard=4)
    ds = ShardImageDataset(paths, transform=lambda im: im.getpixel((0, 0)), samples_per_epoch=16, shuffle_buffer=8, seed=0)
    ds.set_epoch(0)
    a = [i for i in ds]
    ds.set_epoch(0)
    assert [i for i in ds] == a
    ds.set_epoch(1)
    assert [i for i in ds] != a


def test_corrupt_shard_is_skipped_and_counted(tmp_path: Path, caplog) -> None:
    paths = make_shards(tmp_path, n_shards=3, per_shard=4)
    Path(paths[1]).write_bytes(Path(paths[1]).read_bytes()[:700])  # truncated tar
    ds = ShardImageDataset(paths, transform=lambda im: 0, shuffle=False)
    items = list(ds)
    assert 8 <= len(items) < 12
    assert ds.num_bad >= 1
    assert "corrupt shard" in caplog.text
    # an undecodable image inside an intact shard
    bad = write_shard(tmp_path / "bad.tar", [(make_image(COLORS[0]), 0)])
    with tarfile.open(bad, "a") as tar:
        info = tarfile.TarInfo("999999.jpg")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"xxxxx"))
        info = tarfile.TarInfo("999999.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    ds = ShardImageDataset([str(bad)], transform=lambda im: 0, shuffle=False)
    assert len(list(ds)) == 1 and ds.num_bad == 1


def test_all_corrupt_shards_raise(tmp_path: Path) -> None:
    p = tmp_path / "junk.tar"
    p.write_bytes(b"\x00garbage" * 100)
    ds = ShardImageDataset([str(p)], transform=lambda im: 0, samples_per_epoch=4)
    with pytest.raises(RuntimeError, match="no readable sample"):
        list(ds)
