"""Helpers shared by the test modules: ``from conftest import rel_err`` (tests/ is on sys.path), and their
shared fixtures."""

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


def use_triton_interpreter() -> None:
    """Run Triton kernels in the CPU interpreter when there is no CUDA device.

    ``TRITON_INTERPRET=1`` only takes effect if it is set before triton is first imported in the process;
    a test module calls this before its own imports. When triton was imported earlier without it, the
    module's tests skip and :func:`run_module_in_interpreter` reruns the module in a fresh process.
    """
    import os
    import sys

    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"


def run_module_in_interpreter(module_file: str, markexpr: str = "not slow") -> None:
    """Run the test module ``module_file`` with pytest in a new process with the interpreter switched on."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", markexpr, str(Path(module_file).resolve())],
        cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout


@pytest.fixture
def deadline_reset():
    """--finish-by and its finishing state are process-wide: cleared after the test, whatever happens."""
    from diffzoo.study import runs

    yield
    runs.finish_by(None)
    runs._FINISHING.clear()
    runs._TOLD_TO_FINISH.clear()
