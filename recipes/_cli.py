"""What every recipe's entry point shares: default subcommand and config, CSV logs under ``outputs/``."""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def with_defaults(args: list[str], default_config: Path) -> list[str]:
    """Insert ``fit`` when no subcommand is given, and ``default_config`` for ``fit`` without ``--config``."""
    args = list(args)
    if args[:1] not in ([s] for s in SUBCOMMANDS) and args[:1] not in (["-h"], ["--help"]):
        args.insert(0, "fit")
    if args[:1] == ["fit"] and not any(a in ("-c", "--config") or a.startswith("--config=") for a in args):
        args[1:1] = ["--config", str(default_config)]
    return args


def add_checkpoint_args(parser: Any, **defaults: Any) -> None:
    """Always-on ``--checkpoint.*`` (a ModelCheckpoint saving ``last.ckpt`` and step-named files); ``defaults``
    override or add ``checkpoint.<name>`` defaults, e.g. ``save_top_k=1, monitor="val/loss"``."""
    parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
    base = {"filename": "epoch{epoch:03d}-step{step:07d}", "auto_insert_metric_name": False, "save_last": True}
    parser.set_defaults({f"checkpoint.{k}": v for k, v in {**base, **defaults}.items()})


class ChecksCkptPath:
    """LightningCLI mixin: ``--ckpt_path`` is checked with :func:`diffzoo.checkpoint_io.check_checkpoint_file`
    (tensors and plain values only, one-line errors) as soon as the arguments are parsed, before Lightning
    reads the file for its hyper-parameters or to resume."""

    def parse_arguments(self, parser: Any, args: Any) -> None:
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if path and str(path) not in ("last", "best", "hpc", "registry"):  # Lightning's own names
            from diffzoo.checkpoint_io import check_checkpoint_file

            check_checkpoint_file(path, what="--ckpt_path")


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
    if args is None:  # the command line: a bad input ends in one line on stderr and exit status 1
        with one_line_errors(f"python -m recipes.{name}"):
            return launch(cli_class, model_class, datamodule_class, name=name, default_config=default_config,
                          args=sys.argv[1:], run=run, **cli_kwargs)
    args = with_defaults(args, default_config)
    if not issubclass(cli_class, ChecksCkptPath):
        cli_class = type(cli_class.__name__, (ChecksCkptPath, cli_class), {"__doc__": cli_class.__doc__})
    # the command line is passed on as ``args`` (with the defaults added), which Lightning warns about
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    return cli_class(
        model_class,
        datamodule_class,
        args=args if run else args[1:],
        run=run,
        seed_everything_default=0,
        trainer_defaults={
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": "outputs", "name": name},
            },
        },
        save_config_kwargs={"overwrite": True},
        **cli_kwargs,
    )
