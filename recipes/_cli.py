"""What every recipe's entry point shares: default subcommand and config, CSV logs under ``outputs/`` (a fresh
folder per run; resuming from a run's checkpoint continues that run's folder), a resumable checkpoint on Ctrl-C,
the run callbacks (best + last checkpoints, summary, progress lines, predictions, curves) and the help text."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from jsonargparse import DefaultHelpFormatter, Namespace
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from diffzoo.tasks.callbacks import BestAndLastCheckpoint, InterruptCheckpoint, PredictionsCSV, ProgressLines, RunCurves

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def with_defaults(args: list[str], default_config: Path) -> list[str]:
    """Insert ``fit`` when no subcommand is given (the default config is the parser's, see :func:`help_kwargs`)."""
    args = list(args)
    if args[:1] not in ([s] for s in SUBCOMMANDS) and args[:1] not in (["-h"], ["--help"]):
        args.insert(0, "fit")
    return args


def add_checkpoint_args(parser: Any, **defaults: Any) -> None:
    """Always-on ``--checkpoint.*`` (a ModelCheckpoint saving ``last.ckpt`` and step-named files); ``defaults``
    override or add ``checkpoint.<name>`` defaults, e.g. ``save_top_k=1, monitor="val/loss"``."""
    parser.add_lightning_class_args(BestAndLastCheckpoint, "checkpoint")
    base = {"filename": "epoch{epoch:03d}-step{step:07d}", "auto_insert_metric_name": False, "save_last": True}
    parser.set_defaults({f"checkpoint.{k}": v for k, v in {**base, **defaults}.items()})


class ChecksCkptPath:
    """LightningCLI mixin: ``--ckpt_path`` is checked with :func:`diffzoo.weights.io.check_checkpoint_file`
    (tensors and plain values only, one-line errors) as soon as the arguments are parsed, before Lightning
    reads the file for its hyper-parameters or to resume."""

    def parse_arguments(self, parser: Any, args: Any) -> None:
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if path and str(path) not in ("last", "best", "hpc", "registry"):  # Lightning's own names
            from diffzoo.weights.io import check_checkpoint_file

            check_checkpoint_file(path, what="--ckpt_path")


class TestAfterFit:
    """LightningCLI mixin: ``--test_after_fit`` scores the data's test split with the final weights once ``fit``
    ends and adds the test metrics to the run's ``summary.json``. Data without a test split of its own
    (no ``test_dataloader``, or ``has_test_split`` false) is skipped. ``test_after_fit_default`` sets the
    flag's default."""

    test_after_fit_default = True

    def add_test_after_fit(self, parser: Any) -> None:
        parser.add_argument("--test_after_fit", type=bool, default=self.test_after_fit_default,
                            help="score the test split with the final weights after fit (added to summary.json)")

    def after_fit(self) -> None:
        trainer, data = self.trainer, self.datamodule
        if not self.config["fit"].get("test_after_fit", self.test_after_fit_default):
            return
        if trainer.interrupted or trainer.fast_dev_run:
            return
        if type(data).test_dataloader is pl.LightningDataModule.test_dataloader:
            return  # the data has no test split
        if not getattr(data, "has_test_split", True):
            return  # its test loader would score the validation data again
        results = trainer.test(self.model, datamodule=data, verbose=False)
        if trainer.is_global_zero and results:
            path = Path(trainer.log_dir) / "summary.json"
            summary = json.loads(path.read_text()) if path.is_file() else {}
            summary.setdefault("metrics", {}).update({k: float(v) for k, v in results[0].items()})
            path.write_text(json.dumps(summary, indent=2))
            print("test: " + "  ".join(f"{k} {v:.4g}" for k, v in results[0].items()), flush=True)


@contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """Turn the errors a user can fix (bad values, missing or unsafe files, a diverged run) into one line on
    stderr and exit status 1; ``DIFFZOO_TRACEBACK=1`` shows the traceback instead."""
    from diffzoo.tasks.callbacks import TrainingDiverged

    try:
        yield
    except (ValueError, FileNotFoundError, TrainingDiverged) as e:
        if os.environ.get("DIFFZOO_TRACEBACK"):
            raise
        raise SystemExit(f"{prog}: error: {e}") from None


_CSV_LOGGERS = ("lightning.pytorch.loggers.CSVLogger", "lightning.pytorch.loggers.csv_logs.CSVLogger")
_RUN_FILES = ("config.yaml", "hparams.yaml", "metrics.csv")


def command_without_ckpt_path(command: list[str]) -> list[str]:
    """``command`` with any ``--ckpt_path VALUE`` / ``--ckpt_path=VALUE`` removed."""
    out, skip = [], False
    for a in command:
        if skip:
            skip = False
        elif a == "--ckpt_path":
            skip = True
        elif not a.startswith("--ckpt_path="):
            out.append(a)
    return out


def run_command(args: list[str] | None, cli_class: type) -> list[str]:
    """The command line that started this run (``args`` given: the equivalent ``python -m recipes.<name> ...``)."""
    if args is None:
        return list(sys.orig_argv)
    module = cli_class.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else module
    return [sys.executable, "-m", module, *args]


def run_folder_of(ckpt_path: str | None) -> Path | None:
    """The run folder holding ``ckpt_path`` (``<run>/checkpoints/x.ckpt`` next to the run's logs), else None."""
    if not ckpt_path:
        return None
    path = Path(ckpt_path)
    run = path.parent.parent
    if path.parent.name == "checkpoints" and path.is_file() and any((run / f).is_file() for f in _RUN_FILES):
        return run
    return None


def reserve_version(root: Path) -> int:
    """Create and return the next free ``root/version_N`` (atomically: concurrent runs never share one)."""
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"version_(\d+)", p.name))]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir()
            return n
        except FileExistsError:
            n += 1


