"""DiffCLIP through open_clip's own training script (``python -m recipes.open_clip_train``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("open_clip_train.main")

ROOT = Path(__file__).resolve().parents[1]


def _train(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "recipes.open_clip_train", "--model", "DiffCLIP-nano",
        "--train-data", str(tmp_path / "train-{000000..000001}.tar"), "--dataset-type", "webdataset",
        "--train-num-samples", "32", "--batch-size", "8", "--workers", "0", "--precision", "fp32",
        "--logs", str(tmp_path / "logs"), "--name", "run", "--warmup", "2", "--lr", "1e-3", "--seed", "0",
        "--save-frequency", "1", *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_open_clip_trainer_trains_and_resumes_diffclip(tmp_path):
    from diffzoo.data.image_text import write_image_text_shards

    rng = np.random.default_rng(0)
    pairs = [(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), f"a photo of the digit {i % 10}") for i in range(32)]
    write_image_text_shards(pairs, tmp_path / "train-%06d.tar", max_per_shard=16)

    _train(tmp_path, "--epochs", "1")
    ckpt_dir = tmp_path / "logs" / "run" / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["epoch_1.pt"]

    # open_clip's own resume: the second call picks up epoch_1.pt and trains epoch 2 only
    _train(tmp_path, "--epochs", "2", "--resume", "latest")
    log = (tmp_path / "logs" / "run" / "out.log").read_text()
    assert "Start epoch 1" in log and log.count("Start epoch 0") == 1
    ckpt = torch.load(ckpt_dir / "epoch_2.pt", map_location="cpu", weights_only=True)
    assert ckpt["epoch"] == 2

    # the checkpoint is an ordinary open_clip checkpoint of the registered config
    import open_clip

    import diffzoo  # noqa: F401

    model = open_clip.create_model("DiffCLIP-nano", pretrained=str(ckpt_dir / "epoch_2.pt"))
    state = model.state_dict()
    assert set(state) == set(ckpt["state_dict"])
    assert all(torch.equal(state[k], v) for k, v in ckpt["state_dict"].items())
    first = torch.load(ckpt_dir / "epoch_1.pt", map_location="cpu", weights_only=True)["state_dict"]
    assert any(not torch.equal(first[k], v) for k, v in ckpt["state_dict"].items())  # epoch 2 trained

    # ... and scores through diffzoo's evaluator, streaming the shards (no length known up front)
    from recipes.clip_zeroshot import main as zeroshot_main

    report = zeroshot_main([
        "--model", "DiffCLIP-nano", "--checkpoint", str(ckpt_dir / "epoch_2.pt"),
        "--shards", str(tmp_path / "train-{000000..000001}.tar"), "--no-progress",
        "--out", str(tmp_path / "zs.json"),
    ])
    shards = report["results"]["shards"]
    assert shards["n"] == 32 and shards["skipped"] == 0
    assert 0.0 <= shards["i2t_r1"] <= shards["i2t_r5"] <= shards["i2t_r10"] <= 1.0
    assert json.loads((tmp_path / "zs.json").read_text())["results"]["shards"] == shards
