"""A training cut short by a stop of the study goes on from its interrupted checkpoint on the next call: the
records get the same run as without the stop (checked with real processes), its wall time summed over the
attempts; anything that could make the resumed run differ (other command, other training code, a checkpoint or
metrics changed since the stop, a family not checked to resume exactly) starts the run over instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffzoo.study import sweep
from diffzoo.study.provenance import same_training_code

REPO = Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(root: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return _git(root, "rev-parse", "HEAD")


def test_same_training_code_across_records_commits_but_not_across_training_changes(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    first = _commit(root, {"diffzoo/layers.py": "a = 1\n", "recipes/lm.py": "b = 1\n", "docs/x.json": "{}"}, "one")
    records = _commit(root, {"docs/x.json": '{"runs": 1}', "diffzoo/study/sweep.py": "# harness\n"}, "records")
    training = _commit(root, {"diffzoo/layers.py": "a = 2\n"}, "training change")

    def stamp(commit, changed=(), torch="2.11.0"):
        return {"commit": commit, "changed": list(changed), "torch": torch, "lightning": "2.6.6"}

    assert same_training_code(stamp(first), stamp(first), root)
    assert same_training_code(stamp(first), stamp(records), root)  # records and harness only in between
    assert same_training_code(stamp(first, ["diffzoo/study/plan.py"]), stamp(records), root)
    assert not same_training_code(stamp(records), stamp(training), root)  # a training file changed
    assert not same_training_code(stamp(first, ["recipes/lm.py"]), stamp(first), root)  # uncommitted then
    assert not same_training_code(stamp(first), stamp(first, ["diffzoo/layers.py"]), root)  # uncommitted now
    assert not same_training_code(stamp(first), stamp(first, torch="2.10.0"), root)
    machine = {"cpu": "AVX512", "cpu_model": "X", "threads": 1}
    assert same_training_code({**stamp(first), **machine}, {**stamp(records), **machine}, root)
    assert not same_training_code({**stamp(first), **machine}, {**stamp(first), **machine, "cpu": "AVX2"}, root)
    assert not same_training_code({**stamp(first), **machine}, {**stamp(first), **machine, "threads": 2}, root)
    assert not same_training_code(stamp(None), stamp(None), root)  # no git: cannot tell
    assert not same_training_code(stamp("0" * 40), stamp(first), root)  # a commit git does not know
    # a file only another recipe imports (provenance.ONLY_FOR) changes nothing for this one
    speech_only, vit, speech = "diffzoo/data/synth.py", "recipes.vit_imagenet", "recipes.speech_commands"
    synth = _commit(root, {speech_only: "v = 2\n"}, "speech data change")
    assert same_training_code(stamp(training), stamp(synth), root, vit)
    assert not same_training_code(stamp(training), stamp(synth), root, speech)
    assert not same_training_code(stamp(training), stamp(synth), root)  # recipe unknown: every file counts
    assert same_training_code(stamp(synth, [speech_only]), stamp(synth), root, vit)
    assert not same_training_code(stamp(synth, [speech_only]), stamp(synth), root, speech)
    assert not same_training_code(stamp(first), stamp(synth), root, vit)  # layers.py changed in between as well


STAMP = {"commit": "c" * 40, "changed": [], "torch": "2.11.0", "lightning": "2.6.6"}


def _save_interrupted(out: Path, name: str) -> None:
    """What a recipe leaves on SIGTERM: an interrupted checkpoint and metrics, in a new version folder of the run."""
    folder = out / "runs" / name
    version = folder / f"version_{len(list(folder.glob('version_*'))) if folder.is_dir() else 0}"
    (version / "checkpoints").mkdir(parents=True)
    (version / "checkpoints" / "interrupted.ckpt").write_bytes(b"weights")
    (version / "metrics.csv").write_text("epoch,step\n0,1\n")


def _stopping_train(out: Path, stop: set[str], calls: list, state: dict):
    """A stand-in for ``train``: a run named in ``stop`` saves an interrupted checkpoint and metrics the way a
    recipe does on SIGTERM, while the study is stopping, and fails; any other run finishes in 2 s."""
    def train(command, log, append=False, until=None):
        name = command[command.index("--trainer.logger.init_args.name") + 1]
        ckpt = command[command.index("--ckpt_path") + 1] if "--ckpt_path" in command else None
        calls.append((name, ckpt, append))
        if name in stop:
            stop.discard(name)
            _save_interrupted(out, name)
            state["stopping"] = True
            raise RuntimeError(f"training failed (exit 143); see {log}")
        return 2.0
    return train


@pytest.fixture
def fake_study(tmp_path, monkeypatch):
    state = {"stopping": False}
    monkeypatch.setattr(sweep, "stopping", lambda: state["stopping"])
    monkeypatch.setattr(sweep, "code_stamp", lambda: dict(STAMP))
    monkeypatch.setattr(sweep, "same_training_code", lambda then, now, root, recipe=None: then == now)
    monkeypatch.setattr(sweep, "read_run", lambda folder, curves, steps=False: {
        "summary": {"metrics": {"val/loss": 1.5}}, "curves": {}})
    return state


def _argv(out: Path, family: str = "lm") -> list[str]:
    return ["--family", family, "--variants", "softmax", "--lrs", "1e-3", "--seeds", "2", "--final-seeds", "0",
            "--extend", "0", "--out", str(out)]


def test_a_stopped_run_goes_on_from_its_checkpoint_with_its_time_summed(tmp_path, monkeypatch, fake_study):
    out, calls = tmp_path / "sw", []
    monkeypatch.setattr(sweep, "train", _stopping_train(out, {"softmax_lr0.001_seed1"}, calls, fake_study))
    with pytest.raises(RuntimeError, match="exit 143"):
        sweep.main(_argv(out))
    note = out / "runs" / "softmax_lr0.001_seed1.stopped.json"
    held = json.loads(note.read_text())
    assert held["code"] == STAMP and len(held["seconds"]) == 1 and held["seconds"][0] >= 0
    assert held["checkpoint"].endswith("version_0/checkpoints/interrupted.ckpt")
    saved = json.loads((out / "results.json").read_text())["runs"]
    assert list(saved) == ["softmax_lr0.001_seed0"]  # the stopped run is not a result

    fake_study["stopping"] = False
    calls.clear()
    res = sweep.main(_argv(out))
    assert calls == [("softmax_lr0.001_seed1", held["checkpoint"], True)]  # resumed, its log appended to
    run = res["runs"]["softmax_lr0.001_seed1"]
    assert run["attempts"] == 2 and run["seconds"] == pytest.approx(2.0 + held["seconds"][0])
    assert "attempts" not in res["runs"]["softmax_lr0.001_seed0"] and not note.exists()


def test_a_stopped_run_starts_over_when_anything_changed_since_the_stop(tmp_path, monkeypatch, fake_study):
    out, calls = tmp_path / "sw", []
    stop = set()
    monkeypatch.setattr(sweep, "train", _stopping_train(out, stop, calls, fake_study))

    def stopped_then_rerun(change) -> tuple:
        stop.add("softmax_lr0.001_seed0")
        calls.clear()
        (out / "results.json").unlink(missing_ok=True)
        fake_study["stopping"] = False
        with pytest.raises(RuntimeError):
            sweep.main([*_argv(out), "--seeds", "1"])
        assert (out / "runs" / "softmax_lr0.001_seed0.stopped.json").is_file()
        change()
        fake_study["stopping"] = False
        sweep.main([*_argv(out), "--seeds", "1"])
        return calls[-1]

    def metrics_written():  # a training killed outright after the note appended to its metrics
        version = max((out / "runs" / "softmax_lr0.001_seed0").glob("version_*"), key=lambda p: int(p.name[8:]))
        time.sleep(0.01)
        with open(version / "metrics.csv", "a") as f:
            f.write("0,2\n")

    assert stopped_then_rerun(metrics_written) == ("softmax_lr0.001_seed0", None, False)
    def other_code():
        monkeypatch.setattr(sweep, "code_stamp", lambda: {**STAMP, "commit": "d" * 40})

    assert stopped_then_rerun(other_code) == ("softmax_lr0.001_seed0", None, False)
    last = stopped_then_rerun(lambda: None)  # nothing changed since the stop: this one goes on
    assert last[0] == "softmax_lr0.001_seed0" and last[1] is not None and last[2]

    # a family whose resume is not exact (cluttered digits) notes nothing and always starts over
    out = tmp_path / "cl"
    monkeypatch.setattr(sweep, "train", _stopping_train(out, {"softmax_lr0.001_seed0"}, calls, fake_study))
    fake_study["stopping"] = False
    with pytest.raises(RuntimeError):
        sweep.main([*_argv(out, "cluttered"), "--seeds", "1"])
    assert not list((out / "runs").glob("*.stopped.json"))
    fake_study["stopping"] = False
    calls.clear()
    sweep.main([*_argv(out, "cluttered"), "--seeds", "1"])
    assert calls == [("softmax_lr0.001_seed0", None, False)]


def _sweep_command(family: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "recipes.sweep", "--family", family, "--variants", "diff", "--lrs", "2e-3",
            "--seeds", "1", "--final-seeds", "0", "--extend", "0", "--quick", "--out", str(out),
            "--trainer.max_epochs", "4", "--trainer.limit_train_batches", "16", "--trainer.limit_val_batches", "2"]


_SLOW = pytest.mark.slow


@pytest.mark.parametrize("family", ["lm", *(pytest.param(f, marks=_SLOW) for f in ("vit", "clip", "speech", "needle"))])
def test_a_study_stopped_by_sigterm_records_the_same_run_as_an_uninterrupted_one(tmp_path, family):
    """Real processes, for each family that resumes (``Family.resumes_exactly``; the LM here, the others with
    ``-m slow``): the study gets SIGTERM while its training is in its second epoch, the next call resumes it, and
    the record matches an uninterrupted run's: validation curve, every final metric, the gradient norms (less the
    readings a resumed run repeats only after its next measurement)."""
    from diffzoo.study.families import FAMILIES
    from diffzoo.study.provenance import HARNESS
    from diffzoo.study.runs import code_stamp

    assert FAMILIES[family].resumes_exactly
    stamp = code_stamp()
    if stamp["commit"] is None or any(not c.startswith(HARNESS) for c in stamp["changed"]):
        pytest.skip("no git checkout, or uncommitted changes to training code: a study resumes no run across those")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    subprocess.run(_sweep_command(family, straight), cwd=tmp_path, env=env, check=True, capture_output=True,
                   timeout=600)

    proc = subprocess.Popen(_sweep_command(family, stopped), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log = stopped / "runs" / "diff_lr0.002_seed0.log"
    deadline = time.time() + 300
    while not (log.is_file() and "epoch 1/4" in log.read_text()):
        assert proc.poll() is None and time.time() < deadline, "the training ended before it could be stopped"
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "stopped by signal 15" in output
    assert "Stopped by SIGTERM at step" in log.read_text()
    assert not (stopped / "results.json").is_file() or not json.loads(
        (stopped / "results.json").read_text()).get("runs")

    done = subprocess.run(_sweep_command(family, stopped), cwd=tmp_path, env=env, check=True, capture_output=True,
                          text=True, timeout=600)
    assert "resuming diff_lr0.002_seed0 from" in done.stdout
    a = json.loads((straight / "results.json").read_text())["runs"]["diff_lr0.002_seed0"]
    b = json.loads((stopped / "results.json").read_text())["runs"]["diff_lr0.002_seed0"]
    assert b["attempts"] == 2 and "attempts" not in a
    assert b["summary"]["global_step"] == a["summary"]["global_step"] > 16
    assert b["summary"]["metrics"] == a["summary"]["metrics"]
    metric = FAMILIES[family].val_metric
    assert b["curves"][metric] == a["curves"][metric] and len(a["curves"][metric]) == 4
    norms_a, norms_b = a["curves"]["train/grad_norm"], b["curves"]["train/grad_norm"]
    assert all(point in norms_a for point in norms_b) and len(norms_b) >= len(norms_a) - 10
    assert not list((stopped / "runs").glob("*.stopped.json"))


_TRAINING = """import pathlib, signal, sys, time
saved, code, seconds = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def stop(signum, frame):  # as a recipe does on SIGTERM: save, then exit
    saved.write_text("checkpoint")
    sys.exit(code)