class RunFolders:
    """LightningCLI mixin: every run logs into a folder of its own; ``fit --ckpt_path`` with a checkpoint of a
    run folder continues that folder (metrics appended to its ``metrics.csv``, config saved beside the first)."""

    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()  # type: ignore[misc]
        cfg = self.config[self.subcommand] if self.subcommand else self.config  # type: ignore[attr-defined]
        logger = cfg.get("trainer", {}).get("logger")
        init = getattr(logger, "init_args", None) if isinstance(logger, Namespace) else None
        if init is None or not all(hasattr(init, k) for k in ("save_dir", "name", "version")):
            return
        run = run_folder_of(cfg.get("ckpt_path")) if self.subcommand == "fit" else None  # type: ignore[attr-defined]
        if run is not None:
            init.save_dir, init.name, init.version = str(run.parent.parent), run.parent.name, run.name
            if logger.class_path in _CSV_LOGGERS:
                logger.class_path = "diffzoo.tasks.resume.AppendingCSVLogger"
            if (run / "config.yaml").exists():
                n = 1
                while (run / f"config-resume{n}.yaml").exists():
                    n += 1
                self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": f"config-resume{n}.yaml"}
        elif init.version is None:
            if rank_zero_only.rank == 0:  # other ranks log nothing; rank 0's folder is broadcast to them
                init.version = reserve_version(Path(init.save_dir, init.name or ""))
        else:
            version = init.version if isinstance(init.version, str) else f"version_{init.version}"
            folder = Path(init.save_dir, init.name or "", version)
            if any((folder / f).exists() for f in _RUN_FILES):
                raise ValueError(
                    f"{folder} already holds a run: leave --trainer.logger.init_args.version unset for a fresh "
                    f"folder, or continue that run with --ckpt_path {folder / 'checkpoints' / 'last.ckpt'}"
                )


def add_run_callbacks(
    parser: Any, summary_class: type, monitor: str, mode: str = "max", keep_checkpoints: bool = True
) -> None:
    """The callbacks every recipe runs with, each configurable on the command line:

    ``--checkpoint.*`` keeps the best checkpoint by ``monitor`` plus ``last.ckpt``; ``--summary.*`` (a
    ``summary_class``) exports weights and ``summary.json``; ``--progress.*`` prints a line per epoch when
    stdout is not a terminal; ``--predictions.*`` writes ``predictions.csv`` on ``predict``; ``--curves.*``
    logs to TensorBoard beside the CSV and draws ``curves.png``. ``keep_checkpoints=False`` keeps none by
    default (``--checkpoint.save_top_k`` / ``--checkpoint.save_last`` turn them on).
    """
    if keep_checkpoints:
        add_checkpoint_args(parser, save_top_k=1, monitor=monitor, mode=mode)
    else:  # many short runs (the study): none kept unless asked for (Ctrl-C still saves one)
        add_checkpoint_args(parser, save_top_k=0, save_last=False)
    parser.add_lightning_class_args(summary_class, "summary")
    parser.set_defaults({"summary.monitor": monitor})
    parser.add_lightning_class_args(ProgressLines, "progress")
    parser.add_lightning_class_args(PredictionsCSV, "predictions")
    parser.add_lightning_class_args(RunCurves, "curves")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help with the description's line breaks kept."""


