"""Callbacks shared by the recipes, one module per concern:

* :mod:`.guard`: :class:`TrainingGuard` stops a run whose loss is not finite (:class:`TrainingDiverged`,
  ``divergence.json``); :class:`GuardedTraining` attaches it (and safe checkpoint reading) to a task.
* :mod:`.checkpoints`: :class:`SafeCheckpointReading` / :class:`SafeCheckpointIO` read resume checkpoints
  with tensors and plain values only; :class:`BestAndLastCheckpoint` keeps the best checkpoint by a metric
  and an up-to-date ``last.ckpt``.
* :mod:`.summary`: :class:`RunSummary` exports the weights and writes ``summary.json`` at the end of ``fit``
  and says what the headline number is ("10-class validation top-1 on 1,000 MNIST digits"); it refuses a
  run that trained nothing.
* :mod:`.interrupt`: :class:`InterruptCheckpoint` saves a resumable checkpoint on Ctrl-C or SIGTERM.
* :mod:`.progress`: :class:`ProgressLines` prints one line per epoch (and every N steps) when stdout is not
  a terminal.
* :mod:`.predictions`: :class:`PredictionsCSV` writes what ``predict_step`` returns to ``predictions.csv``.
* :mod:`.clips`: :class:`TestClipsCSV` writes every test clip's prediction with its voice and SNR to
  ``test_clips.csv`` (the speech recipe).
* :mod:`.curves`: :class:`RunCurves` logs to TensorBoard beside the CSV and draws ``curves.png`` when ``fit``
  ends.

Every name is importable from ``diffzoo.tasks.callbacks`` (configs name them so).
"""

from .checkpoints import BestAndLastCheckpoint, SafeCheckpointIO, SafeCheckpointReading
from .clips import TEST_CLIPS_COLUMNS, TEST_CLIPS_FILE, TestClipsCSV
from .curves import RunCurves, draw_curves, layer_lambdas, plotted_metrics
from .guard import DIVERGENCE_FILE, GuardedTraining, TrainingDiverged, TrainingGuard, stop_diverged
from .interrupt import InterruptCheckpoint, TrainingInterrupted
from .predictions import PredictionsCSV
from .progress import ProgressLines
from .summary import RunSummary, metric_files, refuse_empty_budget, require_trained, scalar_metrics

__all__ = [
    "DIVERGENCE_FILE",
    "TEST_CLIPS_COLUMNS",
    "TEST_CLIPS_FILE",
    "BestAndLastCheckpoint",
    "GuardedTraining",
    "InterruptCheckpoint",
    "PredictionsCSV",
    "ProgressLines",
    "RunCurves",
    "RunSummary",
    "SafeCheckpointIO",
    "SafeCheckpointReading",
    "TestClipsCSV",
    "TrainingDiverged",
    "TrainingGuard",
    "TrainingInterrupted",
    "draw_curves",
    "layer_lambdas",
    "metric_files",
    "plotted_metrics",
    "refuse_empty_budget",
    "require_trained",
    "scalar_metrics",
    "stop_diverged",
]
