"""The families a study trains: for each, the recipe, the arguments that select each attention variant,
the selection and reported metrics, and the few-step smoke arguments."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..layers.spec import MAIN_VARIANTS
from .recipe import Budget

# Arguments every run gets from the recipes without a built-in gradient-norm monitor.
MONITOR = ("--trainer.callbacks+=diffzoo.tasks.monitor.GradNormMonitor",)
GRAD_NORM = "train/grad_norm"  # the key that monitor logs: the records keep its curve, the report plots it


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
    # a final run "succeeds" when its test metric (in ``scale`` units) reaches this: for a task whose seeds split
    # into runs that learn it and runs that stay on a floor (chance, a shortcut), the report also counts them per variant
    # and compares the counts with Fisher's exact test (tables.success_rows); None: no such count
    success: float | None = None
    base_args: tuple[str, ...] = ()  # recipe arguments every run of the family gets, before the variant's
    budget: Budget | None = None  # the study's budget; None: the recipe config's own optimisation settings
    no_test_args: tuple[str, ...] = ("--test_after_fit", "false")  # grid runs: the test set is never scored
    also_report: tuple[str, ...] = ()  # further test metrics of the final runs that the study's table reports
    # a run cut short by a stop of the study goes on from its interrupted checkpoint (runs.resume_point) instead of
    # starting over: only where a stopped and resumed run was checked to train the same weights and validation
    # curve as an uninterrupted one (tests/test_study_resume.py). Not cluttered or mqar: after a resume inside an
    # epoch their first batch is drawn differently, so their stopped runs start over.
    resumes_exactly: bool = False

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
_MAIN = MAIN_VARIANTS  # the variants of the headline table, on every family
NEEDLE_EVAL = 256  # retrieval windows (4 answers each) in each of the needle family's validation and test sets

FAMILIES: dict[str, Family] = {
    "vit": Family(
        "recipes.vit_imagenet", attn_variants(_variant_names()), "val/top1", "test/top1",
        "top-1 %, embedded digits (1,000 held out for test)", "vit_digits.yaml", _data_seed,
        _LIMITS + ("--trainer.limit_test_batches", "2"), chance=0.1, default_variants=_MAIN,
        base_args=("--model.model", "softvit_nano_patch7_28", "--data.init_args.num_test", "1000"),
        budget=Budget(epochs=80), resumes_exactly=True),
    "clip": Family(
        "recipes.clip", attn_variants(_variant_names()), "val/mean_recall", "test/mean_recall",
        "image-text retrieval mean recall %, coloured digits; test: held-out colour pairs", "clip_digits.yaml",
        _data_seed, _LIMITS + ("--trainer.limit_test_batches", "2"), default_variants=_MAIN,
        base_args=("--model.model", "SoftCLIP-nano"), budget=Budget(epochs=80), also_report=("test/zs_top1",),
        resumes_exactly=True),
    "speech": Family(
        "recipes.speech_commands", attn_variants(_variant_names()), "val/top1", "test/top1",
        "top-1 %, synthesised keywords", "speech_synth.yaml", _data_seed,
        _LIMITS + ("--trainer.limit_test_batches", "2"), knobs=("data.init_args.snr_fixed_db",), chance=1 / 12,
        default_variants=_MAIN, base_args=("--model.model", "softkwt_nano"), budget=Budget(epochs=80),
        resumes_exactly=True),
    "lm": Family(
        "recipes.lm", attn_variants(_variant_names()), "val/loss", "test/loss",
        "loss (nats/byte), pydoc text, lm_tiny, 128-byte windows, no needle contexts", "lm_pydoc.yaml",
        _plain_seed, _LIMITS + ("--trainer.limit_test_batches", "2"), higher_is_better=False, scale=1.0,
        default_variants=_MAIN,
        base_args=("--model.model", "lm_tiny", "--data.seq_len", "128", "--data.needle_fraction", "0",
                   "--data.test_windows", "128", "--data.val_windows", "128"),
        budget=Budget(epochs=40, steps_per_epoch=100), resumes_exactly=True),
    # needle retrieval as a task of its own: lm_tiny trained on 129-byte windows of training text each holding 4
    # compact needles " A=123. " (one-letter keys) and ending with 4 questions ("\nA=123"), each asking a needle
    # drawn from all 4 (repeats allowed, so no answer follows by elimination), on the answer digits only; selected
    # and reported on the exact match of every answer of NEEDLE_EVAL fixed windows cut from the held-out text (the
    # same for every run), batches of 64 windows, 4,000 steps. Copying a random needle's value scores 25 %. In
    # pilots (docs/study.md, one seed each) V2 matched passed that by step 1,000 and was flat at about 85 % from
    # step 2,000; softmax and V1 stayed at 25 % (softmax to step 8,000); with three-letter keys softmax stayed
    # near 3 % and V2 at 25 %; asked every needle once, a model answered by elimination without matching keys
    "needle": Family(
        "recipes.lm", attn_variants(_variant_names()), "val/needle_acc", "test/needle_acc",
        f"needle retrieval exact match %, {NEEDLE_EVAL} windows of 129 bytes from held-out pydoc text with 4 "
        "compact needles (one-letter keys) and 4 queries each, lm_tiny trained on such windows (answer-only loss)",
        "lm_pydoc.yaml", _plain_seed, _LIMITS + ("--trainer.limit_test_batches", "2"), chance=1e-3,
        default_variants=_MAIN,
        base_args=("--model.model", "lm_tiny", "--data.seq_len", "128", "--data.needle_fraction", "1",
                   "--data.needle_style", "recall", "--data.needle_counts", "[4]", "--data.needle_queries", "4",
                   "--data.needle_key_letters", "1", "--data.answer_loss", "true",
                   "--data.needle_eval", str(NEEDLE_EVAL), "--data.batch_size", "64", "--data.train_windows", "6400",
                   "--data.test_windows", "128", "--data.val_windows", "128"),
        budget=Budget(epochs=40, steps_per_epoch=100), resumes_exactly=True,
        success=50.0),  # retrieves: twice what copying a random needle's value scores
    "mqar": Family(
        "recipes.mqar", attn_variants(_variant_names()), "val/acc", "test/acc", "query accuracy %, MQAR",
        "mqar.yaml", _plain_seed, ("--quick",), monitor_args=(), default_variants=_MAIN,
        knobs=("data.num_pairs", "data.filler", "data.seq_len"), chance=1 / 64,
        budget=Budget(epochs=10, steps_per_epoch=100), no_test_args=("--data.score_test", "false"),
        success=95.0),  # solved: recall learnt, well above the ~52 % a run that learns only the shortcut stays at
    "cluttered": Family(
        "recipes.cluttered_digits", attn_variants(_variant_names()), "val/top1", "test/top1",
        "top-1 %, cluttered digits (35x35 canvas; 2 fragments, 4 in cluttered-30ep)", "cluttered_digits.yaml", _plain_seed, ("--quick",),
        monitor_args=(), knobs=("data.k", "data.canvas"), chance=0.1, default_variants=_MAIN,
        base_args=("--data.canvas", "35"), budget=Budget(epochs=120),
        no_test_args=("--data.score_test", "false")),
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