def recipe_description(doc: str, config_dir: Path, default_config: Path) -> str:
    """``doc`` (what the recipe trains by default, examples) and the shipped configs with their first line."""
    lines = [doc.strip(), "", f"Shipped configs (--config {config_dir.relative_to(config_dir.parents[1])}/NAME):"]
    for path in sorted(config_dir.glob(f"{default_config.name.split('_')[0]}_*.yaml")):
        first = next((ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")), "")
        mark = " (default)" if path.name == default_config.name else ""
        lines.append(f"  {path.name}{mark}: {first}")
    return "\n".join(lines)


def help_kwargs(doc: str, default_config: Path, args: list[str], subcommands: bool = True) -> dict[str, Any]:
    """LightningCLI ``parser_kwargs``: the recipe's description on the main parser and every subcommand, and
    ``default_config`` as the default config file (of every subcommand with ``subcommands``) unless the
    command line names a config, so that ``fit --help`` shows the values the run uses."""
    description = recipe_description(doc, default_config.parent, default_config)
    own_config = any(a in ("-c", "--config") or a.startswith("--config=") for a in args)
    kwargs: dict[str, Any] = {"description": description, "formatter_class": _HelpFormatter}
    if not own_config:
        kwargs["default_config_files"] = [str(default_config)]
    if not subcommands:
        return kwargs
    main = {k: v for k, v in kwargs.items() if k != "default_config_files"}
    return {**main, **{s: dict(kwargs) for s in SUBCOMMANDS}}


class _DropAdvert(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.msg)


def quiet_lightning() -> None:
    """Silence two messages Lightning 2.6 prints on every run: the advert for its cloud logger (a log record
    of its rank-zero logger) and torch 2.11's deprecation of ``LeafSpec``, which Lightning's data fetching
    still constructs (a FutureWarning raised inside ``lightning.pytorch.utilities._pytree``)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdvert) for f in logger.filters):
            logger.addFilter(_DropAdvert())
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )


def launch(
    cli_class: type[LightningCLI],
    model_class: type,
    datamodule_class: type,
    *,
    name: str,
    default_config: Path,
    args: list[str] | None = None,
    run: bool = True,
    quick: Sequence[str] = (),
    **cli_kwargs: Any,
) -> LightningCLI:
    """Build (and with ``run=True`` execute) a recipe's CLI; ``args`` as on the command line.

    With ``run=False`` the subcommand is dropped, so the CLI only instantiates model, data and trainer.
    ``quick``: the arguments ``--quick`` stands for (:func:`expand_quick`), for recipes that have a smoke run.
    """
    if args is None:  # the command line: a bad input ends in one line on stderr and exit status 1
        with one_line_errors(f"python -m recipes.{name}"):
            return launch(cli_class, model_class, datamodule_class, name=name, default_config=default_config,
                          args=sys.argv[1:], run=run, quick=quick, **cli_kwargs)
    if quick:
        args = expand_quick(args, quick)
    command = command_without_ckpt_path(run_command(args, cli_class))
    args = with_defaults(args, default_config)
    # the command line is passed on as ``args`` (with the defaults added), which Lightning warns about
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    # --ckpt_path checked safely as soon as it is parsed; one run folder per run (resume continues its folder)
    cli_class = type(cli_class.__name__, (ChecksCkptPath, RunFolders, cli_class),
                     {"__module__": cli_class.__module__, "__doc__": cli_class.__doc__})
    quiet_lightning()
    doc = sys.modules[cli_class.__module__].__doc__ or ""
    cli_kwargs.setdefault("parser_kwargs", help_kwargs(doc, default_config, args, subcommands=run))
    return cli_class(
        model_class,
        datamodule_class,
        args=args if run else args[1:],
        run=run,
        seed_everything_default=0,
        trainer_defaults={
            "enable_progress_bar": sys.stdout.isatty(),  # not a terminal: ProgressLines prints a line per epoch
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": "outputs", "name": name},
            },
            "callbacks": [InterruptCheckpoint(resume_command=command)],
        },
        **cli_kwargs,
    )


def expand_quick(args: Sequence[str] | None, quick: Sequence[str]) -> list[str]:
    """``args`` (default ``sys.argv[1:]``) with ``--quick`` replaced by the recipe's smoke-run overrides;
    arguments given after them still win."""
    args = list(sys.argv[1:] if args is None else args)
    if "--quick" not in args:
        return args
    i = args.index("--quick")
    return [*args[:i], *quick, *args[i + 1:]]
