"""The whole study as a list of cells, run resumably across sessions, and its one headline table.

A cell is one family at one size with the variants it compares and the starting learning-rate grid
(:func:`~diffzoo.study.recipe.lr_grid`: 5 points in factor-2 steps; the sweep extends it where the best lr
lands on an edge). Each cell is a :mod:`diffzoo.study.sweep` whose records file lives in the repository
(:data:`RECORDS`), so a later session, or another machine, continues where the last one stopped: runs
already recorded are never trained again. To end a session, ``kill -USR1 <pid>``: the runs in flight finish
and are recorded, no other starts; ``kill <pid>`` stops them at once, and the next call goes on with each from the
checkpoint it saved where the family resumes exactly (else trains it again). Or say when it must end,
``--finish-by 18:30``: no run starts that its records say would not end by then, except in the families that
resume exactly, whose runs pause at that time and go on next call (the cells after one that stopped are tried in
turn: their runs may be shorter).

    OMP_NUM_THREADS=1 python -m recipes.study run --jobs 2            # every cell, in order; resumable
    OMP_NUM_THREADS=1 python -m recipes.study run --cells mqar lm     # some cells
    OMP_NUM_THREADS=1 python -m recipes.study run --main-only         # the three main variants first
    OMP_NUM_THREADS=1 python -m recipes.study run --finish-by 4h      # a session of 4 hours
    python -m recipes.study status                                    # runs recorded per cell
    python -m recipes.study report                                    # the headline table and its plots
    python -m recipes.study report --page docs/results.md             # ... and the table into the results page
    python -m recipes.study run --quick --records outputs/study-quick # the pipeline in seconds (tests)

The report compares every variant with softmax on every task and applies one Holm correction over the
comparisons of every task at its final budget (headline and ablations together; a task's superseded
shorter budgets get a table and a Holm of their own); each comparison's p is the exact permutation p of
the final seeds' test scores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..layers.spec import ABLATION_VARIANTS, MAIN_VARIANTS
from ..stats import compare, holm, welch, welch_contrast
from .families import FAMILIES, lr_tag, metric_value
from .plots import plot_curves, plot_grid
from .recipe import RECIPE, lr_grid
from .runs import (
    FINAL_SEED,
    FINISH_BY_HELP,
    MACHINE_KEYS,
    Finishing,
    Paused,
    RecordsBusy,
    carry_on_after_finish_by,
    finish_by,
    parse_finish_by,
    records_lock,
)
from .sweep import RUN_TIME_SPARE, write_records
from .tables import (
    ABLATIONS,
    comparison_rows,
    fmt,
    fmt_p,
    run_plateau,
    speech_voice_stats,
    speech_voice_table,
    success_rows,
    success_table,
)

MAIN = MAIN_VARIANTS
SHORT = dict(zip(MAIN, ("softmax", "V1", "V2")))  # the main variants' names in plots
RECORDS = Path("docs/results/study/v0.3")
GRID_SEEDS = 3
QUICK_FINAL_SEEDS = 2  # --quick: the pipeline only
FINAL_SEEDS = 8  # 8 + 8 seeds: the exact permutation p can reach 2/12870, so Holm over ~20 comparisons can act


@dataclass(frozen=True)
class Cell:
    """One sweep of the study: ``family`` at ``size`` (its default when None) over ``variants``."""

    name: str
    family: str
    variants: tuple[str, ...] = MAIN
    lr_center: float = 2e-3
    size_args: tuple[str, ...] = ()  # recipe arguments that set the model's size
    extra: tuple[str, ...] = ()
    grid_points: int = 5
    final_seeds: int = FINAL_SEEDS
    lr_from: str | None = None  # size-trend cells: each variant's grid is centred on its best lr in this cell
    epochs_factor: float | None = None  # budget checks: grid seeds at lr_from's best lr, this times the budget
    epochs: int | None = None  # a budget of its own (a size that needs longer to reach a plateau)
    # the task at a budget the study later found too short, replaced by this cell: reported in a table of its own,
    # outside the study's Holm family (which holds each task at its final budget only); a size-trend cell so
    # marked is left out of the size trend, where the cell that replaced it stands for its size
    superseded_by: str | None = None
    extend: int = 2  # lrs the sweep may add beyond the starting grid, one at a time, while the best is at an edge
    # budget checks: the grid seeds (0, 1, ...) trained longer, each compared with its own grid run at the budget;
    # more than one where the seeds' spread at the chosen lr is as large as the plateau tolerance
    check_seeds: int = 1
    # a cell whose runs have this cell's set-up (the budget check that trained this cell's budget at its centre
    # lrs): the study takes them into this cell's records rather than train them twice
    runs_from: str | None = None

    @property
    def lrs(self) -> list[float]:
        return lr_grid(self.lr_center, self.grid_points)


def _check(source: str, family: str | None = None, factor: float = 2.0, extra: tuple[str, ...] = (),
           size_args: tuple[str, ...] = (), seeds: int = 1, variants: tuple[str, ...] = MAIN) -> Cell:
    """A budget check of cell ``source`` (of ``family``, default: the cell's name; ``extra`` and ``size_args``:
    the source cell's own recipe arguments): each of ``variants``' (the source cell's; default the main three)
    grid seeds 0 .. ``seeds`` - 1 at its best lr for ``factor`` times the cell's budget (cell
    ``<source>-<factor>x``)."""
    assert 1 <= seeds <= GRID_SEEDS, f"a budget check compares grid seeds, of which there are {GRID_SEEDS}"
    return Cell(f"{source}-{factor:g}x", family or source, variants, grid_points=1, final_seeds=0, lr_from=source,
                epochs_factor=factor, extra=extra, size_args=size_args, check_seeds=seeds)


def _size(cell: str, family: str, size_args: tuple[str, ...], lr_from: str, epochs: int | None = None,
          superseded_by: str | None = None, runs_from: str | None = None) -> Cell:
    """A size-trend cell: the three main variants, 3 lrs around the neighbouring size's best, 5 final seeds; up to
    4 lrs added at an edge (a size's best lr can lie several steps from its neighbour's: lm-xs's V2 was still at an edge after 2)."""
    return Cell(cell, family, MAIN, size_args=size_args, grid_points=3, final_seeds=5, lr_from=lr_from,
                epochs=epochs, extend=4, superseded_by=superseded_by, runs_from=runs_from)


LM_XS = ("--model.model_kwargs", '{"dim": 32, "intermediate_size": 80}')  # the size trend's 32 k LM
LM_XXS = ("--model.model_kwargs", '{"dim": 16, "intermediate_size": 40}')  # the size trend's 10 k LM, its smallest
CLUTTERED_K = ("--data.k", "2")  # the cluttered cell's fragments per image
NOISY_10DB = ("--data.init_args.snr_fixed_db=-10",)  # every speech clip of every split mixed at -10 dB SNR
NOISY_0DB = ("--data.init_args.snr_fixed_db=0",)  # ... at 0 dB, the lowest SNR of the speech task's usual mix
# the clip cell's smaller task: three digits (0-2) in the six colours, 900 training digit images; 300 test,
# 150 validation and 150 held-out validation images (the ten-digit task's splits scaled to the images left)
CLIP_D3 = ("--data.init_args.digits", "[0,1,2]", "--data.init_args.num_test", "300", "--data.init_args.num_val", "150",
           "--data.init_args.num_val_heldout", "150")

CELLS: tuple[Cell, ...] = (  # the ablations run on one encoder (vit) and one decoder (mqar)
    Cell("vit", "vit", MAIN + ABLATION_VARIANTS),
    Cell("mqar", "mqar", MAIN + ABLATION_VARIANTS),
    # two fragments per image (the cell's own argument; the recipe's default is 4, which cluttered-30ep trained)
    # for 240 epochs: at 120 (cluttered-120ep) its three-seed budget check gained 1.27 / 3.00 / 1.20 points of
    # validation top-1 for softmax / V1 / V2 at 240, all nine runs flat there, and V1's gap shrank from -3.07 to
    # -1.33; the check's runs are this cell's grid runs at its centre lrs, so the cell takes them in
    Cell("cluttered", "cluttered", extra=CLUTTERED_K, epochs=240, runs_from="cluttered-120ep-2x"),
    # 640 epochs: at 320 (speech-320ep) its three-seed budget check gained +0.09 / +1.39 / -0.09 points of validation
    # top-1 for softmax / V1 / V2 at 640, V1's beyond the plateau rule's 1-point tolerance; the check's runs are this
    # cell's grid runs at its centre lrs, so the cell takes them in
    Cell("speech", "speech", epochs=640, runs_from="speech-320ep-2x"),
    # three digits for 320 epochs: with ten digits softmax was still learning the digits at 320 epochs; with three
    # its seed-0 pilot gained 2.8 points of validation R@1 from 160 to 320 epochs and none from 320 to 640
    # (docs/results.md); grid centred on 1e-3, near every variant's optimum at 40 and 80 epochs
    Cell("clip", "clip", extra=CLIP_D3, epochs=320, lr_center=1e-3),
    Cell("lm", "lm"),
    Cell("needle", "needle"),  # retrieval in text, a decoder task of its own (answer-only loss, 4,000 steps)
    # the noisiest speech: softmax and V1 each re-tuned with every clip at 0 dB SNR, the bottom of the usual mix
    # (the interaction of the gap with SNR is also tested on the speech cells' own test clips, whose SNR varies
    # from 0 to 20 dB), at 640 epochs, the speech cell's budget: at 320 (speech-0db-320ep) its three-seed check at
    # each variant's best lr gained +1.67 (softmax) and +0.00 (V1) points of validation top-1 at 640, softmax's
    # beyond the plateau rule's 1-point tolerance; the check's runs are this cell's grid runs at those lrs, so the
    # cell takes them in
    Cell("speech-0db", "speech", ("softmax", "diff"), extra=NOISY_0DB, epochs=640, runs_from="speech-0db-320ep-2x"),
    # ViT digits at half its budget: the first ViT cell ran 40 epochs, and its budget check gained 1.1-1.3 points
    # of validation top-1 for every variant at 80, so the task's budget became 80 and this cell stays as the
    # same comparison at half the budget (does the gap depend on the budget?)
    Cell("vit-40ep", "vit", MAIN, epochs=40, superseded_by="vit"),
    # the LM at half its budget, for the same reason: at 2,000 steps its check gained 0.016 / 0.035 nats of
    # validation loss for softmax / V1 at 4,000 (V2 lost 0.011), halving seed 0's V1 - softmax gap, so the
    # task's budget became 4,000 steps, where all three curves are flat
    Cell("lm-2k", "lm", MAIN, epochs=20, superseded_by="lm"),
    # CLIP at half its budget, for the same reason: every 40-epoch final run met the plateau rule, but the
    # check gained 3.2 / 6.0 / 13.0 points of validation mean recall for softmax / V1 / V2 at 80 epochs (all
    # three flat there), so the task's budget became 80 epochs
    Cell("clip-40ep", "clip", MAIN, epochs=40, superseded_by="clip"),
    # the nano CLIP at 80 epochs: its final runs all met the plateau rule, but its check gained 11.2 / 5.7 / 3.0
    # points of validation mean recall for softmax / V1 / V2 at 160 epochs, and a softmax pilot at 320 another
    # 3.0; a ten-digit cell at 320 epochs or more being out of reach, the task was made smaller (CLIP_D3)
    Cell("clip-80ep", "clip", MAIN, epochs=80, superseded_by="clip"),
    # speech at half its budget: at 40 epochs its check gained 3.1 / 8.6 / 4.2 points of validation top-1 for
    # softmax / V1 / V2 at 80 (V1, the most), so the task's budget became 80 epochs
    Cell("speech-40ep", "speech", MAIN, epochs=40, superseded_by="speech"),
    # speech at 80 epochs, the task's second budget: its check gained 2.5 / 3.3 / 0.8 points of validation top-1
    # for softmax / V1 / V2 at 160, as much as the gaps between them; its records and its check were the speech
    # cell's until the budget became 160
    Cell("speech-80ep", "speech", MAIN, epochs=80, superseded_by="speech"),
    # speech at 160 epochs, the task's third budget (the speech cell's comment), on version-1 clips like the two
    # before it; its records and its check were the speech cell's until the budget became 320
    Cell("speech-160ep", "speech", MAIN, epochs=160, superseded_by="speech"),
    # speech at 320 epochs on version-2 clips, the task's fourth budget: at 160 (speech-160ep) its check gained
    # 4.4 / 2.2 / 0.8 points of validation top-1 for softmax / V1 / V2 at 320, all three flat there, and every record
    # before 2026-12-02 was trained on version-1 clips, which differ from one synthesis to the next; its records and
    # its check were the speech cell's until the budget became 640 (the speech cell's comment)
    Cell("speech-320ep", "speech", MAIN, epochs=320, superseded_by="speech"),
    # speech at a fixed -10 dB, the noisy cell's first level: at twice its 320 epochs its three-seed check gained
    # +11.9 / +6.9 points of validation top-1 for softmax / V1, and a budget that lets -10 dB flatten would be
    # 1,280 epochs or more (about 65 CPU-thread hours for the cell), so the noisy task was made milder (speech-0db)
    Cell("speech-noisy", "speech", ("softmax", "diff"), extra=NOISY_10DB, epochs=320, superseded_by="speech-0db"),
    # speech at a fixed 0 dB and 320 epochs, the noisy cell's second level: seed 0's pilots at 2e-3 gained +0.83
    # (softmax) and +0.56 (V1) points of validation top-1 from 320 to 640 epochs, both within the plateau rule's
    # tolerance (docs/results/study/v0.3/pilots/speech_0db.json), but its three-seed check did not agree for softmax
    # (the speech-0db cell's comment); its records and its check were the speech-0db cell's until the budget became 640
    Cell("speech-0db-320ep", "speech", ("softmax", "diff"), extra=NOISY_0DB, epochs=320, superseded_by="speech-0db"),
    # cluttered digits at 30 epochs, the task's first budget: its check gained 12.6 / 10.6 / 7.0 points of
    # validation top-1 for softmax / V1 / V2 at 60 epochs, with softmax and V1 still rising there
    Cell("cluttered-30ep", "cluttered", MAIN, epochs=30, superseded_by="cluttered"),
    # cluttered digits (two fragments) at 120 epochs, the task's second budget, for the reason in the cluttered
    # cell's comment; its records and its check were the cluttered cell's until the budget became 240 (at 120 epochs,
    # four fragments had left softmax's curve rising, +2.0 points over its last fifth, and two did not)
    Cell("cluttered-120ep", "cluttered", MAIN, epochs=120, extra=CLUTTERED_K, superseded_by="cluttered"),
    # what each budget leaves on the table: seed 0 of every main variant at its best lr for twice as long
    *(_check(name) for name in ("vit", "mqar")),
    # three seeds: at 640 epochs seed 0 moved validation top-1 by -0.56 (softmax), +1.67 (V1) and +0.83 (V2) points,
    # V1's beyond the plateau rule's 1-point tolerance, and the grid seeds' validation top-1 at softmax's best lr
    # spreads 0.83 points (sd): one seed cannot say whether V1's -1.87-point test deficit at 320 is slower fitting
    _check("speech-320ep", "speech", seeds=3),
    # the same at 1,280 epochs for the task's budget of 640
    _check("speech", seeds=3),
    *(_check(name) for name in ("lm", "needle")),
    # three seeds: at 120 epochs cluttered was the one cell whose V1 - softmax gap survived the study's correction,
    # yet a third of its final runs had not flattened, and seed 0 alone shrank V1's gap from -3.6 to -0.4 points at
    # 240 epochs
    _check("cluttered-120ep", "cluttered", extra=CLUTTERED_K, seeds=3),
    _check("cluttered", extra=CLUTTERED_K, seeds=3),
    # three seeds: at -10 dB only 8 of the 16 final runs met the plateau rule, and the grid seeds' validation
    # top-1 at each best lr spreads 2.8 points (sd), more than the rule's 1-point tolerance
    _check("speech-noisy", "speech", extra=NOISY_10DB, seeds=3, variants=("softmax", "diff")),
    # three seeds, as at -10 dB: one pilot seed per variant set the 0 dB budget
    _check("speech-0db-320ep", "speech", extra=NOISY_0DB, seeds=3, variants=("softmax", "diff")),
    # the same at 1,280 epochs for the 0 dB budget of 640
    _check("speech-0db", "speech", extra=NOISY_0DB, seeds=3, variants=("softmax", "diff")),
    _check("clip", extra=CLIP_D3),
    _check("clip-80ep", "clip"),
    _check("vit-40ep", "vit"),
    _check("lm-2k", "lm"),
    _check("clip-40ep", "clip"),
    _check("cluttered-30ep", "cluttered"),
    _check("speech-40ep", "speech"),
    _check("speech-80ep", "speech"),
    _check("speech-160ep", "speech"),
    # cluttered digits at four times its first budget: the pilot that set the task's budget (softmax still rising
    # at 120 epochs with four fragments; V1 and V2 flat)
    _check("cluttered-30ep", "cluttered", factor=4.0),
    # the size trend: one encoder (vit digits) and the LM at three sizes each, >= 10x apart in parameters
    # (softmax parameters: vit-xs 42 k, vit 0.31 M, vit-l 1.8 M; lm-xxs 10 k, lm-xs 32 k, lm 0.11 M; the report
    # reads each run's own count from its summary). The LM's sizes go down from lm, not up: larger LMs overfit the
    # corpus within the task's 4,000 steps (the pilots, their figures and records: docs/study.md, Size trend)
    _size("vit-xs", "vit", ("--model.model_kwargs", '{"embed_dim": 48, "depth": 2}'), "vit"),
    # (at 40 epochs vit-l's softmax pilot met the plateau rule at 94.1 % only because the cosine schedule had run
    # out, still rising at epoch 31; at the task's 80 it reached 97.0 % and was flat from epoch 60)
    _size("vit-l", "vit", ("--model.model_kwargs", '{"embed_dim": 192, "depth": 6}'), "vit"),
    # the 32 k LM at the LM's 4,000 steps: softmax's final runs flattened (4 of 5), V1's did not (0 of 5), and
    # its budget check gained 0.018 / 0.039 nats of validation loss for softmax / V1 at 8,000 steps (all three
    # flat there), so the size trend's 32 k LM trains 8,000 steps (lm-xs-8k, centred on this cell's best lrs)
    _size("lm-xs", "lm", LM_XS, "lm", superseded_by="lm-xs-8k"),
    _check("lm-xs", "lm", size_args=LM_XS),
    _size("lm-xs-8k", "lm", LM_XS, "lm-xs", epochs=80, superseded_by="lm-xs-16k"),
    # at 8,000 steps V1's final runs (lr 6.4e-2, one step below a diverging 1.28e-1) still gained 0.033 nats over
    # their last fifth: does a longer budget help, or is that the cosine schedule annealing a high lr?
    # three seeds: at lm-xs-8k's chosen lrs the grid seeds spread by 0.01-0.03 nats, so one seed cannot tell a
    # gain of the 1 % tolerance (0.014) from noise; seed 0 alone moved V1 by -0.046 and V2 by +0.017
    _check("lm-xs-8k", "lm", size_args=LM_XS, seeds=3),
    # ... and over those three seeds V1 gained 0.030 nats at 16,000 steps (twice the tolerance; softmax 0.005, V2
    # 0.003), enough to turn softmax's lead at 8,000 steps into V1's: the 32 k LM trains 16,000 steps
    _size("lm-xs-16k", "lm", LM_XS, "lm-xs-8k", epochs=160, runs_from="lm-xs-8k-2x"),
    # its three-seed check at 32,000 steps: mean validation loss -0.006 (softmax), +0.020 (V1), +0.003 (V2), no
    # gain of the tolerance, so the 32 k LM stays at 16,000 steps
    _check("lm-xs-16k", "lm", size_args=LM_XS, seeds=3),
    # the smallest LM, at the 16,000 steps its neighbour needed, grids centred on lm-xs-16k's best lrs
    _size("lm-xxs", "lm", LM_XXS, "lm-xs-16k", epochs=160, superseded_by="lm-xxs-32k"),
    _check("lm-xxs", "lm", size_args=LM_XXS, seeds=3),
    # ... whose three-seed check at 32,000 steps moved the mean validation loss by -0.000 (softmax), -0.017 (V1,
    # 1.03 % of its loss: the rule's tolerance) and +0.001 (V2): so the 10 k LM trains 32,000 steps, and the check's
    # runs are this cell's grid runs at its centre lrs
    _size("lm-xxs-32k", "lm", LM_XXS, "lm-xxs", epochs=320, runs_from="lm-xxs-2x"),
    _check("lm-xxs-32k", "lm", size_args=LM_XXS, seeds=3),
)


def cell_named(name: str) -> Cell:
    """The study's cell called ``name`` (:data:`CELLS`); a KeyError naming it when there is none."""
    for cell in CELLS:
        if cell.name == name:
            return cell
    raise KeyError(f"no study cell named {name!r}")


def run_folder(cell: Cell, records: Path) -> Path:
    """Where ``cell``'s trainings write their logs and weights: ``outputs/study/<cell>`` for the study's own
    records, ``<records>/runs/<cell>`` for any other records folder (a retrained row, ``--quick``), so two
    records folders never share a run folder."""
    if Path(records).resolve() == RECORDS.resolve():
        return Path("outputs/study") / cell.name
    return Path(records) / "runs" / cell.name


def sweep_argv(cell: Cell, records: Path, jobs: int, quick: bool, variants: Sequence[str] | None = None,
               lrs: Sequence[float] | None = None, paired: bool = False, seeds: int = GRID_SEEDS,
               final_seeds: int | None = None, extend: int | None = None, epochs: int | None = None) -> list[str]:
    """The :func:`diffzoo.study.sweep.main` arguments of ``cell`` for ``variants`` (default: all of the
    cell's) on the grid ``lrs`` (default: the cell's; ``paired``: one lr per variant, in their order), each
    option once; ``final_seeds``, ``extend`` and ``epochs`` default to the cell's own."""
    variants = list(variants or cell.variants)
    lrs = list(lrs or cell.lrs)
    final_seeds = cell.final_seeds if final_seeds is None else final_seeds
    epochs = cell.epochs if epochs is None else epochs
    if quick:  # the pipeline only: two variants, the grid's centre (paired: their lrs), one grid seed, two finals
        variants, lrs = variants[:2], (lrs[:2] if paired else [lrs[len(lrs) // 2]])
        seeds, final_seeds = 1, min(final_seeds, QUICK_FINAL_SEEDS)
    argv = ["--family", cell.family, "--variants", *variants, "--lrs", *(lr_tag(x) for x in lrs),
            "--seeds", str(seeds), "--final-seeds", str(final_seeds), "--jobs", str(jobs),
            "--out", str(run_folder(cell, records)), "--results", str(records / f"{cell.name}.json"),
            "--extend", str(cell.extend if extend is None else extend)]
    if paired:
        argv.append("--paired")
    if quick:
        argv.append("--quick")
    if epochs is not None:
        argv += ["--epochs", str(epochs)]
    return [*argv, *cell.size_args, *cell.extra]


class WaitsForCell(SystemExit):
    """A cell centred on another cell's best lrs (:attr:`Cell.lr_from`) asked for before that cell has them."""


def cell_sweeps(cell: Cell, records: Path, jobs: int, quick: bool, main_only: bool) -> list[list[str]]:
    """The sweeps (argument lists) that fill ``cell``: one over its variants; for a size-trend cell one per
    variant with a grid centred on that variant's best lr in the cell ``lr_from``; for a budget check one
    with each variant at its best lr in ``lr_from``."""
    variants = [v for v in cell.variants if v in MAIN] if main_only else list(cell.variants)
    if quick:  # the pipeline trains two variants (sweep_argv), so a later cell centres on those two
        variants = variants[:2]
    if cell.lr_from is None:
        return [sweep_argv(cell, records, jobs, quick, variants)]
    source = cell_named(cell.lr_from)
    best = {v: b["lr"] for v, b in (load(records, source).get("best") or {}).items()}
    missing = [v for v in variants if best.get(v) is None]
    if missing:
        raise WaitsForCell(f"cell {cell.name} centres its grid on the best lrs of cell {source.name}, which has none "
                           f"for {', '.join(missing)} yet: run that cell first")
    if cell.epochs_factor is not None:  # the budget check: grid seeds at the best lr, longer; no final runs
        epochs = cell_epochs(cell)
        # one sweep, each variant at its own best lr, so its runs fill every job slot
        return [sweep_argv(cell, records, jobs, quick, variants, [best[v] for v in variants], paired=True,
                           seeds=cell.check_seeds, final_seeds=0, extend=0, epochs=epochs)]
    return [sweep_argv(cell, records, jobs, quick, [v], lr_grid(best[v], cell.grid_points)) for v in variants]


_SETUP = ("family", "recipe", "extra", "quick", "fixed")  # what a records file says its runs were trained with


def _adoptable(records: Path, cell: Cell) -> tuple[dict, dict, dict]:
    """``cell``'s records, those of ``cell.runs_from``, and the finished runs of the latter the former lacks
    (each marked with the cell it comes from) when both records name the same set-up; none otherwise."""
    target = load(records, cell)
    if cell.runs_from is None:
        return target, {}, {}
    source = load(records, cell_named(cell.runs_from))
    if not source.get("runs") or any(k in target and target[k] != source.get(k) for k in _SETUP):
        return target, source, {}
    return target, source, {name: {**run, "adopted_from": cell.runs_from} for name, run in source["runs"].items()
                            if name not in (target.get("runs") or {}) and not run.get("failed")}


def adopt_runs(records: Path, cell: Cell) -> int:
    """Copy into ``cell``'s records the runs of ``cell.runs_from`` it does not hold yet, each marked with the cell
    it came from, when both records name the same set-up (family, extra and fixed arguments, quick or not);
    returns how many were copied. Nothing is copied into records made with another set-up: the sweep refuses
    those itself."""
    target, source, new = _adoptable(records, cell)
    if new:
        target.update({k: source[k] for k in _SETUP if k in source})
        target["runs"] = {**(target.get("runs") or {}), **new}
        write_records(records / f"{cell.name}.json", target)
    return len(new)


def cell_epochs(cell: Cell) -> int:
    """The epochs every run of ``cell`` trains: its own budget, its family's, or for a budget check the
    factor times the budget of the cell it checks."""
    budget = FAMILIES[cell.family].budget
    assert budget is not None, f"family {cell.family} has no study budget"
    if cell.epochs_factor is None:
        return cell.epochs or budget.epochs
    source = cell_named(cell.lr_from)
    return round(cell.epochs_factor * (source.epochs or budget.epochs))


def planned_runs_of(cell: Cell, record: dict | None = None) -> dict[str, int]:
    """Runs of each variant of a cell: grid lrs x grid seeds + final seeds, with the grid lrs its ``record`` holds
    (an extension at an edge adds some); a budget check trains its check seeds per variant."""
    if cell.epochs_factor is not None:
        return {v: cell.check_seeds for v in cell.variants}
    grown = (record or {}).get("grid_lrs") or {}
    return {v: max(len(grown.get(v) or ()), cell.grid_points) * GRID_SEEDS + cell.final_seeds for v in cell.variants}


def planned_runs(cell: Cell, record: dict | None = None) -> int:
    """Runs of a cell in all (:func:`planned_runs_of`)."""
    return sum(planned_runs_of(cell, record).values())


def load(records: Path, cell: Cell) -> dict:
    path = records / f"{cell.name}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def final_runs(record: dict) -> list[dict]:
    """The final runs (fresh seeds at each variant's best lr) of a cell's records."""
    best = {v: b["lr"] for v, b in (record.get("best") or {}).items()}
    return [r for r in (record.get("runs") or {}).values()
            if r["seed"] >= FINAL_SEED and not r.get("knob") and best.get(r["variant"]) == r["lr"]]


def complete_final_runs(record: dict, cell: Cell) -> tuple[list[dict], int]:
    """The final runs of the variants that have all their final seeds (a table never shows a variant half-way
    through them), and how many final runs the records hold in all."""
    final = final_runs(record)
    wanted = QUICK_FINAL_SEEDS if record.get("quick") else cell.final_seeds
    done = {v for v in cell.variants if sum(1 for r in final if r["variant"] == v) >= wanted}
    return [r for r in final if r["variant"] in done], len(final)


def _variant_means(records: Path, cell: Cell, longest: bool = False) -> dict[str, float]:
    """The mean (or ``longest``) wall time of each variant's finished runs in ``cell``'s records (none for
    ``--quick`` ones)."""
    rec = load(records, cell)
    if rec.get("quick"):
        return {}
    seconds: dict[str, list[float]] = {}
    for r in (rec.get("runs") or {}).values():
        if not r.get("failed") and r.get("seconds"):
            seconds.setdefault(r["variant"], []).append(r["seconds"])
    return {v: max(s) if longest else statistics.mean(s) for v, s in seconds.items()}


def _variant_seconds(records: Path, cell: Cell, longest: bool = False) -> dict[str, float]:
    """How long a run of each of ``cell``'s variants takes (seconds; the mean, or the ``longest`` run, which
    ``--finish-by`` wants): from that variant's runs in the cell's own records. A cell with no runs yet takes
    its times from a cell of the same family and model size (of those, the one whose budget is nearest, so that
    the scaling by the ratio of the epochs, which ignores each run's fixed costs, stretches least). A variant
    still without a time is timed from one that has one, by the median over the family's cells (any size) that
    ran both of the ratio of the two variants' mean run times: variants differ by 2-3x in cost, more than sizes
    of one family differ in that ratio, and a cell's own runs carry the speed of the machine they ran on, which
    differed by 2x between sessions (so one cell's ratio, or its longest run, can be far off, and a cell's runs
    timed on another day say less than its own runs of another variant); where no cell ran both, by the mean of
    the variants timed so. Empty when nothing like the cell's runs is recorded."""
    epochs = cell_epochs(cell)
    family = sorted((c for c in CELLS if c.family == cell.family and c.name != cell.name),  # stable: CELLS order
                    key=lambda c: (c.size_args != cell.size_args, abs(math.log(cell_epochs(c) / epochs))))
    times = {v: s for v, s in _variant_means(records, cell, longest).items() if v in cell.variants}
    if not times:  # no runs of its own yet: a same-size cell's, scaled by the epochs
        for other in (c for c in family if c.size_args == cell.size_args):
            for v, s in _variant_means(records, other, longest).items():
                if v in cell.variants:
                    times.setdefault(v, s * epochs / cell_epochs(other))
    missing = [v for v in cell.variants if v not in times]
    if missing and times:
        typical = [_variant_means(records, c) for c in family]  # mean run times: the variants' ratios
        found = dict(times)
        for v in missing:
            for anchor in found:
                ratios = [m[v] / m[anchor] for m in typical if v in m and anchor in m]
                if ratios:
                    times[v] = found[anchor] * statistics.median(ratios)
                    break
    timed = list(times.values())
    for v in (v for v in cell.variants if v not in times and timed):
        times[v] = statistics.mean(timed)
    return {v: times[v] for v in cell.variants if v in times}


def _final_seconds_left(record: dict, cell: Cell) -> dict[str, tuple[int, float]] | None:
    """Once a cell's grid has chosen every variant's lr (only final seeds left), the final runs each variant still
    needs and how long one of its runs takes: the mean of its final runs so far, else of its grid runs (variants
    differ in cost, and the final runs are the latest, so they also carry the machine's current speed). None while
    the grid is still running, or for a budget check."""
    best = record.get("best") or {}
    if cell.epochs_factor is not None or any(v not in best for v in cell.variants):
        return None
    runs = [r for r in (record.get("runs") or {}).values() if not r.get("failed") and not r.get("knob")]
    final = final_runs(record)
    left = {}
    for v in cell.variants:
        missing = cell.final_seeds - sum(1 for r in final if r["variant"] == v)
        if missing <= 0:
            continue
        secs = [r.get("seconds", 0.0) for r in final if r["variant"] == v] or \
            [r.get("seconds", 0.0) for r in runs if r["variant"] == v]
        if not secs:
            return None
        left[v] = (missing, statistics.mean(secs))
    return left


def status_lines(records: Path, cells: Sequence[Cell]) -> list[str]:
    """One line per cell (runs recorded, hours so far, about how long the rest takes), then the total left: each
    variant's planned runs not recorded yet (with the grid extensions recorded so far) times how long one of its
    runs takes (:func:`_variant_seconds`: from the cell's own runs so far, else estimated from the family's
    other cells); a cell with only final seeds left is timed per variant by that variant's own runs."""
    lines = []
    total, unknown = 0.0, []
    width = max((len(c.name) for c in cells), default=0)
    for cell in cells:
        rec = load(records, cell)
        runs = list((rec.get("runs") or {}).values())
        grid = sum(1 for r in runs if r["seed"] < FINAL_SEED)
        final = len(final_runs(rec))
        hours = sum(r.get("seconds", 0.0) for r in runs) / 3600
        done = (grid >= planned_runs(cell)) if cell.epochs_factor is not None else \
            final >= cell.final_seeds * len(cell.variants)
        planned = planned_runs(cell, rec)
        taken = [*runs, *_adoptable(records, cell)[2].values()]  # runs another cell trained count
        left_of = {v: max(n - sum(1 for r in taken if r["variant"] == v), 0)
                   for v, n in planned_runs_of(cell, rec).items()}
        left = sum(left_of.values())
        by_variant = None if rec.get("quick") or done else _final_seconds_left(rec, cell)
        # the per-variant times (which read the family's records) only where the final runs' own do not apply
        times = {} if rec.get("quick") or by_variant or not left else _variant_seconds(records, cell)
        if done:
            tail = " - done"
        elif by_variant:
            seconds = sum(n * secs for n, secs in by_variant.values())
            total += seconds / 3600
            each = ", ".join(f"{v} {n} x {secs / 60:.1f} min" for v, (n, secs) in by_variant.items())
            tail = f", about {seconds / 3600:.1f} hours left ({sum(n for n, _ in by_variant.values())} final runs: {each}" \
                   " so far)"
        elif left and all(v in times for v, n in left_of.items() if n):
            seconds = sum(n * times[v] for v, n in left_of.items() if n)
            total += seconds / 3600
            own = _variant_means(records, cell)
            guessed = [v for v, n in left_of.items() if n and v not in own]
            source = f"; {', '.join(guessed)} timed from other runs" if guessed else " so far"
            each = ", ".join(f"{v} {n} x {times[v] / 60:.1f} min" for v, n in left_of.items() if n)
            tail = f", about {seconds / 3600:.1f} hours left ({left} runs: {each}{source})"
        else:
            tail = ""
            if left and not rec.get("quick"):
                unknown.append(cell.name)
        lines.append(f"{cell.name:{width}s} grid {grid:3d}, final {final:3d} of {cell.final_seeds * len(cell.variants)} "
                     f"(planned about {planned} runs), {hours:.2f} CPU-thread hours" + tail)
    said = []
    if total:
        said.append(f"about {total:.1f} CPU-thread hours (about {total / 2:.1f} hours of wall time at --jobs 2 on 2 cores)")
    if unknown:
        said.append(f"no estimate yet for {', '.join(unknown)}")
    if said:
        lines.append("left in all: " + "; ".join(said))
    return lines


def headline(records: Path, cells: Sequence[Cell]) -> dict:
    """Every finished cell's comparisons with softmax (and its ablations). One Holm runs over the comparisons of
    the cells at each task's final budget (the study's family, ``comparisons``); the cells a longer budget
    superseded (listed in ``earlier``) get a Holm of their own (``comparisons_earlier``)."""
    out: dict = {"cells": {}, "recipe": RECIPE.describe(), "earlier": []}
    family_of: dict[bool, list[dict]] = {False: [], True: []}  # superseded or not: the comparisons of each family
    for cell in cells:
        if cell.lr_from is not None:
            continue  # size-trend cells: :func:`size_trend`
        rec = load(records, cell)
        family = FAMILIES[cell.family]
        final, recorded = complete_final_runs(rec, cell)
        compared = family_of[cell.superseded_by is not None]
        if cell.superseded_by is not None:  # the task itself changed too: the cell that replaced it says how
            after = cell_named(cell.superseded_by)
            if after.name != cell.family:  # replaced by a cell that does not carry the task's name
                out.setdefault("replaced_by", {})[cell.name] = after.name
            if (after.size_args, after.extra) != (cell.size_args, cell.extra):
                out.setdefault("task_changed", {})[cell.name] = (after.name, [*after.size_args, *after.extra],
                                                                 [*cell.size_args, *cell.extra])
        if not any(r["variant"] == "softmax" for r in final) or not rec.get("best"):
            out["cells"][cell.name] = None
            if cell.superseded_by is not None:
                out["earlier"].append(cell.name)
            if rec.get("runs"):
                n = len(rec["runs"])
                out.setdefault("running", {})[cell.name] = (
                    f"running: {n} {'run' if n == 1 else 'runs'} recorded, {recorded} of "
                    f"{cell.final_seeds * len([v for v in cell.variants if v in MAIN])} main final runs")
            continue
        seconds = sum(r.get("seconds", 0.0) for r in rec["runs"].values())
        for k, metric in enumerate((family.test_metric or family.val_metric, *family.also_report)):
            key = cell.name if k == 0 else f"{cell.name} ({metric})"
            if cell.superseded_by is not None:
                out["earlier"].append(key)
            rows = comparison_rows(family, final, "softmax", metric)
            for r in rows:
                r["lr"] = rec["best"][r["variant"]]["lr"]
                r["plateau"] = [run_plateau(family, x) for x in final if x["variant"] == r["variant"]]
                if "vs" in r:
                    r["kind"] = "headline" if r["variant"] in MAIN else "ablation vs softmax"
                    compared.append(r)
            ablations = []
            for variant, parent, what in ABLATIONS:
                if parent == "softmax" or not {variant, parent} <= set(cell.variants):
                    continue
                a = [family.scale * metric_value(x, metric) for x in final if x["variant"] == variant]
                b = [family.scale * metric_value(x, metric) for x in final if x["variant"] == parent]
                a, b = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
                if len(a) > 1 and len(b) > 1:
                    row = {"variant": variant, "parent": parent, "what": what, "vs": compare(a, b).as_dict(),
                           "kind": "ablation"}
                    ablations.append(row)
                    compared.append(row)
            out["cells"][key] = {"cell": cell.name, "family": cell.family, "metric": metric, "label": family.label, "rows": rows,
                                 "command": f"python -m recipes.study run --cells {cell.name}",
                                 "ablations": ablations, "runs": len(rec["runs"]), "seconds": seconds,
                                 "higher_is_better": family.higher_is_better, "scale": family.scale,
                                 "superseded_by": cell.superseded_by, "variants": list(cell.variants)}
    for compared in family_of.values():
        for r, p in zip(compared, holm([r["vs"]["p_perm"] for r in compared])):
            r["p_holm_study"] = p
    out["comparisons"], out["comparisons_earlier"] = len(family_of[False]), len(family_of[True])
    return out


def _mean_cell(by: dict[str, dict], digits: int, lr: bool = True):
    def cell(v: str) -> str:
        r = by.get(v)
        if r is None:
            return "–"
        return f"{fmt(r['mean'], digits)} ± {fmt(r['sd'], digits)}" + (f" (lr {lr_tag(r['lr'])})" if lr else "")
    return cell


def _with_ci(c: dict, digits: int) -> str:
    """A comparison's difference and its 95 % interval: ``+1.09 [-0.35, 2.52]``."""
    return f"{c['diff']:+.{digits}f} [{fmt(c['ci_low'], digits)}, {fmt(c['ci_high'], digits)}]"


def _diff_cell(by: dict[str, dict], digits: int, perm: bool = True):
    def cell(v: str) -> str:
        r = by.get(v)
        if r is None or "vs" not in r:
            return "–"
        return ", ".join([_with_ci(r["vs"], digits), *([fmt_p(r["vs"]["p_perm"])] if perm else []),
                          fmt_p(r.get("p_holm_study"))])
    return cell


def headline_table(result: dict, earlier: bool = False) -> str:
    """Markdown: one line per task, the three main variants' means and their differences to softmax; the cells
    at each task's final budget, or (``earlier``) the cells a longer budget superseded."""
    head = ("| task (metric) | softmax | V1 `diff` | V2 `diff_v2_matched` | V1 - softmax [95 % CI], p perm, p Holm | "
            "V2 - softmax [95 % CI], p perm, p Holm | flat runs | runs, hours | command |")
    lines = [head, "|" + "---|" * 9]
    for name, cell in result["cells"].items():
        if (name in result["earlier"]) != earlier:
            continue
        if cell is None:
            lines.append(f"| {name} | {result.get('running', {}).get(name, 'not run yet')} | | | | | | | |")
            continue
        digits = 2 if cell["scale"] != 1.0 else 3
        by = {r["variant"]: r for r in cell["rows"]}

        mean = _mean_cell(by, digits)
        diff = _diff_cell(by, digits)

        flat = [p for v in MAIN for p in (by[v]["plateau"] if v in by else []) if p is not None]
        flat_text = f"{sum(1 for p in flat if p['flat'])}/{len(flat)}"
        soft, v1, v2 = MAIN
        lines.append(f"| {cell['cell']} ({cell['metric']}) | {mean(soft)} | {mean(v1)} | {mean(v2)} "
                     f"| {diff(v1)} | {diff(v2)} | {flat_text} | {cell['runs']}, "
                     f"{cell['seconds'] / 3600:.1f} | `{cell['command']}` |")
    return "\n".join(lines)


PAGE_START, PAGE_END = "<!-- study-table: start -->", "<!-- study-table: end -->"
SUMMARY_START, SUMMARY_END = "<!-- study-summary: start -->", "<!-- study-summary: end -->"


def table_note(result: dict) -> str:
    """The sentence under the headline table: how many comparisons, and what its p values and hours are."""
    return (f"{result['comparisons']} comparisons; p perm: exact permutation p of the final seeds' test scores; "
            "p Holm: Holm's adjustment over all of them, the study's one family (every task at its final budget, "
            "with the ablations; not the earlier budgets below). Hours: the row's runs' wall times summed, each run "
            "on one thread (OMP_NUM_THREADS=1, two runs at a time on 2 cores); the command trains what its records "
            "file lacks (with the records in the repository it trains nothing; --records DIR with an empty folder "
            "retrains the row).")


EARLIER_TITLE = "### Earlier budgets: the same tasks where the study first stopped them (superseded)"


def earlier_block(result: dict) -> str:
    """The cells a longer budget (or a task made smaller or milder) superseded: their table (the same columns), which
    cell replaced each where that cell does not carry the task's name, and what their p Holm is."""
    # the cell that changed the task, its args and the args of the cells before it -> those cells
    replaced: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[str]] = {}
    for before, (after, args, before_args) in result.get("task_changed", {}).items():
        replaced.setdefault((after, tuple(args), tuple(before_args)), []).append(f"`{before}`")
    changed = "".join(f"; `{after}` also changed the task (it trains with `{' '.join(args)}`, {' and '.join(before)} "
                      + (f"with `{' '.join(before_args)}`)" if before_args else "did not)")
                      for (after, args, before_args), before in replaced.items())
    other = "".join(f", `{before}`'s the row `{after}`" for before, after in result.get("replaced_by", {}).items())
    return (f"{EARLIER_TITLE}\n\nEach row's budget proved too short (its budget check, below, gained on it), so "
            f"the row above with the task's name replaced it{other}{changed}. These rows measure how fast each variant "
            "fits as much as where it ends.\n\n" + headline_table(result, earlier=True)
            + f"\n\n{result['comparisons_earlier']} comparisons; p Holm here: Holm's adjustment over these rows "
              "only, outside the study's family.")


def page_block(result: dict) -> str:
    """The recipe, the headline table and its note."""
    return f"Recipe: {result['recipe']}.\n\n{headline_table(result)}\n\n{table_note(result)}"


def summary_block(result: dict) -> str:
    """The short form of the headline table for the README: the finished cells at each task's final budget
    (means, differences with their 95 % CI and the study's Holm p), and the cells and variants still to come."""
    lines = ["| task (metric) | softmax | V1 `diff` | V2 `diff_v2_matched` | V1 - softmax [95 % CI], p Holm | "
             "V2 - softmax [95 % CI], p Holm |", "|" + "---|" * 6]
    waiting = []
    for name, cell in result["cells"].items():
        if name in result["earlier"]:
            continue
        if cell is None:
            waiting.append(name)
            continue
        digits = 2 if cell["scale"] != 1.0 else 3
        by = {r["variant"]: r for r in cell["rows"]}
        # a cell still running shows its finished variants only; the ones it does not run are not to come
        missing = [v for v in MAIN if v in cell["variants"] and v not in by]
        if missing:  # (a task's second metric names the same cell)
            waiting.append(f"{cell['cell']} ({' and '.join(missing)})")
        mean, diff = _mean_cell(by, digits, lr=False), _diff_cell(by, digits, perm=False)
        soft, v1, v2 = MAIN
        lines.append(f"| {cell['cell']} ({cell['metric']}) | {mean(soft)} | {mean(v1)} | {mean(v2)} | {diff(v1)} | "
                     f"{diff(v2)} |")
    tail = (f"Mean ± sd of {FINAL_SEEDS} final seeds per variant, each at its own best learning rate; p Holm: the exact "
            f"permutation p adjusted over the study's {result['comparisons']} comparisons finished so far.")
    if waiting:
        tail += f" Still to come: {', '.join(dict.fromkeys(waiting))}."
    return "\n".join(lines) + "\n\n" + tail


def cell_voice_stats(records: Path, cell: Cell) -> dict:
    """:func:`~diffzoo.study.tables.speech_voice_stats` of a speech cell, over the variants that have all their
    final seeds (the headline's rule: no variant's test scores are shown half-way through them)."""
    record = load(records, cell)
    return speech_voice_stats(record, variants={r["variant"] for r in complete_final_runs(record, cell)[0]})


def report_markdown(records: Path, cells: Sequence[Cell], result: dict, folder: Path) -> str:
    """The whole report as markdown, for a file in ``folder`` (its links to the plots in ``records`` are
    relative to it): the headline table, the final seeds' plot, the ablations, speech's voice-level
    statistics, the count of final seeds that learn a task whose seeds split so (MQAR, needle retrieval), the budget
    checks and the size trend, each section as soon as its cells have records.
    ``report`` writes it to ``table.md`` and, with ``--page``, between the page's markers."""
    def link(name: str) -> str:
        return Path(os.path.relpath(records / name, folder)).as_posix()

    parts = [page_block(result)]
    if any(result["cells"].values()):
        parts.append(f"![every final seed's test score per task and variant]({link('headline.png')})")
    if result["earlier"]:
        parts.append(earlier_block(result))
    ablations = ablation_table(result)
    if ablations.count("\n") > 1:  # more than the header
        parts.append("### Ablations: each against the variant it changes\n\n" + ablations)
    for cell in (c for c in cells if c.family == "speech" and c.lr_from is None):
        voices = cell_voice_stats(records, cell)
        if voices["rows"]:
            parts.append(f"### Speech (`{cell.name}`): test voices resampled, and the gap against SNR\n\n"
                         + speech_voice_table(voices))
    for cell in (c for c in cells if FAMILIES[c.family].success is not None and c.lr_from is None
                 and c.epochs_factor is None):
        family = FAMILIES[cell.family]
        final = complete_final_runs(load(records, cell), cell)[0]
        if final and family.test_metric:
            unit = " %" if family.scale == 100.0 else ""
            parts.append(f"### How many final seeds learn the task (`{cell.name}`)\n\nA run counts when its test "
                         f"score reaches {family.success:g}{unit}; the counts are a second reading of the headline's "
                         "runs for a task whose seeds split between learning it and staying on a floor, chance or a "
                         "shortcut (where a mean and a Welch interval describe them poorly). Fisher's exact p is "
                         "two-sided and outside the study's Holm family.\n\n"
                         + success_table(family, success_rows(family, final, "softmax", family.test_metric), "softmax"))
    noise = noise_gaps(records, cells)
    if noise:
        parts.append("### Does the gap change with noise? Each cell at a fixed noise level against its task's cell\n\n"
                     + noise_table(noise) + "\n\nEach gap is the variant minus softmax over the final seeds (Welch "
                     "95 % CI), each cell at its own best learning rates and budget; the change is the gap at the fixed noise "
                     "minus the gap in the task's cell, with a Welch-Satterthwaite 95 % interval over the four groups "
                     "of seeds and its two-sided t p, outside the study's Holm family.")
    gaps = gap_by_budget(result, cells)
    if gaps:
        parts.append("### The gap against the budget: each task's cells at more than one budget\n\n" + gap_table(gaps)
                     + "\n\nEach difference is the variant minus softmax in the row's metric (Welch 95 % CI): for an "
                       "accuracy or recall a positive one favours the variant, for a loss a negative one does.")
    checks = budget_checks(records, cells)
    if checks:
        parts.append("### Budget check: grid seeds at each variant's best lr, trained longer (column `longer`: how many "
                     "times the budget; each metric the mean over the seeds named, each seed against its own run at "
                     "the budget)\n\n" + budget_table(checks))
    trend = size_trend(records, cells)
    if trend:
        parts.append("### Size trend\n\n" + size_table(trend).rstrip("\n")
                     + f"\n\n![test metric against parameters, per variant]({link('size_trend.png')})")
    return "\n\n".join(parts)


def _split_page(path: Path, markers: tuple[str, str]) -> tuple[str, str, str] | None:
    """A page's text before the start marker, between the markers, and after the end marker; None unless it
    holds each marker once, in that order."""
    text = path.read_text()
    start, end = markers
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        return None
    head, rest = text.split(start)
    block, tail = rest.split(end)
    return head, block, tail


def update_page(path: Path, block: str, markers: tuple[str, str] = (PAGE_START, PAGE_END)) -> None:
    """Replace the text between ``markers`` (default :data:`PAGE_START` and :data:`PAGE_END`) in ``path`` with
    ``block``."""
    parts = _split_page(path, markers)
    start, end = markers
    if parts is None:
        raise SystemExit(f"{path}: the page needs one line {start} and, after it, one line {end}; "
                         "the table goes between them")
    head, _, tail = parts
    path.write_text(f"{head}{start}\n{block}\n{end}{tail}")


def page_table(path: Path, markers: tuple[str, str] = (PAGE_START, PAGE_END)) -> str:
    """The block a page holds between its markers ('' when it has none)."""
    parts = _split_page(path, markers)
    return "" if parts is None else parts[1].strip("\n")


def ablation_table(result: dict) -> str:
    """Markdown: every ablation against softmax (the headline's rows) and against the variant it changes; a row
    against softmax of an ablation whose parent is not softmax compares all of its changes at once."""
    against_softmax = {v: what for v, parent, what in ABLATIONS if parent == "softmax"}
    lines = ["| task | variant | against | what it isolates | diff [95 % CI] | p perm | p Holm (study) |",
             "|" + "---|" * 7]
    for name, cell in result["cells"].items():
        if not cell:
            continue
        digits = 2 if cell["scale"] != 1.0 else 3
        rows = [r for r in cell["rows"] if r.get("kind") == "ablation vs softmax"] + cell["ablations"]
        for r in rows:
            c = r["vs"]
            what = r.get("what") or against_softmax.get(r["variant"], "every change from softmax at once")
            lines.append(f"| {name} | {r['variant']} | {r.get('parent', 'softmax')} | {what} | "
                         f"{c['diff']:+.{digits}f} [{fmt(c['ci_low'], digits)}, {fmt(c['ci_high'], digits)}] | "
                         f"{fmt_p(c['p_perm'])} | {fmt_p(r.get('p_holm_study'))} |")
    return "\n".join(lines)


def _is_size(cell: Cell) -> bool:
    return cell.lr_from is not None and cell.epochs_factor is None


def budget_checks(records: Path, cells: Sequence[Cell]) -> list[dict]:
    """For every budget-check cell with runs: per variant, the validation metric at the best lr after the
    study's budget (the source cell's grid runs) and after ``epochs_factor`` times it, each the mean over the
    check's seeds that both have (paired: seed s longer against seed s at the budget), with the plateau verdict
    of each (``flat``: every one of those runs met the rule; ``flat_n``: how many did)."""
    rows = []
    for cell in cells:
        if cell.epochs_factor is None:
            continue
        family = FAMILIES[cell.family]
        source = cell_named(cell.lr_from)
        src, chk = load(records, source), load(records, cell)
        for v in cell.variants:
            lr = ((src.get("best") or {}).get(v) or {}).get("lr")
            long = {r["seed"]: r for r in (chk.get("runs") or {}).values() if r["variant"] == v
                    and r["seed"] < cell.check_seeds}
            short = {r["seed"]: r for r in (src.get("runs") or {}).values() if r["variant"] == v
                     and r["lr"] == lr and r["seed"] in long}
            seeds = sorted(short)
            if not seeds:
                continue
            value = {k: [family.scale * metric_value(runs[s], family.val_metric) for s in seeds]
                     for k, runs in (("short", short), ("long", long))}
            flat = {k: [(run_plateau(family, runs[s]) or {}).get("flat") for s in seeds]
                    for k, runs in (("short", short), ("long", long))}
            rows.append({"cell": source.name, "variant": v, "lr": lr, "metric": family.val_metric, "seeds": seeds,
                         "budget": statistics.mean(value["short"]), "longer": statistics.mean(value["long"]),
                         "factor": cell.epochs_factor, "flat": _all(flat["short"]), "flat_longer": _all(flat["long"]),
                         "flat_n": sum(bool(f) for f in flat["short"]),
                         "flat_longer_n": sum(bool(f) for f in flat["long"]),
                         "higher_is_better": family.higher_is_better, "scale": family.scale})
    return rows


def _all(verdicts: list[bool | None]) -> bool | None:
    """Every verdict true (None when any run has none)."""
    return None if any(f is None for f in verdicts) else all(verdicts)


def budget_words(cell: Cell) -> str:
    """A cell's budget as its recipe counts it: ``4,000 steps`` (a family that warms up in steps) or ``80 epochs``."""
    budget = FAMILIES[cell.family].budget
    assert budget is not None, f"family {cell.family} has no study budget"
    epochs = cell_epochs(cell)
    return f"{epochs * budget.steps_per_epoch:,} steps" if budget.steps_per_epoch else f"{epochs} epochs"


def gap_by_budget(result: dict, cells: Sequence[Cell]) -> list[dict]:
    """For every task with finished cells at more than one budget (same family and arguments, default size):
    each cell's V1 - softmax and V2 - softmax differences on its reported metric, shortest budget first."""
    tasks: dict[tuple, list[Cell]] = {}
    for cell in cells:
        if cell.lr_from is None and not cell.size_args and result["cells"].get(cell.name):
            tasks.setdefault((cell.family, cell.extra), []).append(cell)
    rows = []
    for group in tasks.values():
        if len(group) < 2:
            continue
        for cell in sorted(group, key=cell_epochs):
            found = result["cells"][cell.name]
            by = {r["variant"]: r for r in found["rows"]}
            rows.append({"cell": cell.name, "family": cell.family, "metric": found["metric"],
                         "budget": budget_words(cell), "scale": found["scale"],
                         "vs": {v: by[v]["vs"] for v in MAIN[1:] if v in by and "vs" in by[v]}})
    return rows


def gap_table(rows: list[dict]) -> str:
    lines = ["| task | cell | budget | V1 - softmax [95 % CI] | V2 - softmax [95 % CI] |", "|" + "---|" * 5]
    for r in rows:
        digits = 2 if r["scale"] != 1.0 else 3

        def diff(v: str, r: dict = r, digits: int = digits) -> str:
            return "–" if v not in r["vs"] else _with_ci(r["vs"][v], digits)

        lines.append(f"| {r['family']} ({r['metric']}) | {r['cell']} | {r['budget']} | {diff(MAIN[1])} | "
                     f"{diff(MAIN[2])} |")
    return "\n".join(lines)


# a cell at one fixed noise level -> its task's cell at the same budget (the usual mix of levels; the same seeds)
NOISY_OF = {"speech-0db": "speech", "speech-0db-320ep": "speech-320ep", "speech-noisy": "speech-320ep"}


def noise_gaps(records: Path, cells: Sequence[Cell], reference: str = "softmax", confidence: float = 0.95) -> list[dict]:
    """Does a variant's gap to ``reference`` change with noise? For each cell of ``cells`` at a fixed noise level
    (:data:`NOISY_OF`) whose task's cell is in ``cells`` too, per variant with all its final seeds, and
    ``reference``'s, in both: each cell's gap (variant minus ``reference`` in the test metric, Welch interval) and
    the change of the gap from the task's cell to the noisy one, ``(a - b) - (c - d)`` over the four groups of
    final seeds, with its Welch-Satterthwaite interval and two-sided t p (:func:`~diffzoo.stats.welch_contrast`).
    Each cell's learning rates are tuned on its own validation set, so the change is not an lr chosen for other
    noise. One test per variant, outside the study's Holm family."""
    by_name = {c.name: c for c in cells}
    rows = []
    for noisy in cells:
        clean = by_name.get(NOISY_OF.get(noisy.name, ""))
        if clean is None:
            continue
        family = FAMILIES[noisy.family]
        scores: dict[tuple[str, str], list[float]] = {}
        for cell in (clean, noisy):
            for r in complete_final_runs(load(records, cell), cell)[0]:
                x = family.scale * metric_value(r, family.test_metric)
                if math.isfinite(x):
                    scores.setdefault((cell.name, r["variant"]), []).append(x)
        for v in noisy.variants:
            groups = [scores.get((c.name, w), []) for c in (noisy, clean) for w in (v, reference)]
            if v == reference or min(map(len, groups)) < 2:
                continue
            change = welch_contrast(groups, (1.0, -1.0, -1.0, 1.0), confidence)
            rows.append({"cell": noisy.name, "clean": clean.name, "family": noisy.family,
                         "budget_noisy": budget_words(noisy), "budget_clean": budget_words(clean),
                         "metric": family.test_metric, "scale": family.scale, "variant": v, "reference": reference,
                         "n": [len(g) for g in groups], "gap_noisy": welch(groups[0], groups[1], confidence),
                         "gap_clean": welch(groups[2], groups[3], confidence),
                         "change": change})
    return rows


def noise_table(rows: list[dict]) -> str:
    lines = ["| task (metric) | variant | gap in the task's cell [95 % CI] | gap at the fixed noise [95 % CI] | "
             "change [95 % CI], p |", "|" + "---|" * 5]
    for r in rows:
        digits = 2 if r["scale"] != 1.0 else 3
        lines.append(f"| {r['family']} ({r['metric']}) | {r['variant']} - {r['reference']} | {r['clean']} "
                     f"({r['budget_clean']}): {_with_ci(r['gap_clean'], digits)} | {r['cell']} ({r['budget_noisy']}): "
                     f"{_with_ci(r['gap_noisy'], digits)} | "
                     f"{_with_ci(r['change'], digits)}, {fmt_p(r['change']['p'])} |")
    return "\n".join(lines)


def budget_table(rows: list[dict]) -> str:
    lines = ["| task | variant | lr | seeds | validation metric | at the budget | longer | at the longer budget | "
             "change | flat at the budget | flat at the longer budget |", "|" + "---|" * 11]

    def said(flat: bool | None, n: int, of: int) -> str:  # one seed: yes / no; several: how many met the rule
        return "–" if flat is None else (f"{n} of {of}" if of > 1 else "yes" if flat else "no")

    for r in rows:
        digits = 2 if r["scale"] != 1.0 else 3
        change = r["longer"] - r["budget"]
        of = len(r["seeds"])
        lines.append(f"| {r['cell']} | {r['variant']} | {lr_tag(r['lr'])} | {', '.join(map(str, r['seeds']))} | "
                     f"{r['metric']} | {r['budget']:.{digits}f} | {r['factor']:g}x | {r['longer']:.{digits}f} | "
                     f"{change:+.{digits}f} | {said(r['flat'], r['flat_n'], of)} | "
                     f"{said(r['flat_longer'], r['flat_longer_n'], of)} |")
    return "\n".join(lines)


def size_trend(records: Path, cells: Sequence[Cell]) -> dict:
    """Per family with size-trend cells and results at two sizes or more: for every size and main variant, the
    final runs' test metric (mean, sd, n) and the model's parameter count (from the runs' summaries). A size
    cell whose budget proved too short (``superseded_by``) stands for its size until the cell that replaced it
    has every variant's final runs, and from then on that cell does (never both, never a cell half-way)."""
    trend: dict[str, list[dict]] = {}
    replaces = {c.superseded_by: c for c in CELLS if c.superseded_by is not None}
    families = {c.family for c in cells if _is_size(c)}
    for fam in sorted(families):
        family = FAMILIES[fam]
        metric = family.test_metric or family.val_metric
        points = []
        for cell in [c for c in CELLS if c.family == fam and not _replaced(records, c)
                     and (c.name not in replaces or _replaced(records, replaces[c.name]))
                     and (_is_size(c) or any(x.lr_from == c.name and _is_size(x) for x in CELLS))]:
            rec = load(records, cell)
            for v in MAIN:
                runs = [r for r in complete_final_runs(rec, cell)[0] if r["variant"] == v]
                vals = [family.scale * metric_value(r, metric) for r in runs]
                vals = [x for x in vals if math.isfinite(x)]
                params = [r["summary"].get("parameters") for r in runs if r["summary"].get("parameters")]
                if vals:
                    points.append({"cell": cell.name, "variant": v, "metric": metric, "n": len(vals),
                                   "mean": statistics.mean(vals), "sd": statistics.stdev(vals) if len(vals) > 1
                                   else float("nan"), "parameters": params[0] if params else None,
                                   "lr": (rec.get("best") or {}).get(v, {}).get("lr")})
        if len({p["cell"] for p in points}) >= 2:  # one size is not a trend
            trend[fam] = points
    return trend


def _replaced(records: Path, cell: Cell) -> bool:
    """Whether the cell that supersedes ``cell`` has every main variant's final runs."""
    if cell.superseded_by is None:
        return False
    after = cell_named(cell.superseded_by)
    runs = complete_final_runs(load(records, after), after)[0]
    return {r["variant"] for r in runs} >= set(MAIN)


def parameters_for(points: list[dict], variant: str, target: float, higher_is_better: bool) -> float | None:
    """The parameter count at which ``variant`` reaches ``target``, interpolated linearly in log-parameters
    between its two sizes that bracket it; None when no two sizes do."""
    pts = sorted((p["parameters"], p["mean"]) for p in points if p["variant"] == variant and p["parameters"])
    for (n0, m0), (n1, m1) in zip(pts, pts[1:]):
        if (m0 - target) * (m1 - target) <= 0 and m0 != m1:
            t = (target - m0) / (m1 - m0)
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return None


def plot_size_trend(trend: dict[str, list[dict]], path: Path) -> None:
    """Metric against parameters (log axis) per variant, one panel per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    fams = [f for f, pts in trend.items() if any(p["parameters"] for p in pts)]
    if not fams:
        return
    fig, axes = plt.subplots(1, len(fams), figsize=(4.5 * len(fams), 3.6), dpi=90, squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for v in MAIN:
            pts = sorted((p["parameters"], p["mean"], p["sd"]) for p in trend[fam] if p["variant"] == v
                         and p["parameters"])
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                            capsize=3, label=SHORT[v])
        ax.set_xscale("log")
        family = FAMILIES[fam]
        if not family.higher_is_better:  # a loss: log axis (scaling laws are straight there), plain tick labels
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
        ax.set_xlabel("parameters")
        ax.set_ylabel(trend[fam][0]["metric"] if trend[fam] else "")
        ax.set_title(fam)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def size_table(trend: dict[str, list[dict]]) -> str:
    lines = []
    for fam, pts in trend.items():
        family = FAMILIES[fam]
        digits = 2 if family.scale != 1.0 else 3
        lines += [f"**{fam}** ({pts[0]['metric'] if pts else ''})", "",
                  "| cell | parameters (softmax) | softmax | V1 | V2 | V1 needs for softmax's value | "
                  "V2 needs for softmax's value |", "|" + "---|" * 7]
        for cell in dict.fromkeys(p["cell"] for p in pts):
            by = {p["variant"]: p for p in pts if p["cell"] == cell}
            soft = by.get("softmax")

            def val(v: str, by: dict = by) -> str:
                p = by.get(v)
                return "–" if p is None else f"{fmt(p['mean'], digits)} ± {fmt(p['sd'], digits)} (n={p['n']})"  # noqa: B023

            def need(v: str, soft: dict | None = soft) -> str:
                if soft is None:
                    return "–"
                n = parameters_for(pts, v, soft["mean"], family.higher_is_better)  # noqa: B023
                return "outside the sizes run" if n is None else f"{n:,.0f}"

            size = f"{soft['parameters']:,}" if soft and soft["parameters"] else "–"
            soft_, v1, v2 = MAIN
            lines.append(f"| {cell} | {size} | {val(soft_)} | {val(v1)} | {val(v2)} | "
                         f"{need(v1)} | {need(v2)} |")
        lines.append("")
    return "\n".join(lines)


def plot_headline(result: dict, path: Path) -> None:
    """One panel per finished task: each final seed's score per variant, and the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = {k: v for k, v in result["cells"].items() if v and k not in result["earlier"]}
    if not cells:
        return
    cols = min(len(cells), 4)  # rows of at most four panels
    rows = -(-len(cells) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), dpi=90, squeeze=False)
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    for ax, (name, cell) in zip(axes.flat, cells.items()):
        by = {r["variant"]: r for r in cell["rows"]}
        names = [v for v in MAIN if v in by]
        for i, v in enumerate(names):
            vals = [x for x in by[v]["values"] if math.isfinite(x)]
            ax.scatter([i] * len(vals), vals, s=12, alpha=0.6)
            if vals:
                ax.hlines(statistics.mean(vals), i - 0.3, i + 0.3, colors="k")
        ax.set_xticks(range(len(names)), [SHORT[v]
                                          for v in names])
        ax.set_title(f"{name}\n{cell['metric']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


VERIFY_FILE = "verify.json"


def verify_cell(records: Path, cell_name: str, variants: Sequence[str], out: Path) -> list[dict]:
    """Train the runs :func:`verify_choice` picks again with the code there now (into ``out``) and compare
    every metric the record holds with what the new run gives: ``{"run", "metric", "recorded", "now",
    "identical"}`` per metric, or one row with ``"error"`` when the cell cannot be trained again as recorded."""
    from .provenance import verify_choice
    from .sweep import fixed_args, train_run, with_epochs

    cell = cell_named(cell_name)
    record = load(records, cell)
    family = with_epochs(FAMILIES[cell.family], cell_epochs(cell))  # the family as the cell's sweep trains it
    fixed = fixed_args(family)
    extra = [*cell.size_args, *cell.extra]
    if record.get("fixed", fixed) != fixed or record.get("extra", []) != extra:
        return [{"run": None, "error": f"the records were made with {record.get('fixed')} {record.get('extra')}, "
                                       f"the cell now trains with {fixed} {extra}"}]
    rows = []
    for old in verify_choice(record, [v for v in variants if v in cell.variants]):
        new = train_run(family, out / cell.name, old["variant"], old["lr"], old["seed"], False, extra)
        before = (old.get("summary") or {}).get("metrics") or {}
        after = (new.get("summary") or {}).get("metrics") or {}
        for metric in sorted(k for k in before if k.startswith(("val/", "test/"))):
            a, b = before[metric], after.get(metric)
            rows.append({"run": old["name"], "metric": metric, "recorded": a, "now": b, "identical": a == b})
        if new.get("failed"):
            rows.append({"run": old["name"], "error": new["failed"]})
        then, now = (old.get("curves") or {}).get(family.val_metric), (new.get("curves") or {}).get(family.val_metric)
        if then and now:  # where the validation curves part: the same data and start, and when rounding told
            same = next((i for i, (a, b) in enumerate(zip(then, now)) if a != b), min(len(then), len(now)))
            rows.append({"run": old["name"], "curve": family.val_metric, "points": len(then), "same_points": same,
                         "parted_at_step": now[same][0] if same < min(len(then), len(now)) else None,
                         "machine_then": {k: (old.get("code") or {}).get(k) for k in MACHINE_KEYS}})
    return rows


def _machine(stamp: dict) -> str:
    return "a machine its record does not name" if not any(stamp.values()) else \
        f"{stamp.get('cpu')} ({stamp.get('cpu_model')}), {stamp.get('threads')} thread(s)"


def verify_machine(entry: dict) -> tuple:
    """The machine a verify.json entry was trained on (:data:`MACHINE_KEYS` of its code stamp; all None for an
    entry from before stamps named it)."""
    return tuple((entry.get("code") or {}).get(k) for k in MACHINE_KEYS)


def verify_entries(entry: dict) -> list[dict]:
    """A run's verify.json entry and the earlier ones it keeps from other machines, newest first."""
    return [{k: v for k, v in entry.items() if k != "before"}, *entry.get("before", [])]


def with_earlier(new: dict, old: dict | None) -> dict:
    """A run's verify.json entry ``new``, replacing ``old``: the outcomes ``old`` held from other machines (itself
    and its ``before``) stay under ``before``, newest first, one per machine; one from ``new``'s machine is replaced.
    Float rounding differs between machines, so what one of them found is kept when another trains the run again."""
    kept: dict[tuple, dict] = {}
    for e in [] if old is None else verify_entries(old):
        kept.setdefault(verify_machine(e), e)
    kept.pop(verify_machine(new), None)
    return {**new, **({"before": list(kept.values())} if kept else {})}


def verify_lines(records: Path, cells: Sequence[str], variants: Sequence[str],
                 out: Path = Path("outputs/study-verify")) -> list[str]:
    """``python -m recipes.study verify``: train each cell's chosen runs again (:func:`verify_cell`), add what
    was found to ``<records>/verify.json`` (per cell and run trained again: when, the code stamp, the rows;
    a later call replaces a run's entry from the same machine and keeps those from other machines under
    ``before``, :func:`with_earlier`; other runs' entries stay) and say it."""
    from .runs import code_stamp

    path = Path(records) / VERIFY_FILE
    lines = []
    for cell in cells:
        if not (Path(records) / f"{cell}.json").is_file():
            continue
        rows = verify_cell(records, cell, variants, out)
        if not rows:
            continue
        curves = {r["run"]: r for r in rows if "curve" in r}
        rows = [r for r in rows if "curve" not in r]
        found = json.loads(path.read_text()) if path.is_file() else {}
        when, code = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), code_stamp()
        for run in dict.fromkeys(r["run"] for r in rows):  # per run trained again: the latest outcome
            entries, key = found.setdefault(cell, {}), run or "(cell)"
            entries[key] = with_earlier({"when": when, "code": code, "rows": [r for r in rows if r["run"] == run],
                                         **({"curve": curves[run]} if run in curves else {})}, entries.get(key))
        path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        errors = [r for r in rows if "error" in r]
        same = [r for r in rows if r.get("identical")]
        compared = [r for r in rows if "identical" in r]
        lines.append(f"{cell}: {len(same)} of {len(compared)} metrics identical over "
                     f"{len({r['run'] for r in compared})} runs trained again" + (f"; {len(errors)} errors" if errors else ""))
        lines += [f"  {r['run']} {r['metric']}: recorded {r['recorded']!r}, now {r['now']!r}"
                  for r in compared if not r["identical"]]
        here = {k: code.get(k) for k in MACHINE_KEYS}
        for run, c in curves.items():
            if c["parted_at_step"] is not None or any(r["run"] == run and not r["identical"] for r in compared):
                lines.append(f"  {run}: {c['curve']} the same at its first {c['same_points']} of {c['points']} "
                             f"evaluations" + (f", apart from step {c['parted_at_step']} on" if c["parted_at_step"]
                                               is not None else "") +
                             f"; recorded on {_machine(c['machine_then'])}, trained again on {_machine(here)}")
        lines += [f"  {r['run'] or cell}: {r['error']}" for r in errors]
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m recipes.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "status", "report", "code", "verify"),
                   help="run the cells; status: runs recorded and time left; report: the tables and plots; code: "
                        "which code trained each cell's runs and what of it changed since; verify: train one "
                        "recorded run per variant again with the code there now and compare its metrics")
    p.add_argument("--cells", nargs="+", default=None, choices=[c.name for c in CELLS], metavar="CELL",
                   help=f"cells to run or report, in this order (default: all, in order: {', '.join(c.name for c in CELLS)})")
    p.add_argument("--jobs", type=int, default=2, help="trainings at once (one process each; default 2)")
    p.add_argument("--records", type=Path, default=RECORDS, help=f"records folder (default {RECORDS})")
    p.add_argument("--quick", action="store_true", help="smoke mode: few-step runs, 1 grid seed, 2 final seeds")
    p.add_argument("--main-only", action="store_true",
                   help="run: only softmax, diff and diff_v2_matched of each cell (the ablations stay for a later "
                        "call on the same records)")
    p.add_argument("--finish-by", default=None, metavar="WHEN",
                   help="run: " + FINISH_BY_HELP + "; a cell with no runs yet is judged by the mean run of a cell of "
                        "the same family and size; a cell whose next run would end too late stops there and the "
                        "cells after it are tried in turn, save those that need it and those whose run length "
                        "nothing recorded can tell")
    p.add_argument("--page", type=Path, default=None,
                   help=f"report: also write the headline table into this markdown page, between its lines "
                        f"{PAGE_START} and {PAGE_END} (the study's page: docs/results.md; default: none)")
    p.add_argument("--summary", type=Path, default=None,
                   help=f"report: also write the short table of the finished final-budget cells into this page, "
                        f"between its lines {SUMMARY_START} and {SUMMARY_END} (the README; default: none)")
    p.add_argument("--variants", nargs="+", default=list(MAIN), metavar="VARIANT",
                   help=f"verify: the variants whose first final run (a budget check: seed 0) is trained again "
                        f"(default: {' '.join(MAIN)})")
    args = p.parse_args(argv)
    by_name = {c.name: c for c in CELLS}
    cells = list(CELLS) if args.cells is None else [by_name[n] for n in dict.fromkeys(args.cells)]  # in the order given
    if (args.page is not None or args.summary is not None) and args.cells is not None:
        p.error("--page and --summary write the whole study's table (one Holm over every cell): leave out --cells")
    if args.quick and args.records == RECORDS:
        p.error("--quick writes smoke records: give another --records folder than the study's")
    if args.finish_by is not None:
        if args.command != "run":
            p.error("--finish-by limits the trainings of the run command only")
        try:
            finish_by(parse_finish_by(args.finish_by))
        except ValueError as e:
            p.error(str(e))
    if args.command == "run":
        from .sweep import main as sweep

        stopped: list[str] = []  # cells whose next run would have ended after --finish-by
        paused = False  # whether a training of theirs was paused at --finish-by (it resumes next call)
        waiting: list[str] = []  # cells whose lr source has no best lrs yet
        for cell in cells:
            start = time.time()
            if stopped and (waits := [c for c in (cell.lr_from, cell.runs_from) if c in stopped]):
                print(f"== cell {cell.name}: not started, it needs cell {waits[0]}, which stopped for --finish-by",
                      flush=True)
                stopped.append(cell.name)
                continue
            if stopped and not args.quick and not _variant_seconds(args.records, cell):  # might be cut short
                print(f"== cell {cell.name}: not started after a --finish-by stop, as nothing like its runs is "
                      "recorded to say how long one takes", flush=True)
                continue
            print(f"== cell {cell.name}", flush=True)
            try:  # held from the adoption to the cell's last run: no other process writes these records meanwhile
                with records_lock(args.records / f"{cell.name}.json"):
                    if not args.quick and (adopted := adopt_runs(args.records, cell)):
                        print(f"took {adopted} runs of cell {cell.runs_from} (the same set-up) into its records",
                              flush=True)
                    times = {} if args.quick else _variant_seconds(args.records, cell, longest=True)
                    # for --finish-by, padded as the sweep pads the longest run like the next one
                    guess = ["--run-minutes", *(f"{v}={RUN_TIME_SPARE * t / 60:.2f}" for v, t in times.items())] \
                        if times else []
                    for argv in cell_sweeps(cell, args.records, args.jobs, args.quick, args.main_only):
                        sweep([*argv, *guess])
            except RecordsBusy as e:
                raise SystemExit(f"cell {cell.name}: {e}") from None
            except WaitsForCell as e:  # the cells after it may still train
                print(f"== cell {cell.name}: not started: {e}", flush=True)
                waiting.append(str(e))
                continue
            except Finishing as e:  # its trainings in flight have finished and are recorded
                if not carry_on_after_finish_by():  # told to finish (SIGUSR1): nothing more starts
                    raise
                print(f"== cell {cell.name} stopped after {time.time() - start:.0f} s: {e}; the cells after it "
                      "may still have a run that ends in time", flush=True)
                stopped.append(cell.name)
                paused = paused or isinstance(e, Paused)
                continue
            print(f"== cell {cell.name} done in {time.time() - start:.0f} s", flush=True)
        if stopped:  # Paused when a training was paused at its checkpoint, so the closing line says so
            raise (Paused if paused else Finishing)(f"cells left for later by --finish-by: {', '.join(stopped)}")
        if waiting:
            raise SystemExit("; ".join(waiting))
    elif args.command == "status":
        print("\n".join(status_lines(args.records, cells)))
    elif args.command == "verify":
        for cell in cells:  # each cell's outcome as soon as it is known
            lines = verify_lines(args.records, [cell.name], args.variants)
            if lines:
                print("\n".join(lines), flush=True)
    elif args.command == "code":
        from .provenance import code_lines, repository_root

        print("\n".join(code_lines(args.records, [c.name for c in cells], repository_root(args.records))))
    else:
        result = headline(args.records, cells)
        args.records.mkdir(parents=True, exist_ok=True)
        text = report_markdown(args.records, cells, result, args.records) + "\n"
        if args.page is not None:
            update_page(args.page, report_markdown(args.records, cells, result, args.page.parent))
        if args.summary is not None:
            update_page(args.summary, summary_block(result), (SUMMARY_START, SUMMARY_END))
        (args.records / "table.md").write_text(text)
        (args.records / "table.json").write_text(json.dumps(result, indent=1))
        plot_headline(result, args.records / "headline.png")
        for cell in cells:  # validation metric and gradient norm per variant: the plateau and the clipping, seen
            rec = load(args.records, cell)
            final = final_runs(rec)
            if final:
                plot_curves(FAMILIES[cell.family], final, args.records / f"{cell.name}_curves.png")
            if rec.get("best") and cell.epochs_factor is None:  # the metric against the lr: how sharp the optimum is
                plot_grid(FAMILIES[cell.family], rec["best"], args.records / f"{cell.name}_grid.png")
        trend = size_trend(args.records, cells)
        if trend:
            (args.records / "size_trend.json").write_text(json.dumps(trend, indent=1))
            plot_size_trend(trend, args.records / "size_trend.png")
        else:  # no trend yet: none left over from records that have changed since
            for name in ("size_trend.json", "size_trend.png"):
                (args.records / name).unlink(missing_ok=True)
        print(text)
