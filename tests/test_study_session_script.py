"""scripts/study_session.sh, driven with a stand-in interpreter in a scratch repository: one study process per
list of cells, one thread each, and commits that hold the records (and the regenerated report), nothing else."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "study_session.sh"

# what the script runs as PY: `-m recipes.study run ... --cells A B` records one run in A's records and logs its
# arguments and thread count; `-m recipes.study report ...` rewrites the results page; `-c` is real Python
FAKE_PY = f"""#!{sys.executable}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
if args[0] == "-c":
    sys.argv = ["-c", *args[2:]]
    exec(args[1])
    raise SystemExit
assert args[:2] == ["-m", "recipes.study"], args
if args[2] == "run":
    cell = args[args.index("--cells") + 1]
    path = Path("docs/results/study/v0.3") / f"{{cell}}.json"
    records = json.loads(path.read_text())
    records["runs"][f"run{{len(records['runs'])}}"] = {{"name": "x"}}
    path.write_text(json.dumps(records))
    print("ran", " ".join(args[2:]), "threads", os.environ.get("OMP_NUM_THREADS"))
elif args[2] == "report":
    Path("docs/results.md").write_text("table regenerated\\n")
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def scratch(tmp_path):
    if shutil.which("git") is None or shutil.which("bash") is None:
        pytest.skip("needs git and bash")
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts")
    records = repo / "docs" / "results" / "study" / "v0.3"
    records.mkdir(parents=True)
    for cell in ("alpha", "beta", "gamma"):
        (records / f"{cell}.json").write_text(json.dumps({"runs": {}}))
    (records / "verify.json").write_text("{}")  # the study's other JSON: no runs of its own
    (repo / "docs" / "results.md").write_text("old table\n")
    (repo / "README.md").write_text("readme\n")
    (repo / "notes.md").write_text("work in progress\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "start")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    return repo, fake


def run_script(repo: Path, fake: Path, *args: str, commit_every: str = "1") -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": str(fake), "COMMIT_EVERY": commit_every, "LOGS": str(repo / "outputs" / "logs")}
    return subprocess.run(["bash", "scripts/study_session.sh", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)


def test_one_process_per_cell_list_and_a_commit_of_the_records_only(scratch):
    repo, fake = scratch
    (repo / "notes.md").write_text("edited, not for the study's commit\n")
    (repo / "docs" / "results" / "study" / "v0.3" / "verify.json").write_text('{"alpha": {}}')
    done = run_script(repo, fake, "08:30", "alpha gamma", "beta")
    assert done.returncode == 0, done.stderr
    logs = repo / "outputs" / "logs"
    assert (logs / "core1.log").read_text().strip() == \
        "ran run --main-only --jobs 1 --finish-by 08:30 --cells alpha gamma threads 1"
    assert (logs / "core2.log").read_text().strip() == \
        "ran run --main-only --jobs 1 --finish-by 08:30 --cells beta threads 1"
    assert git(repo, "log", "-1", "--format=%s") == \
        "study records: alpha 1 runs; beta 1 runs; verify.json updated; table, plots and results page regenerated"
    assert sorted(git(repo, "show", "--name-only", "--format=", "HEAD").split()) == [
        "docs/results.md", "docs/results/study/v0.3/alpha.json", "docs/results/study/v0.3/beta.json",
        "docs/results/study/v0.3/verify.json"]
    assert git(repo, "status", "--porcelain", "--", "notes.md") == "M notes.md"  # left as it was


def test_without_commit_every_nothing_is_committed(scratch):
    repo, fake = scratch
    done = run_script(repo, fake, "08:30", "alpha", commit_every="0")
    assert done.returncode == 0, done.stderr
    assert git(repo, "log", "-1", "--format=%s") == "start"
    assert "alpha.json" in git(repo, "status", "--porcelain")


def test_a_cell_given_to_two_processes_is_refused_before_anything_starts(scratch):
    repo, fake = scratch
    done = run_script(repo, fake, "08:30", "alpha beta", "beta gamma")
    assert done.returncode == 2 and "cells given to more than one process: beta" in done.stderr
    assert not (repo / "outputs" / "logs" / "core1.log").exists()
    assert git(repo, "status", "--porcelain", "--", "docs") == ""


def test_usage_without_cells(scratch):
    repo, fake = scratch
    done = run_script(repo, fake, "08:30")
    assert done.returncode == 2 and "bash scripts/study_session.sh UNTIL" in done.stdout
