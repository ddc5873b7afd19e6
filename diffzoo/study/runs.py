"""Training runs of a study: each one ``python -m <recipe>`` in a fresh process, several at a time, and a
finished run read back from its log folder (summary, curves, divergence record, last logged values)."""

from __future__ import annotations

import contextlib
import csv
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CODE_PATHS = ("diffzoo", "recipes")  # what a training imports from this repository
FINAL_SEED = 100  # seeds of final runs start here; the grid's (0, 1, ...) never score the test set


def git(root: Path, *args: str) -> str:
    """The output of ``git -C root <args>`` (taking no optional lock: it runs beside commits of the records);
    RuntimeError when git is missing or the command fails."""
    try:
        done = subprocess.run(["git", "-C", str(root), "--no-optional-locks", *args], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"git {' '.join(args)} could not run in {root}: {e}") from e
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {root}: {done.stderr.strip()}")
    return done.stdout


def code_stamp(root: Path | None = None) -> dict:
    """What code trains a run: the repository's commit, the files under :data:`CODE_PATHS` that differ from it
    (changed, added or deleted, as ``git status`` lists them), the versions of torch and Lightning, and the machine
    (:func:`machine_stamp`). With no git checkout (an installed package) ``commit`` is None. Recorded with every
    run, so a later reader can tell whether a table's runs were trained by the code that is there now."""
    from importlib.metadata import PackageNotFoundError, version

    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    commit, changed = None, []
    try:  # only the checkout this package was imported from, not one around it
        if Path(git(root, "rev-parse", "--show-toplevel").strip()).resolve() == root.resolve():
            commit = git(root, "rev-parse", "HEAD").strip()
            status = git(root, "status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS)
            changed = sorted(line[3:] for line in status.splitlines())
    except RuntimeError:
        commit, changed = None, []
    versions = {}
    for package in ("torch", "lightning"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return {"commit": commit, "changed": changed, **versions, **machine_stamp()}


MACHINE_KEYS = ("cpu", "cpu_model", "threads")  # what machine_stamp adds to a code stamp: where a run was trained


def machine_stamp() -> dict:
    """What float rounding depends on besides the code: the vector instruction set torch's CPU kernels dispatch
    to (``cpu``: ``AVX2``, ``AVX512``, ...), the CPU's model name, and torch's thread count, which a training
    inherits from the environment that starts it (``OMP_NUM_THREADS``). The same code trains the same run bit for
    bit only where these agree too; a task whose training amplifies rounding (CLIP's) parts after some hundred
    steps where they differ."""
    import platform

    import torch

    model = platform.processor() or None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": torch.backends.cpu.get_cpu_capability(), "cpu_model": model, "threads": torch.get_num_threads()}


def recipe_command(recipe: str, out: Path, name: str, args: Sequence[str]) -> list[str]:
    """``python -m <recipe> <args>`` logging CSV to ``out/name/version_N`` with no progress bar."""
    return [
        sys.executable, "-m", recipe, *args, "--trainer.logger.init_args.save_dir", str(out),
        "--trainer.logger.init_args.name", name, "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
    ]


def latest_log_dir(folder: Path) -> Path:
    """The newest ``version_N`` folder of a run."""
    versions = list(folder.glob("version_*"))
    if not versions:
        raise FileNotFoundError(f"no finished run in {folder} (no version_* folder)")
    return max(versions, key=lambda p: int(p.name.split("_")[1]))


def read_run(folder: Path, curves: Sequence[str], steps: bool = False) -> dict:
    """``{"summary", "curves"}`` of the newest run in ``folder``: ``summary.json`` and, per key of
    ``curves``, the values logged in ``metrics.csv`` (``[step, value]`` pairs with ``steps=True``)."""
    log_dir = latest_log_dir(folder)
    out: dict[str, list] = {key: [] for key in curves}
    with open(log_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            for key in out:
                if row.get(key):
                    out[key].append([int(row["step"]), float(row[key])] if steps else float(row[key]))
    return {"summary": json.loads((log_dir / "summary.json").read_text()), "curves": out}


TEST_CLIPS_FILE = "test_clips.csv"  # as diffzoo.tasks.callbacks.clips writes it (not imported: no Lightning here)


def read_test_clips(folder: Path, snr_digits: int = 2) -> list[list] | None:
    """The per-clip test results of the newest run in ``folder`` (its ``test_clips.csv``) in a compact form:
    one ``[voice, snr_db, label, pred]`` per clip in the order of the clips' indices (``voice`` and ``snr_db``
    None where the clip has none, e.g. silence; ``snr_db`` rounded to ``snr_digits``). None when the run
    wrote no such file, or its rows are not the clips ``0 .. n-1`` (they could not be matched across runs)."""
    path = latest_log_dir(folder) / TEST_CLIPS_FILE
    if not path.is_file():
        return None
    with open(path) as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["index"]))
    if [int(r["index"]) for r in rows] != list(range(len(rows))):
        return None
    return [[r["voice"] or None, round(float(r["snr_db"]), snr_digits) if r["snr_db"] else None, int(r["label"]),
             int(r["pred"])] for r in rows]


def last_logged(metrics_csv: Path) -> dict[str, float]:
    """Every value of a ``metrics.csv`` as last logged (the columns ``epoch`` and ``step`` left out)."""
    values: dict[str, float] = {}
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            values.update({k: float(v) for k, v in row.items() if v not in (None, "") and k not in ("epoch", "step")})
    return values


def read_divergence(run_dir: Path) -> dict | None:
    """The divergence record a run left in its newest log folder
    (:data:`~diffzoo.tasks.callbacks.DIVERGENCE_FILE`), None if it has none."""
    from ..tasks.callbacks.guard import DIVERGENCE_FILE  # here: reading a study's results needs no Lightning

    try:
        div = latest_log_dir(run_dir) / DIVERGENCE_FILE
    except FileNotFoundError:
        return None
    return json.loads(div.read_text()) if div.is_file() else None


INTERRUPTED_CKPT = "interrupted.ckpt"  # as diffzoo.tasks.callbacks.InterruptCheckpoint names it (no Lightning here)
STOPPED_SUFFIX = ".stopped.json"  # beside a run's log: how to go on with a run a stop of the study cut short


def interrupted_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a training stopped part-way by SIGTERM or Ctrl-C left in the run's newest log folder (the
    recipes write it at a step the uninterrupted run passes through, and delete it when a run finishes), None if
    there is none."""
    try:
        ckpt = latest_log_dir(run_dir) / "checkpoints" / INTERRUPTED_CKPT
    except FileNotFoundError:
        return None
    return ckpt if ckpt.is_file() else None


def _stopped_note(log: Path) -> Path:
    return log.with_name(log.stem + STOPPED_SUFFIX)


def _files_state(ckpt: Path) -> dict:
    """What must not change between a stop and the resume: the checkpoint and the metrics logged up to it."""
    metrics = ckpt.parent.parent / "metrics.csv"
    return {"checkpoint": str(ckpt), "checkpoint_mtime_ns": ckpt.stat().st_mtime_ns,
            "metrics_mtime_ns": metrics.stat().st_mtime_ns if metrics.is_file() else None}


def note_stopped(run_dir: Path, log: Path, command: list[str], code: dict, since: float,
                 earlier: Sequence[float]) -> None:
    """After a stop of the study cut a training short: when that training saved its interrupted checkpoint (after
    ``since``, the attempt's start), note beside its log what :func:`resume_point` needs to go on from it (the
    command, the code stamp, the seconds of every attempt so far, the state of the checkpoint and metrics);
    otherwise drop any earlier note, so the run starts afresh."""
    note = _stopped_note(log)
    ckpt = interrupted_checkpoint(run_dir)
    if ckpt is None or ckpt.stat().st_mtime < since:
        note.unlink(missing_ok=True)
        return
    tmp = note.with_name(note.name + ".tmp")
    tmp.write_text(json.dumps({"command": list(command), "code": code,
                               "seconds": [*earlier, time.time() - since], **_files_state(ckpt)}, indent=1))
    tmp.replace(note)


def resume_point(run_dir: Path, log: Path, command: list[str],
                 same_code: Callable[[dict], bool]) -> tuple[Path | None, list[float]]:
    """Where a training cut short by a stop of the study goes on from: its interrupted checkpoint and the seconds
    of its earlier attempts, when :func:`note_stopped` noted them for the same command, ``same_code(noted code
    stamp)`` holds, and neither the checkpoint nor the metrics changed since (a training killed outright after
    the note leaves them changed); otherwise ``(None, [])``, and the run starts afresh in a new log folder."""
    note = _stopped_note(log)
    try:
        held = json.loads(note.read_text())
    except (OSError, ValueError):
        return None, []
    ckpt = interrupted_checkpoint(run_dir)
    if (ckpt is None or held.get("command") != list(command) or not same_code(held.get("code") or {})
            or {k: held.get(k) for k in ("checkpoint", "checkpoint_mtime_ns", "metrics_mtime_ns")} != _files_state(ckpt)):
        return None, []
    return ckpt, [float(s) for s in held.get("seconds", [])]


def forget_stopped(log: Path) -> None:
    """Drop the note of a run's earlier attempts (the run finished, or starts afresh)."""
    _stopped_note(log).unlink(missing_ok=True)


