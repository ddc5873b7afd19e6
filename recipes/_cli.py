"""What every recipe's entry point shares: default subcommand and config, CSV logs under ``outputs/``, the
run callbacks (best + last checkpoints, summary, progress lines, predictions, curves) and the help text."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningCLI

from diffzoo.tasks.callbacks import BestAndLastCheckpoint, PredictionsCSV, ProgressLines, RunCurves

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


def add_run_callbacks(parser: Any, summary_class: type, monitor: str, mode: str = "max") -> None:
    """The callbacks every recipe runs with, each configurable on the command line:

    ``--checkpoint.*`` keeps the best checkpoint by ``monitor`` plus ``last.ckpt``; ``--summary.*`` (a
    ``summary_class``) exports weights and ``summary.json``; ``--progress.*`` prints a line per epoch when
    stdout is not a terminal; ``--predictions.*`` writes ``predictions.csv`` on ``predict``; ``--curves.*``
    logs to TensorBoard beside the CSV and draws ``curves.png``.
    """
    add_checkpoint_args(parser, save_top_k=1, monitor=monitor, mode=mode)
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
    args: Optional[list[str]] = None,
    run: bool = True,
    **cli_kwargs: Any,
) -> LightningCLI:
    """Build (and with ``run=True`` execute) a recipe's CLI; ``args`` as on the command line.

    With ``run=False`` the subcommand is dropped, so the CLI only instantiates model, data and trainer.
    """
    args = with_defaults(sys.argv[1:] if args is None else args, default_config)
    # the command line is passed on as ``args`` (with the defaults added), which Lightning warns about
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
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
        },
        save_config_kwargs={"overwrite": True},
        **cli_kwargs,
    )
