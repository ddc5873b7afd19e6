"""Ctrl-C / SIGTERM: a resumable checkpoint at a clean step, the printed resume command, exact mid-epoch
resume, one log folder per run (a resumed run continues its own)."""

from __future__ import annotations

import csv
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from diffzoo.tasks.resume import ResumableLoader
from recipes._cli import command_without_ckpt_path, reserve_version

from test_lm_recipe import _write_config as _lm_config  # tests/ is on sys.path (rootdir import mode)
from test_vit_recipe import _digits_config

REPO = Path(__file__).resolve().parents[1]


class SignalAt(pl.Callback):
    """Sends this process ``signum`` once, as batch ``batch_idx`` of epoch ``epoch`` starts training."""

    def __init__(self, batch_idx: int, epoch: int = 0, signum: int = signal.SIGINT) -> None:
        self.batch_idx, self.epoch, self.signum = batch_idx, epoch, signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch_idx):
            os.kill(os.getpid(), self.signum)


def _rows(log_dir: str | Path) -> list[dict[str, str]]:
    with open(Path(log_dir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def _step_rows(log_dir: str | Path) -> list[tuple]:
    """Every metrics row except epoch-averaged training metrics (those of an interrupted epoch average only
    the batches trained after the resume)."""
    return [tuple(sorted((k, v) for k, v in r.items() if v))
            for r in _rows(log_dir) if not any(k.endswith("_epoch") and v for k, v in r.items())]


def _interrupt(cli_main, args: list[str], batch_idx: int, signum: int = signal.SIGINT, epoch: int = 0):
    """Run ``args`` in-process with a signal as batch ``batch_idx`` of ``epoch`` starts; returns (exit code, CLI)."""
    cli = cli_main(args, run=False)
    cli.trainer.callbacks.append(SignalAt(batch_idx, epoch, signum))
    with pytest.raises(SystemExit) as e:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return e.value.code, cli


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs from the uninterrupted run"


def test_sigint_mid_epoch_resumes_exactly_with_augmentation(tmp_path: Path, monkeypatch, capsys) -> None:
    """Digits with random shifts drawn from the global RNG in the main process: the resumed run trains on the
    same batches with the same shifts and dropout as the uninterrupted one, bit for bit."""
    from recipes.vit_imagenet import cli_main

    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(_digits_config(tmp_path)), "--trainer.max_epochs", "2"]
    straight = cli_main(args)
    assert straight.trainer.global_step == 8  # 4 batches per epoch

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the test process runs in the background
    code, first = _interrupt(cli_main, args, batch_idx=1, epoch=1)  # the order of epoch 1 differs from epoch 0's
    assert code == 128 + signal.SIGINT
    out = capsys.readouterr().out
    assert "Stopped by SIGINT at step 6, epoch 1 (after 2 of its batches)" in out
    run = Path(first.trainer.log_dir)
    ckpt = run / "checkpoints" / "interrupted.ckpt"
    assert ckpt.is_file() and f"resumable checkpoint: {ckpt}" in out
    command = re.search(r"Resume with: (.*)", out).group(1)
    assert command.endswith(f"--ckpt_path {ckpt}") and "-m recipes.vit_imagenet fit" in command
    assert signal.getsignal(signal.SIGINT) is before  # handlers given back

    resumed = cli_main(shlex.split(command)[3:])  # the printed command's arguments
    assert resumed.trainer.log_dir == str(run) and resumed.trainer.global_step == 8
    _assert_same_weights(straight.model, resumed.model)
    assert _step_rows(run) == _step_rows(straight.trainer.log_dir)  # one metrics history, as if never stopped
    assert not ckpt.exists()  # the finished run no longer needs it
    assert sorted(p.name for p in run.glob("config*.yaml")) == ["config-resume1.yaml", "config.yaml"]


@pytest.mark.parametrize("batch_idx, signum, stopped", [
    (0, signal.SIGINT, "Stopped by SIGINT at step 1, epoch 0 (after 2 of its batches)"),  # window (0, 1) ends
    (2, signal.SIGTERM, "Stopped by SIGTERM at step 2, the end of epoch 0"),  # batch 3 ends window and epoch
])
def test_stop_waits_for_the_accumulation_window_and_the_epoch_end(
    batch_idx: int, signum: int, stopped: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A signal inside a gradient-accumulation window stops after the window's optimizer step; when that step
    ends the epoch, after the epoch (validation, epoch checkpoint). Both resume exactly."""
    from recipes.lm import cli_main

    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(_lm_config(tmp_path)), "--trainer.max_epochs", "2",
            "--trainer.accumulate_grad_batches", "2"]
    straight = cli_main(args)
    assert straight.trainer.global_step == 4  # 4 batches per epoch, 2 per step

    code, cli = _interrupt(cli_main, args, batch_idx, signum)
    assert code == 128 + signum and stopped in capsys.readouterr().out
    resumed = cli_main([*args, "--ckpt_path", str(Path(cli.trainer.log_dir, "checkpoints", "interrupted.ckpt"))])
    assert resumed.trainer.global_step == 4
    _assert_same_weights(straight.model, resumed.model)
    assert _step_rows(resumed.trainer.log_dir) == _step_rows(straight.trainer.log_dir)


def test_shards_resume_mid_epoch_by_reading_again(tmp_path: Path, monkeypatch, capsys) -> None:
    """An iterable data set has no indices to skip: the resumed epoch reads the trained batches again (the
    message says so) and continues exactly."""
    from recipes.vit_imagenet import cli_main

    from test_data_vision import make_shards
    from test_vit_recipe import _write_config

    monkeypatch.chdir(tmp_path)
    make_shards(tmp_path / "train", n_shards=2, per_shard=12)
    make_shards(tmp_path / "val", n_shards=1, per_shard=6)
    init = {"train_shards": f"{tmp_path}/train/shard-{{000..001}}.tar", "val_shards": f"{tmp_path}/val/shard-000.tar",
            "num_classes": 3, "train_samples": 24, "img_size": 16, "batch_size": 6, "num_workers": 0,
            "shuffle_buffer": 8, "auto_augment": "null", "re_prob": 0.5}  # random erasing draws from the global RNG
    data = "data:\n  class_path: diffzoo.data.ShardDataModule\n  init_args:\n" + "".join(
        f"    {k}: {v}\n" for k, v in init.items())
    cfg = _write_config(tmp_path / "c.yaml", data)
    args = ["fit", "--config", str(cfg), "--trainer.max_epochs", "1"]
    straight = cli_main(args)
    code, first = _interrupt(cli_main, args, batch_idx=1)
    out = capsys.readouterr().out
    assert code == 130 and "reads the 2 batches already trained in this epoch again" in out
    resumed = cli_main([*args, "--ckpt_path", str(Path(first.trainer.log_dir, "checkpoints", "interrupted.ckpt"))])
    assert resumed.trainer.global_step == straight.trainer.global_step == 4
    _assert_same_weights(straight.model, resumed.model)


def _rng_collate(batch: list) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.stack([b[0] for b in batch])
    return x + torch.rand(x.shape), torch.randint(0, 1000, (len(x),))  # draws from the global RNG


class _Stream(IterableDataset):
    def __iter__(self):
        return iter((torch.full((2,), float(i)),) for i in range(24))


@pytest.mark.parametrize("ahead", [0, 1])
@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_resumable_loader_continues_the_interrupted_epoch(kind: str, ahead: int) -> None:
    """Unit check without Lightning: draw batches as Lightning's fetcher does (``ahead`` = 1: one batch ahead,
    as for loaders without a length), consume the RNG between batches like a training step, save the state
    after batch 2, disturb the RNG, resume, and compare every batch and the final RNG state."""
    ds = TensorDataset(torch.arange(48.0).view(24, 2)) if kind == "map" else _Stream()
    kwargs = dict(batch_size=4, collate_fn=_rng_collate)
    if kind == "map":
        kwargs["sampler"] = torch.utils.data.RandomSampler(ds)  # its order is drawn from the global RNG too
    position = [0, 0]

    def run(state: dict | None, stop_after: int | None):
        loader = ResumableLoader(DataLoader(ds, **kwargs), lambda: tuple(position))
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        buffer = [b for _, b in zip(range(ahead), it)]
        out, saved = [], None
        while True:
            if buffer:
                batch = buffer.pop(0)
                buffer += [b for _, b in zip(range(1), it)]
            elif (batch := next(it, None)) is None:
                break
            torch.rand(3)  # the training step's dropout
            out.append(batch)
            position[1] += 1
            if position[1] == stop_after:
                saved = loader.state_dict()
                break
        return out, saved, torch.rand(5)

    torch.manual_seed(0)
    whole, _, end_rng = run(None, None)
    assert len(whole) == 6
    position[:] = [0, 0]
    torch.manual_seed(0)
    head, state, _ = run(None, 2)
    assert state["batches"] == 2 and (state["next_rng"] is not None) == bool(ahead)
    torch.manual_seed(123)  # whatever happens to the RNG between stopping and resuming
    tail, _, tail_end_rng = run(state, None)
    assert len(head) == 2 and len(tail) == 4
    for (x, y), (xr, yr) in zip(whole, head + tail):
        assert torch.equal(x, xr) and torch.equal(y, yr)
    assert torch.equal(end_rng, tail_end_rng)


def test_run_folders(tmp_path: Path, monkeypatch) -> None:
    """Each run reserves a fresh version folder (so no two runs share one); naming an existing run's folder
    is refused with a message that says how to continue it instead."""
    (tmp_path / "lm" / "version_2").mkdir(parents=True)
    (tmp_path / "lm" / "version_notes").mkdir()
    assert [reserve_version(tmp_path / "lm") for _ in range(2)] == [3, 4]
    assert command_without_ckpt_path(["python", "-m", "recipes.lm", "--ckpt_path", "a.ckpt", "--ckpt_path=b",
                                      "--x", "1"]) == ["python", "-m", "recipes.lm", "--x", "1"]

    from recipes.lm import cli_main

    monkeypatch.chdir(tmp_path)
    cfg = str(_lm_config(tmp_path))
    a = cli_main(["fit", "--config", cfg, "--trainer.max_steps", "1"])
    b = cli_main(["fit", "--config", cfg, "--trainer.max_steps", "1"])
    assert Path(a.trainer.log_dir).name == "version_0" and Path(b.trainer.log_dir).name == "version_1"
    with pytest.raises(ValueError, match=r"version_0 already holds a run: leave --trainer.logger.init_args.version"):
        cli_main(["fit", "--config", cfg, "--trainer.logger.init_args.version", "0"], run=False)


@pytest.mark.slow
def test_real_sigterm_from_outside_then_the_printed_command(tmp_path: Path) -> None:
    """A separate process sends SIGTERM at whatever step the run has reached; the run exits 143 with a
    checkpoint, and the printed command finishes it with the weights of an uninterrupted run."""
    cfg = _lm_config(tmp_path, extra="  max_epochs: 4")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "recipes.lm", "--config", str(cfg), "--data.train_windows", "64"]
    straight = subprocess.run([*cmd, "--trainer.logger.init_args.name", "straight"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
    assert straight.returncode == 0, straight.stderr[-3000:]

    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoints = tmp_path / "outputs" / "lm" / "version_0" / "checkpoints"
    deadline = time.time() + 300
    while not (checkpoints / "last.ckpt").exists() and time.time() < deadline:  # the first epoch has ended
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    command = re.search(r"Resume with: (.*)", out).group(1)
    resumed = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    from safetensors.torch import load_file

    a = load_file(tmp_path / "outputs" / "straight" / "version_0" / "model.safetensors")
    b = load_file(tmp_path / "outputs" / "lm" / "version_0" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _step_rows(tmp_path / "outputs" / "lm" / "version_0") == _step_rows(tmp_path / "outputs/straight/version_0")
