"""The families a study trains: for each, the recipe, the arguments that select each attention variant,
the selection and reported metrics, and the few-step smoke arguments."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Arguments every run gets from the recipes without a built-in gradient-norm monitor.
MONITOR = ("--trainer.callbacks+=diffzoo.tasks.monitor.GradNormMonitor",)


@dataclass(frozen=True)
class Family:
    """How the sweep drives one recipe."""

    recipe: str
    variants: dict[str, tuple[str, ...]]  # variant name -> recipe arguments that select it
    val_metric: str  # selection metric in summary.metrics (validation split)
    test_metric: str | None  # reported metric of the final runs; None: the task has no test split
    label: str
    config_name: str  # the recipe's default config in its configs/ folder (for ``validate`` in --chance)
    seed_args: Callable[[int], list[str]]
    quick: tuple[str, ...]
    higher_is_better: bool = True
    scale: float = 100.0
    monitor_args: tuple[str, ...] = MONITOR  # recipes without a built-in GradNormMonitor get one
    default_variants: tuple[str, ...] = ("softmax", "diff")
    knobs: tuple[str, ...] = ()
    chance: float | None = None  # the metric of uniform guessing, when it is known in closed form
    base_args: tuple[str, ...] = ()  # recipe arguments every run of the family gets, before the variant's

    @property
    def config(self) -> Path:
        """The recipe's default config file: ``configs/<config_name>`` beside the recipe's module."""
        spec = importlib.util.find_spec(self.recipe)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"the recipe {self.recipe} of this study family cannot be found")
        return Path(spec.origin).parent / "configs" / self.config_name


def attn_variants(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Variants selected by ``--model.attn NAME``."""
    return {v: ("--model.attn", v) for v in names}


def _variant_names() -> list[str]:
    from ..layers.variants import variant_names

    return variant_names()


def _data_seed(s: int) -> list[str]:
    return ["--seed_everything", str(s), "--data.init_args.seed", str(s)]


def _plain_seed(s: int) -> list[str]:
    return ["--seed_everything", str(s), "--data.seed", str(s)]


_LIMITS = ("--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
           "--trainer.log_every_n_steps", "1")
FAMILIES: dict[str, Family] = {
    "vit": Family(
        "recipes.vit_imagenet", {"softmax": ("--model.model", "softvit_nano_patch7_28"),
                                 "diff": ("--model.model", "diffvit_nano_patch7_28")},
        "val/top1", "test/top1", "top-1 %, embedded digits (1,000 held out for test)", "vit_digits.yaml",
        _data_seed, _LIMITS + ("--trainer.limit_test_batches", "2"), chance=0.1,
        base_args=("--data.init_args.num_test", "1000")),
    "clip": Family(
        "recipes.clip", {"softmax": ("--model.model", "SoftCLIP-nano"), "diff": ("--model.model", "DiffCLIP-nano")},
        "val/zs_top1", None, "zero-shot top-1 %, coloured digits", "clip_digits.yaml", _data_seed, _LIMITS),
    "speech": Family(
        "recipes.speech_commands", {"softmax": ("--model.model", "softkwt_nano"),
                                    "diff": ("--model.model", "diffkwt_nano")},
        "val/top1", "test/top1", "top-1 %, synthesised keywords", "speech_synth.yaml", _data_seed,
        _LIMITS + ("--trainer.limit_test_batches", "2"), knobs=("data.init_args.snr_fixed_db",), chance=1 / 12),
    "lm": Family(
        "recipes.lm", attn_variants(("softmax", "diff", "diff_v2")), "val/loss", "test/loss",
        "loss (nats/byte), pydoc text, lm_nano, 500 steps", "lm_pydoc.yaml", _plain_seed,
        _LIMITS + ("--trainer.limit_test_batches", "2"), higher_is_better=False, scale=1.0,
        base_args=("--model.model", "lm_nano", "--data.test_windows", "64", "--trainer.max_epochs", "5")),
    "mqar": Family(
        "recipes.mqar", attn_variants(_variant_names()), "val/acc", "test/acc", "query accuracy %, MQAR",
        "mqar.yaml", _plain_seed, ("--quick",), monitor_args=(),
        knobs=("data.num_pairs", "data.filler", "data.seq_len"), chance=1 / 64),
    "cluttered": Family(
        "recipes.cluttered_digits", attn_variants(_variant_names()), "val/top1", "test/top1",
        "top-1 %, cluttered digits", "cluttered_digits.yaml", _plain_seed, ("--quick",), monitor_args=(),
        knobs=("data.k", "data.canvas"), chance=0.1),
}


def lr_tag(lr: float) -> str:
    """A learning rate as it appears in run names and tables (``3e-3``, ``0.001``)."""
    return f"{lr:g}"


def run_name(variant: str, lr: float, seed: int, knob: tuple[str, str] | None = None) -> str:
    """A run's folder name: ``<variant>_lr<lr>_seed<seed>[_<knob><value>]``."""
    tag = f"_{knob[0].split('.')[-1]}{knob[1]}" if knob else ""
    return f"{variant}_lr{lr_tag(lr)}_seed{seed}{tag}"


def metric_value(run: dict, key: str) -> float:
    """``summary.metrics[key]`` of a run record, nan when it is missing."""
    return float(run.get("summary", {}).get("metrics", {}).get(key, float("nan")))
