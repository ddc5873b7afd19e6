"""The README's main job, run as a user runs it, lands inside the spread the README documents."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_main_job_lands_in_the_documented_spread(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    spread = re.search(r"Over seeds 0-4 .*?: ([\d.]+) ± ([\d.]+) %", readme, re.S)
    assert spread, "the README no longer documents the main job's spread over seeds"
    mean, sd = float(spread.group(1)), float(spread.group(2))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-m", "recipes.vit_imagenet"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    top1 = re.search(r"^val/top1: ([\d.]+) %", done.stdout, re.M)
    run = re.search(r"^run: seed (\d+), (\d+) torch threads", done.stdout, re.M)
    assert top1 and run, done.stdout[-2000:]
    assert run.group(1) == "0"
    assert mean - 3 * sd <= float(top1.group(1)) <= mean + 3 * sd, (top1.group(1), mean, sd, run.group(2))
