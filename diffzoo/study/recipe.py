"""The one optimisation recipe of the study, and the rule that says a run trained to a plateau.

Every family of :mod:`diffzoo.study.families` trains with the same rules, written here and nowhere else:

* AdamW, betas (0.9, 0.95), weight decay 0.05 on weight matrices (none on biases, norms, lambdas and
  embeddings: :func:`diffzoo.tasks.optim.weight_decay_groups`);
* the global gradient norm clipped at 1.0 (Lightning's ``gradient_clip_val``, norm clipping);
* linear warm-up over the first 5 % of the optimizer steps, then a cosine to 1 % of the peak learning rate;
* the peak learning rate tuned per variant (and per size) on a grid of factor-2 steps.

What differs between families is the budget (epochs, set so that every variant's validation curve has
flattened: :func:`plateau`) and the task's own regularisers (data augmentation, label smoothing), which
are the same for every variant of a family.

A family states its budget in epochs and how its recipe spells the warm-up (in epochs, or in steps with
the steps of one epoch); :func:`recipe_args` turns the rules into that recipe's command-line arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """Optimisation rules shared by every family of the study."""

    grad_clip: float = 1.0
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.01
    lr_step: float = 2.0  # the factor between neighbouring learning rates of a grid

    def describe(self) -> str:
        """The rules in one sentence, for tables and logs."""
        return (f"AdamW betas {self.betas[0]:g}/{self.betas[1]:g}, weight decay {self.weight_decay:g} on matrices, "
                f"gradient norm clipped at {self.grad_clip:g}, linear warm-up over {100 * self.warmup_fraction:g} % of "
                f"the steps, cosine to {100 * self.min_lr_ratio:g} % of the peak lr; lr grid in steps of "
                f"{self.lr_step:g}x")


RECIPE = Recipe()


@dataclass(frozen=True)
class Budget:
    """How long a family trains: ``epochs``; ``steps_per_epoch`` when its recipe counts the warm-up in
    optimizer steps (``--model.warmup_steps``), None when in epochs (``--model.warmup_epochs``)."""

    epochs: int
    steps_per_epoch: int | None = None

    @property
    def warmup_in_steps(self) -> bool:
        return self.steps_per_epoch is not None


def recipe_args(budget: Budget, recipe: Recipe = RECIPE) -> list[str]:
    """The recipe's command-line arguments that apply ``recipe`` with ``budget``."""
    if budget.warmup_in_steps:
        assert budget.steps_per_epoch is not None
        warmup = ["--model.warmup_steps", str(max(1, round(recipe.warmup_fraction * budget.epochs
                                                             * budget.steps_per_epoch)))]
    else:
        warmup = ["--model.warmup_epochs", f"{recipe.warmup_fraction * budget.epochs:g}"]
    return ["--trainer.max_epochs", str(budget.epochs), "--trainer.gradient_clip_val", f"{recipe.grad_clip:g}",
            "--trainer.gradient_clip_algorithm", "norm", "--model.weight_decay", f"{recipe.weight_decay:g}",
            "--model.betas", f"[{recipe.betas[0]:g},{recipe.betas[1]:g}]", *warmup,
            "--model.min_lr_ratio", f"{recipe.min_lr_ratio:g}"]


def lr_grid(center: float, points: int = 5, step: float = RECIPE.lr_step) -> list[float]:
    """``points`` learning rates in factor-``step`` steps centred on ``center`` (rounded to 3 digits)."""
    half = (points - 1) / 2
    return [float(f"{center * step ** (i - half):.3g}") for i in range(points)]


# The plateau rule: the last ``PLATEAU_TAIL`` of the steps may improve the validation metric by less than
# ``PLATEAU_TOL`` of its value (relative), or by less than ``PLATEAU_ABS`` for a metric scored in [0, 1].
PLATEAU_TAIL = 0.2
PLATEAU_TOL = 0.01
PLATEAU_ABS = 0.01


@dataclass(frozen=True)
class Plateau:
    """What :func:`plateau` found on one curve."""

    flat: bool
    start: float  # the metric at the start of the tail (mean of the evaluations nearest to it)
    end: float  # the metric at the end (mean of the last two evaluations)
    gain: float  # improvement over the tail, in the metric's direction (positive = still improving)
    relative: float  # gain / |start|

    def as_dict(self) -> dict:
        return {"flat": self.flat, "start": self.start, "end": self.end, "gain": self.gain, "relative": self.relative}


def plateau(curve: Sequence[Sequence[float]], higher_is_better: bool, tail: float = PLATEAU_TAIL,
            tol: float = PLATEAU_TOL, bounded: bool | None = None) -> Plateau | None:
    """Whether a validation curve (``[step, value]`` pairs, one per evaluation) has flattened.

    The tail is the last ``tail`` fraction of the steps. Its start is the mean of the two evaluations
    nearest the tail's first step, its end the mean of the last two (one evaluation is noisy). The curve
    is flat when the end improves on the start by less than ``tol`` of the start's magnitude, or, for a
    metric in [0, 1] (an accuracy; ``bounded`` None: guessed from the values), by less than
    :data:`PLATEAU_ABS`. A curve that got worse over the tail is flat. None: fewer than 4 evaluations.
    """
    points = [(float(s), float(v)) for s, v in curve if math.isfinite(float(v))]
    if len(points) < 4:
        return None
    first, last = points[0][0], points[-1][0]
    cut = last - tail * (last - first)
    nearest = sorted(range(len(points) - 2), key=lambda i: abs(points[i][0] - cut))[:2]
    start = sum(points[i][1] for i in nearest) / len(nearest)
    end = (points[-1][1] + points[-2][1]) / 2
    gain = (end - start) if higher_is_better else (start - end)
    relative = gain / abs(start) if start else math.inf * (gain > 0)
    if bounded is None:
        bounded = all(0.0 <= v <= 1.0 for _, v in points)
    flat = gain < tol * abs(start) or (bounded and gain < PLATEAU_ABS)
    return Plateau(flat, start, end, gain, relative)
