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

# what the script runs as PY: `-m recipes.study run ... --cells A B` records one run in A's records (with
# FAKE_SLOW set: a second one FAKE_SLOW seconds later) and logs its arguments and thread count;
# `-m recipes.study report ...` rewrites the results page with the number of runs it read (with
# FAKE_RUN_DURING_REPORT set, the first report also adds a run to beta's records, as a run ending while the
# report is made would); `-c` is real Python
FAKE_PY = f"""#!{sys.executable}
import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
if args[0] == "-c":
    sys.argv = ["-c", *args[2:]]
    exec(args[1])
    raise SystemExit
assert args[:2] == ["-m", "recipes.study"], args
folder = Path("docs/results/study/v0.3")
def add_run(cell):
    path = folder / f"{{cell}}.json"
    records = json.loads(path.read_text())
    records["runs"][f"run{{len(records['runs'])}}"] = {{"name": "x"}}
    path.write_text(json.dumps(records))
if args[2] == "run":
    cell = args[args.index("--cells") + 1]
    add_run(cell)
    if os.environ.get("FAKE_SLOW"):
        time.sleep(float(os.environ["FAKE_SLOW"]))
        add_run(cell)
    print("ran", " ".join(args[2:]), "threads", os.environ.get("OMP_NUM_THREADS"))
elif args[2] == "report":
    n = sum(len(json.loads(p.read_text()).get("runs", {{}})) for p in folder.glob("*.json"))
    Path("docs/results.md").write_text(f"table from {{n}} runs\\n")
    marker = Path("outputs/report-ran")
    if os.environ.get("FAKE_RUN_DURING_REPORT") and not marker.exists():
        marker.parent.mkdir(exist_ok=True)
        marker.touch()
        add_run("beta")
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


def run_script(repo: Path, fake: Path, *args: str, commit_every: str = "1", **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": str(fake), "COMMIT_EVERY": commit_every, "LOGS": str(repo / "outputs" / "logs"),
           **extra}
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


def test_every_commit_that_adds_runs_holds_the_report_made_from_them(scratch):
    """A session cut off between commits leaves a commit whose results page is the report of its own records."""
    repo, fake = scratch
    done = run_script(repo, fake, "08:30", "alpha", commit_every="1s", FAKE_SLOW="6")
    assert done.returncode == 0, done.stderr
    subjects = git(repo, "log", "--format=%s", "HEAD~2..HEAD").splitlines()[::-1]
    assert subjects == ["study records: alpha 1 runs; table, plots and results page regenerated",
                        "study records: alpha 2 runs; table, plots and results page regenerated"], subjects
    assert git(repo, "log", "-1", "--format=%s", "HEAD~2") == "start"
    assert git(repo, "show", "HEAD~1:docs/results.md") == "table from 1 runs"
    assert git(repo, "show", "HEAD:docs/results.md") == "table from 2 runs"


def test_a_run_recorded_while_the_report_is_made_is_in_the_committed_report(scratch):
    repo, fake = scratch
    done = run_script(repo, fake, "08:30", "alpha", FAKE_RUN_DURING_REPORT="1")
    assert done.returncode == 0, done.stderr
    assert "records changed while the report was made (1), making it again" in done.stderr
    assert git(repo, "show", "HEAD:docs/results.md") == "table from 2 runs"
    assert git(repo, "log", "-1", "--format=%s") == \
        "study records: alpha 1 runs; beta 1 runs; table, plots and results page regenerated"


def test_a_run_landing_just_before_the_commit_waits_for_the_next_one(scratch, tmp_path):
    """The commit holds the records the report was made from: a run that lands after the report's check (here
    as `git commit` starts) stays in the working tree instead of being committed beside a report without it."""
    repo, fake = scratch
    real_git = shutil.which("git")
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(f"""#!/usr/bin/env bash
if [ "$1" = commit ] && [ ! -e outputs/landed ]; then
    touch outputs/landed
    {sys.executable} {tmp_path / "land.py"}
fi
exec {real_git} "$@"
""")
    wrapper.chmod(0o755)
    (tmp_path / "land.py").write_text("import json\n"
                                      "p = 'docs/results/study/v0.3/beta.json'\n"
                                      "d = json.load(open(p)); d['runs']['late'] = {}; json.dump(d, open(p, 'w'))\n")
    done = run_script(repo, fake, "08:30", "alpha", PATH=f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert (repo / "outputs" / "landed").exists()
    assert git(repo, "log", "-1", "--format=%s") == \
        "study records: alpha 1 runs; table, plots and results page regenerated"
    assert git(repo, "show", "HEAD:docs/results.md") == "table from 1 runs"
    assert json.loads(git(repo, "show", "HEAD:docs/results/study/v0.3/beta.json")) == {"runs": {}}
    # the late run is kept for the next commit, and the shared index matches the new commit
    assert git(repo, "diff", "--cached", "--name-only") == ""
    assert git(repo, "diff", "--name-only") == "docs/results/study/v0.3/beta.json"


def test_commit_every_must_be_minutes_or_seconds(scratch):
    repo, fake = scratch
    done = run_script(repo, fake, "08:30", "alpha", commit_every="5m")
    assert done.returncode == 2 and "COMMIT_EVERY must be whole minutes or seconds with an s (30s), not '5m'" \
        in done.stderr
    assert not (repo / "outputs" / "logs" / "core1.log").exists()


def test_jobs_puts_more_trainings_on_each_list(scratch):
    repo, fake = scratch
    done = run_script(repo, fake, "08:30", "alpha", commit_every="0", JOBS="2")
    assert done.returncode == 0, done.stderr
    assert (repo / "outputs" / "logs" / "core1.log").read_text().strip() == \
        "ran run --main-only --jobs 2 --finish-by 08:30 --cells alpha threads 1"


@pytest.mark.parametrize("jobs", ["0", "two", "-1"])
def test_jobs_must_be_a_positive_whole_number(scratch, jobs):
    repo, fake = scratch
    done = run_script(repo, fake, "08:30", "alpha", JOBS=jobs)
    assert done.returncode == 2 and f"JOBS must be a whole number of trainings at once (1 or more), not '{jobs}'" \
        in done.stderr
    assert not (repo / "outputs" / "logs" / "core1.log").exists()