LOCK_SUFFIX = ".lock"  # beside a records file: held while a process may write those records
_HELD: set[Path] = set()  # records this process holds the lock of (a nested hold takes nothing more)


class RecordsBusy(RuntimeError):
    """Another process holds the lock of a records file (:func:`records_lock`)."""


@contextlib.contextmanager
def records_lock(records: Path) -> Iterator[None]:
    """Hold ``records``' lock (``<records>.lock``, an exclusive ``flock``) for the block: the process that trains
    into a records file is the only one that writes it. Each saves its whole copy of the records after every run,
    so two processes on one file would each drop the other's runs; the second one fails here at once, naming the
    first's pid, instead. Nested holds in one process are allowed; the kernel drops the lock when the process
    ends, however it ends. Without ``fcntl`` (Windows) nothing is locked."""
    records = Path(records).resolve()
    if records in _HELD:  # the outer hold releases it
        yield
        return
    try:
        import fcntl
    except ImportError:  # no flock: the caller's care alone keeps one process per records file
        yield
        return
    records.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(records.with_name(records.name + LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RecordsBusy(f"{records} is being trained into by another process (pid {holder}): two processes "
                              "on one records file would each overwrite the other's runs. Let it finish, stop it "
                              "(kill -USR1 <pid> ends it after its runs in flight), or give this command other "
                              "cells or another records file") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _HELD.add(records)
        try:
            yield
        finally:
            _HELD.discard(records)
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


_LIVE: set[subprocess.Popen] = set()  # training processes now running (stopped with the study: stop_trainings)
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by stop_trainings: no training starts after it
_FINISHING = threading.Event()  # set by finish_trainings: the trainings running finish, no other starts
_TOLD_TO_FINISH = threading.Event()  # set by SIGUSR1 alone: unlike a --finish-by stop, nothing starts again after it
_DEADLINE: list[float] = []  # set by finish_by: no training starts that would end after this Unix time
FINISH_BY_HELP = ("start no training that would end after WHEN (18:30, 2026-12-01T18:30, or 90m / 2h from now), "
                  "judged by the longest recorded run like it; the runs in flight finish and are recorded, as on "
                  "SIGUSR1, and the same command goes on from there later. A family whose runs resume exactly "
                  "(every one but cluttered and mqar) instead starts a run while 5 minutes are left and pauses it at "
                  "WHEN, at a checkpoint the next call goes on from (default: no limit)")  # --finish-by
PAUSABLE_START_SECONDS = 300.0  # a run that can pause at --finish-by starts only with this much time left


class Finishing(Exception):
    """Raised instead of starting a training once the study was told to finish (:func:`finish_trainings`)."""


class Paused(Finishing):
    """Raised when a training that resumes exactly was stopped at the ``--finish-by`` time (``train(until=)``): it
    saved its interrupted checkpoint, and the next call goes on from there."""


def train(command: list[str], log: Path, append: bool = False, until: float | None = None) -> float:
    """Run one training command with its output in ``log`` (added to its end with ``append``, for a run that goes
    on from an earlier attempt); returns the wall time. Fails loudly. With ``until`` (a Unix time) a training still
    running then is sent SIGTERM, as a stop of the study sends it (the recipes save a resumable checkpoint at their
    next clean step), and :class:`Paused` is raised once it has exited."""
    start = time.time()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a" if append else "w") as f:
        with _LIVE_LOCK:  # started under the lock, so stop_trainings either sees it or it never starts
            if _STOPPING.is_set():
                raise RuntimeError("the study is stopping: training not started")
            if _FINISHING.is_set():
                raise Finishing("the study was told to finish")
            proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT)
            _LIVE.add(proc)
        try:
            try:
                returncode = proc.wait(None if until is None else max(0.0, until - time.time()))
            except subprocess.TimeoutExpired:
                _FINISHING.set()  # past the limit: nothing else starts either
                proc.terminate()
                _wait_ended(proc)
                returncode = proc.returncode
                if returncode:  # stopped at its checkpoint (one that ended just then is a finished run)
                    raise Paused(f"{log.stem} paused at --finish-by {_clock(until)} after "
                                 f"{_said(time.time() - start)}; the next call goes on from the checkpoint it saved") from None
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    if returncode:
        raise RuntimeError(f"training failed (exit {returncode}); see {log}")
    return time.time() - start


def stopping() -> bool:
    """Whether the study was told to stop (:func:`stop_trainings`): a training that ends now was cut short."""
    return _STOPPING.is_set()


def stop_trainings(signum: int, frame: object) -> None:
    """Signal handler: terminate the training processes this study started (each saves a resumable checkpoint
    first: :func:`note_stopped`), start no more, then exit. Without it a ``kill`` of the study would leave its
    trainings running on, unrecorded."""
    with _LIVE_LOCK:
        _STOPPING.set()
        live = list(_LIVE)
    for proc in live:
        proc.terminate()
    for proc in live:
        _wait_ended(proc)
    raise SystemExit(f"stopped by signal {signum}; {len(live)} training(s) terminated (the records hold only "
                     "finished runs; the next call goes on with each terminated training from the checkpoint it "
                     "saved, or trains it again where it saved none)")


def _wait_ended(proc: subprocess.Popen, grace: float = 120.0) -> None:
    """Wait for a terminated training: it saves a checkpoint at its next clean step (after validation, if one is
    running); killed if it has not exited after ``grace`` seconds."""
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def finish_trainings(signum: int, frame: object) -> None:
    """Signal handler (SIGUSR1): the trainings now running go on to their end and are recorded as usual, none
    starts after them, and the command then exits (:func:`main_with_signals`). The way to end a session of the
    study without throwing away the hours its runs in flight have already trained."""
    _TOLD_TO_FINISH.set()
    _FINISHING.set()
    os.write(2, f"signal {signum}: finishing the trainings now running, starting no more\n".encode())


def carry_on_after_finish_by() -> bool:
    """After a :class:`Finishing` (the trainings that were running have finished and are recorded): whether other,
    shorter trainings may still start, each held to the ``--finish-by`` limit as before. True (and trainings may
    start again) when a ``--finish-by`` limit is set and the study was neither told to finish (SIGUSR1) nor to stop
    meanwhile; False otherwise, and nothing more starts."""
    if not _DEADLINE or _TOLD_TO_FINISH.is_set() or _STOPPING.is_set():
        return False
    _FINISHING.clear()
    return True


def parse_finish_by(text: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """The time a ``--finish-by`` value names, in local time: ``HH:MM`` (its next occurrence: ``06:00`` said at
    23:00 is tomorrow morning), ``YYYY-MM-DDTHH:MM[:SS]``, or a span from ``now``: ``90m``, ``2h``, ``1h30m``.
    ValueError naming the accepted forms for anything else, or for a date and time already past."""
    now = now or datetime.datetime.now()
    text = text.strip()
    span = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?", text)
    if span and text:
        return now + datetime.timedelta(hours=int(span[1] or 0), minutes=int(span[2] or 0))
    clock = re.fullmatch(r"(\d{1,2}):(\d{2})", text)
    if clock and int(clock[1]) < 24 and int(clock[2]) < 60:
        when = now.replace(hour=int(clock[1]), minute=int(clock[2]), second=0, microsecond=0)
        return when if when > now else when + datetime.timedelta(days=1)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--finish-by {text!r}: give a clock time (18:30), a date and time (2026-12-01T18:30) "
                         "or a span from now (90m, 2h, 1h30m)") from None
    if when.tzinfo is not None:
        when = when.astimezone().replace(tzinfo=None)
    if when <= now:
        raise ValueError(f"--finish-by {text!r}: that time has passed (it is {now:%Y-%m-%d %H:%M} now)")
    return when


def finish_by(when: datetime.datetime | None) -> None:
    """From now on (None: no longer) start no training that would end after ``when``: see
    :func:`check_time_left`. A study that must end by a set time (a session, a scheduler's wall-time limit) loses
    no hours to runs it would have to cut short."""
    _DEADLINE[:] = [] if when is None else [when.timestamp()]


def check_time_left(seconds: float | None, what: str, pausable: bool = False) -> float | None:
    """Called before a training starts. With a :func:`finish_by` time set, when ``what`` would take about
    ``seconds`` beyond it, the study finishes as on SIGUSR1 (:func:`finish_trainings`: the trainings running go
    on and are recorded, none starts) by raising :class:`Finishing`. A training of unknown length (``seconds``
    None: nothing like it recorded) is started while the time is ahead, and says so. A ``pausable`` training (one
    that resumes exactly) is started whatever its length while at least :data:`PAUSABLE_START_SECONDS` are left,
    and the time it must pause at is returned (for ``train(until=)``); None otherwise."""
    if not _DEADLINE:
        return None
    now, deadline = time.time(), _DEADLINE[0]
    if pausable:
        if now + PAUSABLE_START_SECONDS > deadline:
            _FINISHING.set()
            raise Finishing(f"{what}: less than {_said(PAUSABLE_START_SECONDS)} left before --finish-by "
                            f"{_clock(deadline)}")
        return deadline
    if seconds is None:
        if now >= deadline:
            _FINISHING.set()
            raise Finishing(f"{what}: --finish-by {_clock(deadline)} has passed")
        print(f"{what}: nothing like it recorded yet, so how long it takes is unknown; started anyway "
              f"(--finish-by {_clock(deadline)})", flush=True)
        return None
    if now + seconds > deadline:
        _FINISHING.set()
        raise Finishing(f"{what} takes about {_said(seconds)}, so it would end about {_clock(now + seconds)}, "
                        f"after --finish-by {_clock(deadline)}")
    return None


def _clock(t: float) -> str:
    """``t`` as a local clock time, with its date when that is not today."""
    when = datetime.datetime.fromtimestamp(t)
    return when.strftime("%H:%M" if when.date() == datetime.date.today() else "%Y-%m-%d %H:%M")


def _said(seconds: float) -> str:
    """A duration in the unit a reader would use: seconds, minutes, then hours."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def main_with_signals(main: Callable[[], object]) -> None:
    """Run a study command line (``main``) with its signals: SIGTERM and Ctrl-C (SIGINT) stop at once
    (:func:`stop_trainings`: the trainings cut short are not recorded, rather than recorded as failed), SIGUSR1
    finishes the trainings running first (:func:`finish_trainings`), as does a training that would end after a
    ``--finish-by`` time (:func:`check_time_left`). A study started with SIGINT ignored (a
    background job, ``nohup``) keeps ignoring it."""
    signal.signal(signal.SIGTERM, stop_trainings)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, stop_trainings)
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        signal.signal(signal.SIGUSR1, finish_trainings)
    try:
        main()
    except Paused as e:
        raise SystemExit(f"{e}: paused the trainings still running at their checkpoints (recorded once they finish) "
                         "and started no more. The same command resumes them and goes on from here.") from None
    except Finishing as e:
        raise SystemExit(f"{e}: finished the trainings that were running (recorded) and started no more. The same "
                         "command goes on from here.") from None


def progress_line(done: int, total: int, seconds: float) -> str:
    """How far a batch of runs has got, and how long the rest takes at the pace so far (wall time)."""
    return (f"progress: {done} of {total} runs, {_said(seconds)} so far"
            + (f", about {_said(seconds / done * (total - done))} left at this pace" if 0 < done < total else ""))


def run_jobs(jobs: Sequence, run: Callable, parallel: int, on_result: Callable[[list], None] | None = None) -> list:
    """``run(job)`` for every job, ``parallel`` at a time (threads waiting on processes), results in job
    order; ``on_result(results so far)`` after each one finishes (e.g. to save them)."""
    done: dict[int, object] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        result = run(jobs[i])
        with lock:
            done[i] = result
            if on_result is not None:
                on_result([done[k] for k in sorted(done)])

    pool = ThreadPoolExecutor(max(1, parallel))
    try:
        list(pool.map(one, range(len(jobs))))
    finally:  # on an error or a stop, the jobs not yet started are dropped, not run while the pool winds down
        pool.shutdown(wait=True, cancel_futures=True)
    return [done[i] for i in range(len(jobs))]
