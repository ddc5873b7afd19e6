"""Helpers shared by the test modules: ``from conftest import rel_err`` (tests/ is on sys.path)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# The trainer section of the recipes' short test runs: one CPU device, quiet, a log row every step.
QUIET_CPU_TRAINER = """trainer:
  accelerator: cpu
  devices: 1
  log_every_n_steps: 1
  num_sanity_val_steps: 0
  enable_progress_bar: false
  enable_model_summary: false"""


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of ``a`` from the reference ``b``, relative to ``b``'s largest magnitude."""
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def train_losses(log_dir: str | Path) -> list[float]:
    """The per-step training losses (``train/loss_step``) a recipe run wrote to ``<log_dir>/metrics.csv``."""
    with open(Path(log_dir) / "metrics.csv") as f:
        return [float(r["train/loss_step"]) for r in csv.DictReader(f) if r.get("train/loss_step")]


def printed_config(cli_main: Callable[[list[str]], object], capsys: pytest.CaptureFixture[str]) -> str:
    """What a recipe's ``cli_main(["--print_config"])`` prints; the command must exit with status 0."""
    with pytest.raises(SystemExit) as e:
        cli_main(["--print_config"])
    assert e.value.code == 0
    return capsys.readouterr().out