signal.signal(signal.SIGTERM, stop if code >= 0 else signal.SIG_IGN)
time.sleep(seconds)
"""


def test_train_pauses_a_training_still_running_at_its_until_time(tmp_path, deadline_reset):
    """Real processes: a training still running at ``until`` gets SIGTERM, saves and exits, and ``train`` raises
    Paused (and lets nothing start after it); one that ends before ``until``, or exits cleanly on that SIGTERM (it
    had just finished), is a finished training; one that ignores SIGTERM is killed after the grace time."""
    from diffzoo.study import runs

    script = tmp_path / "training.py"
    script.write_text(_TRAINING)

    def command(code: int, seconds: float) -> list[str]:
        return [sys.executable, str(script), str(tmp_path / "saved"), str(code), str(seconds)]

    start = time.time()
    with pytest.raises(runs.Paused, match=r"^paused paused at --finish-by \d\d:\d\d after \d+ s; the next call"):
        runs.train(command(1, 60), tmp_path / "paused.log", until=time.time() + 1.5)
    assert 1.4 < time.time() - start < 30 and (tmp_path / "saved").read_text() == "checkpoint"
    assert runs._FINISHING.is_set() and not runs._LIVE
    runs._FINISHING.clear()

    (tmp_path / "saved").unlink()
    assert runs.train(command(1, 0.1), tmp_path / "quick.log", until=time.time() + 60) < 30
    assert not (tmp_path / "saved").exists() and not runs._FINISHING.is_set()
    assert runs.train(command(0, 60), tmp_path / "ended.log", until=time.time() + 1.5) < 30
    assert (tmp_path / "saved").is_file()

    proc = subprocess.Popen(command(-1, 60))
    time.sleep(0.5)  # its handler set
    proc.terminate()
    start = time.time()
    runs._wait_ended(proc, grace=1.0)
    assert proc.returncode == -signal.SIGKILL and time.time() - start < 30


def _pausing_train(out: Path, calls: list):
    """A stand-in for ``train``: the first run it is given pauses at its ``until`` (saving an interrupted
    checkpoint and metrics as a recipe does on SIGTERM, then Paused); any other finishes in 2 s. Like ``train``,
    it starts nothing once the study is finishing."""
    from diffzoo.study import runs

    def train(command, log, append=False, until=None):
        if runs._FINISHING.is_set():
            raise runs.Finishing("the study was told to finish")
        name = command[command.index("--trainer.logger.init_args.name") + 1]
        ckpt = command[command.index("--ckpt_path") + 1] if "--ckpt_path" in command else None
        calls.append((name, ckpt, append, until))
        if len(calls) == 1:
            _save_interrupted(out, name)
            runs._FINISHING.set()
            raise runs.Paused(f"{name} paused at --finish-by")
        return 2.0
    return train


def test_finish_by_pauses_a_run_that_resumes_and_the_next_call_goes_on_from_it(tmp_path, monkeypatch, fake_study,
                                                                               deadline_reset):
    """With 10 minutes left, an LM run (a family that resumes exactly) of unknown or any length starts with the
    limit as its pause time; paused there, it is noted, not recorded, nothing starts after it, and the next call
    goes on from its checkpoint. With less than 5 minutes left it does not start. A cluttered run (whose resume is
    not exact) gets no pause time and is held to the limit by its length, as before."""
    import datetime as dt

    from diffzoo.study import runs

    out, calls = tmp_path / "sw", []
    monkeypatch.setattr(sweep, "train", _pausing_train(out, calls))
    in_10_min = dt.datetime.now() + dt.timedelta(minutes=10)
    with pytest.raises(runs.Paused, match="softmax_lr0.001_seed0 paused at --finish-by"):
        sweep.main([*_argv(out), "--finish-by", in_10_min.isoformat(timespec="seconds"), "--run-minutes", "60"])
    assert len(calls) == 1 and calls[0][:3] == ("softmax_lr0.001_seed0", None, False)
    assert calls[0][3] == pytest.approx(in_10_min.replace(microsecond=0).timestamp())
    held = json.loads((out / "runs" / "softmax_lr0.001_seed0.stopped.json").read_text())
    assert held["checkpoint"].endswith("version_0/checkpoints/interrupted.ckpt") and len(held["seconds"]) == 1
    assert not (out / "results.json").is_file()  # nothing finished: no records

    runs.finish_by(None)
    runs._FINISHING.clear()
    res = sweep.main(_argv(out))
    assert calls[1:] == [("softmax_lr0.001_seed0", held["checkpoint"], True, None),
                         ("softmax_lr0.001_seed1", None, False, None)]
    assert res["runs"]["softmax_lr0.001_seed0"]["attempts"] == 2

    calls.clear()
    with pytest.raises(runs.Finishing, match=r"softmax_lr0.001_seed0: less than 5 min left before --finish-by"):
        sweep.main([*_argv(tmp_path / "late"), "--finish-by", "4m"])
    assert calls == []

    runs.finish_by(None)
    runs._FINISHING.clear()
    calls.append("the first call pauses: not this one")
    sweep.main([*_argv(tmp_path / "cl", "cluttered"), "--seeds", "1", "--finish-by", "10m", "--run-minutes", "1"])
    assert calls[1:] == [("softmax_lr0.001_seed0", None, False, None)]


def test_finish_by_names_every_run_it_paused_and_the_log_says_when_each_started(tmp_path, monkeypatch, capsys,
                                                                               fake_study, deadline_reset):
    """Two trainings at once (``--jobs 2``), both still running at the ``--finish-by`` time: the stop names both
    paused runs, not only the first in the job order, each keeps its note for the next call, and the output
    says when each fresh run started (a resumed one says it resumes)."""
    import datetime as dt
    import threading

    from diffzoo.study import runs

    out, calls = tmp_path / "sw", []
    both_started = threading.Barrier(2, timeout=10)

    def train(command, log, append=False, until=None):
        name = command[command.index("--trainer.logger.init_args.name") + 1]
        calls.append(name)
        both_started.wait()  # both are running when the time comes
        _save_interrupted(out, name)
        runs._FINISHING.set()
        raise runs.Paused(f"{name} paused at --finish-by")

    monkeypatch.setattr(sweep, "train", train)
    in_10_min = dt.datetime.now() + dt.timedelta(minutes=10)
    with pytest.raises(runs.Paused) as stop:
        sweep.main([*_argv(out), "--jobs", "2", "--finish-by", in_10_min.isoformat(timespec="seconds"),
                    "--run-minutes", "60"])
    names = ["softmax_lr0.001_seed0", "softmax_lr0.001_seed1"]
    assert sorted(calls) == names
    for name in names:
        assert f"{name} paused at --finish-by" in str(stop.value)
        assert (out / "runs" / f"{name}.stopped.json").is_file()
    printed = capsys.readouterr().out
    assert all(f"starting {name}\n" in printed for name in names), printed

    runs.finish_by(None)
    runs._FINISHING.clear()
    monkeypatch.setattr(sweep, "train", lambda command, log, append=False, until=None: 2.0)
    sweep.main(_argv(out))
    printed = capsys.readouterr().out
    assert all(f"resuming {name} from " in printed and f"starting {name}" not in printed for name in names), printed
