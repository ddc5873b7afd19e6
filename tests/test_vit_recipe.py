"""recipes.vit_imagenet: short runs on tiny generated data (folders, shards, digits), resume, export, DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipes.vit_imagenet import CONFIG_DIR, cli_main

from conftest import QUIET_CPU_TRAINER, printed_config, train_losses  # tests/ is on sys.path
from test_data_vision import make_folder, make_shards  # tests/ is on sys.path (rootdir import mode)

REPO = Path(__file__).resolve().parents[1]
# A one-block model keeps each run to seconds on 2 CPU cores.
TINY_MODEL = '{"depth": 1, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2.0, "patch_size": 4}'


def _write_config(path: Path, data: str, model: str = "diffvit_nano_patch7_28", extra: str = "") -> Path:
    path.write_text(f"""
seed_everything: 0
model:
  model: {model}
  model_kwargs: {TINY_MODEL}
  lr: 0.003
  warmup_epochs: 0
{data}
{QUIET_CPU_TRAINER}
{extra}
""")
    return path


def _folder_data(root: Path) -> str:
    return f"""data:
  class_path: diffzoo.data.ImageFolderDataModule
  init_args:
    data_dir: {root}
    img_size: 16
    batch_size: 12
    num_workers: 0
    auto_augment: null
    re_prob: 0.0"""


def test_two_steps_on_image_folders_reduce_the_loss(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = make_folder(tmp_path / "ds")
    cfg = _write_config(tmp_path / "c.yaml", _folder_data(root))
    cli = cli_main(["fit", "--config", str(cfg), "--trainer.max_steps", "2"])
    assert cli.trainer.global_step == 2
    assert cli.model.model.patch_embed.img_size == (16, 16) and cli.model.hparams.num_classes == 3
    losses = train_losses(cli.trainer.log_dir)
    assert len(losses) == 2 and losses[1] < losses[0]
    summary = json.loads(Path(cli.trainer.log_dir, "summary.json").read_text())
    assert 0.0 <= summary["metrics"]["val/top1"] <= 1.0


def test_two_steps_on_shards_reduce_the_loss(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_shards(tmp_path / "train", n_shards=2, per_shard=6)
    make_shards(tmp_path / "val", n_shards=1, per_shard=6)
    data = f"""data:
  class_path: diffzoo.data.ShardDataModule
  init_args:
    train_shards: {tmp_path}/train/shard-{{000..001}}.tar
    val_shards: {tmp_path}/val/shard-000.tar
    num_classes: 3
    train_samples: 12
    img_size: 16
    batch_size: 12
    num_workers: 0
    shuffle_buffer: 1
    auto_augment: null
    re_prob: 0.0"""
    cfg = _write_config(tmp_path / "c.yaml", data, model="softvit_nano_patch7_28")
    cli = cli_main(["fit", "--config", str(cfg), "--trainer.max_steps", "2"])
    assert cli.trainer.global_step == 2
    losses = train_losses(cli.trainer.log_dir)
    assert len(losses) == 2 and losses[1] < losses[0]


def _digits_config(tmp_path: Path) -> Path:
    data = """data:
  class_path: diffzoo.data.DigitsDataModule
  init_args:
    limit: 300
    num_val: 100
    batch_size: 50
    augment: true"""
    return _write_config(tmp_path / "digits.yaml", data)


def test_resume_continues_exactly(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _digits_config(tmp_path)
    straight = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "2"])
    assert straight.trainer.global_step == 8  # 200 digits / 50 per batch, 2 epochs
    # The same 2-epoch run, stopped after its first epoch (as if killed), then resumed.
    import lightning.pytorch as pl

    class StopAfterFirstEpoch(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = True

    first = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "2"], run=False)
    first.trainer.callbacks.append(StopAfterFirstEpoch())
    first.trainer.fit(first.model, datamodule=first.datamodule)
    assert first.trainer.global_step == 4
    ckpts = sorted(Path(first.trainer.log_dir, "checkpoints").glob("*.ckpt"))
    assert [p.name for p in ckpts] == ["epoch000-step0000004.ckpt", "last.ckpt"]
    last = Path(first.trainer.log_dir, "checkpoints", "last.ckpt")
    resumed = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "2", "--ckpt_path", str(last)])
    assert resumed.trainer.global_step == 8 and resumed.trainer.current_epoch == 2
    sched = resumed.trainer.lr_scheduler_configs[0].scheduler
    assert sched.last_epoch == 8  # the schedule continued, not restarted
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), f"{k} differs after resume"
    assert train_losses(resumed.trainer.log_dir)[-4:] == pytest.approx(train_losses(straight.trainer.log_dir)[-4:], abs=1e-5)

    # export: the safetensors file reloads through timm and gives the same logits
    from diffzoo.weights import export_checkpoint, load_exported

    summary = json.loads(Path(resumed.trainer.log_dir, "summary.json").read_text())
    model = load_exported(summary["safetensors"]).eval()
    x = torch.randn(4, 1, 28, 28)
    task = resumed.model.eval()
    assert torch.allclose(model(x), task(x), atol=1e-6)
    from_ckpt = load_exported(export_checkpoint(summary["last_checkpoint"], tmp_path / "m.safetensors")).eval()
    assert torch.allclose(from_ckpt(x), task(x), atol=1e-6)


def test_fit_ends_with_a_test_score_only_on_a_test_split(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _digits_config(tmp_path)
    held = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "1", "--data.init_args.num_test", "100"])
    metrics = json.loads(Path(held.trainer.log_dir, "summary.json").read_text())["metrics"]
    assert 0.0 <= metrics["test/top1"] <= 1.0 and "val/top1" in metrics
    # scored on the test digits with the final weights
    held.model.eval()
    x, y = held.datamodule.test_set.tensors
    with torch.no_grad():
        expect = float((held.model(x).argmax(-1) == y).float().mean())
    assert metrics["test/top1"] == pytest.approx(expect, abs=1e-6)
    plain = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "1"])  # no test split: no test score
    assert "test/top1" not in json.loads(Path(plain.trainer.log_dir, "summary.json").read_text())["metrics"]
    off = cli_main(["fit", "--config", str(cfg), "--trainer.max_epochs", "1", "--data.init_args.num_test", "100",
                    "--test_after_fit", "false"])
    assert "test/top1" not in json.loads(Path(off.trainer.log_dir, "summary.json").read_text())["metrics"]


def test_print_config_and_default_config(capsys) -> None:
    out = printed_config(cli_main, capsys)
    assert "diffvit_nano_patch7_28" in out and "DigitsDataModule" in out and "max_epochs: 15" in out


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIG_DIR.glob("vit_*.yaml")))
def test_every_config_instantiates(config: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = make_folder(tmp_path / "ds")
    make_shards(tmp_path / "shards", n_shards=2)
    overrides = {
        "ImageFolderDataModule": ["--data.data_dir", str(root)],
        "ShardDataModule": ["--data.train_shards", str(tmp_path / "shards/shard-{000..001}.tar"),
                            "--data.val_shards", str(tmp_path / "shards/shard-000.tar")],
    }
    text = (CONFIG_DIR / config).read_text()
    args = ["--config", str(CONFIG_DIR / config)]
    for key, extra in overrides.items():
        if key in text:
            args += extra
    cli = cli_main(["fit", *args], run=False)
    assert cli.model.model(torch.zeros(1, cli.model.hparams.in_chans, *cli.model.model.patch_embed.img_size)).shape[-1] \
        == cli.datamodule.num_classes


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path: Path) -> None:
    cfg = _digits_config(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "recipes.vit_imagenet", "--config", str(cfg), "--trainer.max_epochs", "1",
           "--trainer.strategy", "ddp", "--trainer.devices", "2"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(next(tmp_path.glob("outputs/vit_imagenet/version_*/summary.json")).read_text())
    assert summary["global_step"] == 2  # 200 digits over 2 processes, 50 per batch
    assert "val/top1" in summary["metrics"]
    assert "sync_dist=True" not in proc.stderr  # every epoch-level value is reduced over the processes
    assert summary["metrics"]["train/loss_epoch"] > 0
