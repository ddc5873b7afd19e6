"""Which code trained a study's runs, and what of it has changed since: ``python -m recipes.study code``.

A run's own record says it when it has ``code`` (:func:`diffzoo.study.runs.code_stamp`): the commit it was
trained at and the training files that differed from that commit then. A run recorded before that field
existed is dated by the first commit of its records file that holds it: the code committed then is the newest
code that can have trained it (a run is trained before it is recorded, so older code may have trained it).

For each commit found, the files under ``diffzoo/`` and ``recipes/`` that differ between it and the working
tree are listed, less the study harness itself (:data:`HARNESS`: the sweep, the plan and the CLIs, which do
not enter a training; the arguments they give a training are in the records and a sweep refuses to mix runs
made with other ones). A cell whose runs all come from commits with no such difference was trained by the
code that is there now.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from .runs import CODE_PATHS, FINAL_SEED, git

HARNESS = ("diffzoo/study/", "recipes/study.py", "recipes/sweep.py")
# Training files that only some recipes load: file -> the recipe modules that do (a family's own recipe, data
# and task modules), or none (the statistics the report computes from finished runs). A change to one leaves the
# training of every other recipe as it was, so their runs stay "trained by the code there now" and their paused
# runs resume. tests/test_study_provenance.py runs every
# family's study command and checks both sides: the recipes named load the file, no other recipe does.
_SPEECH, _CLIP, _LM = ("recipes.speech_commands",), ("recipes.clip",), ("recipes.lm",)  # lm: the LM and needles
_MQAR, _CLUTTERED = ("recipes.mqar",), ("recipes.cluttered_digits",)
ONLY_FOR: dict[str, tuple[str, ...]] = {
    "recipes/vit_imagenet.py": ("recipes.vit_imagenet",),
    "recipes/speech_commands.py": _SPEECH, "diffzoo/data/speech.py": _SPEECH, "diffzoo/data/synth.py": _SPEECH,
    "recipes/clip.py": _CLIP, "diffzoo/data/image_text/__init__.py": _CLIP,
    "diffzoo/data/image_text/colored_digits.py": _CLIP, "diffzoo/data/image_text/inputs.py": _CLIP,
    "diffzoo/data/image_text/shards.py": _CLIP, "diffzoo/data/image_text/zeroshot_folders.py": _CLIP,
    "recipes/lm.py": _LM, "diffzoo/data/text.py": _LM, "diffzoo/data/needles.py": _LM,
    "recipes/mqar.py": _MQAR, "diffzoo/data/mqar.py": _MQAR, "diffzoo/tasks/mqar.py": _MQAR,
    "recipes/cluttered_digits.py": _CLUTTERED, "diffzoo/data/cluttered.py": _CLUTTERED,
    "diffzoo/tasks/cluttered.py": _CLUTTERED, "diffzoo/models/variants.py": _CLUTTERED,
    "diffzoo/stats.py": (),
}
# how a group of runs is dated (cell_code's "how") -> what `code` says of it
HOW_SAID = {"stamped": "trained", "recorded": "recorded",
            "lost stamp": "trained at a commit this repository lacks (rewritten after they ran), recorded"}


def recorded_at(path: Path, root: Path) -> dict[str, str]:
    """Run name -> the first commit whose version of the records file ``path`` (followed through renames)
    holds that run; runs in no commit (recorded since the last one) are absent."""
    try:
        inside = Path(path).resolve().relative_to(root.resolve())
    except ValueError:  # records outside the checkout: no history to date them by
        return {}
    # newest first: git's --follow does not combine with --reverse
    log = git(root, "log", "--follow", "--format=commit %H", "--name-only", "--", str(inside))
    versions: list[tuple[str, str]] = []
    commit = None
    for line in log.splitlines():
        if line.startswith("commit "):
            commit = line.split()[1]
        elif line.strip() and commit is not None:
            versions.append((commit, line.strip()))
    first: dict[str, str] = {}
    for commit, name in reversed(versions):
        try:
            runs = json.loads(git(root, "show", f"{commit}:{name}")).get("runs") or {}
        except (RuntimeError, json.JSONDecodeError):
            continue  # a version that was deleted or is not a records file
        for run in runs:
            first.setdefault(run, commit)
    return first


@cache
def has_commit(commit: str, root: Path) -> bool:
    """Whether the repository at ``root`` holds ``commit``: a run stamped at a commit that was amended or rebased
    away afterwards names one it does not."""
    try:
        git(root, "cat-file", "-e", f"{commit}^{{commit}}")
    except RuntimeError:
        return False
    return True


@cache  # many cells share the commits their runs were recorded at
def changed_since(commit: str, root: Path) -> tuple[str, ...]:
    """Files under ``diffzoo/`` and ``recipes/`` that differ between ``commit`` and the working tree, less the
    study harness (:data:`HARNESS`)."""
    names = git(root, "diff", "--name-only", commit, "--", *CODE_PATHS).split()
    return tuple(n for n in names if not n.startswith(HARNESS))


def changed_between(first: str, second: str, root: Path) -> tuple[str, ...]:
    """Files under ``diffzoo/`` and ``recipes/`` that differ between two commits, less the study harness."""
    names = git(root, "diff", "--name-only", first, second, "--", *CODE_PATHS).split()
    return tuple(n for n in names if not n.startswith(HARNESS))


def affects(path: str, recipe: str | None) -> bool:
    """Whether a change to the training file ``path`` can change a training by ``recipe`` (None: any recipe):
    False only for a file of :data:`ONLY_FOR` that this recipe does not import."""
    return recipe is None or path not in ONLY_FOR or recipe in ONLY_FOR[path]


def same_training_code(then: dict, now: dict, root: Path, recipe: str | None = None) -> bool:
    """Whether two code stamps (:func:`diffzoo.study.runs.code_stamp`) name the same training code: both at a
    commit, the same torch and Lightning on the same instruction set and thread count (so that a run resumed
    rounds as it would have gone on), no uncommitted change to a training file at either time, and no training
    file changed between the two commits (the study harness aside: records commits in between are fine). With
    ``recipe``, files that recipe does not import (:data:`ONLY_FOR`) are left out too. False whenever git cannot
    tell."""
    if not then.get("commit") or not now.get("commit"):
        return False
    if any(then.get(k) != now.get(k) for k in ("torch", "lightning", "cpu", "threads")):
        return False
    uncommitted = [*then.get("changed", []), *now.get("changed", [])]
    if any(not c.startswith(HARNESS) and affects(c, recipe) for c in uncommitted):
        return False
    try:
        between = () if then["commit"] == now["commit"] else changed_between(then["commit"], now["commit"], root)
    except RuntimeError:
        return False
    return not any(affects(c, recipe) for c in between)


def cell_code(records: Path, cell: str, root: Path) -> list[dict]:
    """The runs of one cell's records grouped by the code that trained them: per commit, ``{"commit", "how"
    ("stamped" or "recorded"), "runs", "changed_then" (stamped runs: training files that differed from the commit
    when they ran), "changed_since"}``; runs with neither a stamp nor a commit have ``commit`` None. A run whose
    stamp names a commit the repository does not hold (history rewritten after it ran) is dated by its records'
    commit instead, as an unstamped run is, with ``how`` "lost stamp". Files the cell's recipe does not import
    (:data:`ONLY_FOR`) are listed apart, as ``not_imported``."""
    path = Path(records) / f"{cell}.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    runs, recipe = saved.get("runs") or {}, saved.get("recipe")
    dated = recorded_at(path, root) if runs else {}
    groups: Counter = Counter()
    then: dict[tuple, set] = {}
    for name, run in runs.items():
        stamp = run.get("code") or {}
        if stamp.get("commit") and has_commit(stamp["commit"], root):
            key = (stamp["commit"], "stamped")
        else:  # no stamp, or a commit rewritten (amended, rebased) after the run: dated as unstamped runs are
            key = (dated.get(name), "lost stamp" if stamp.get("commit") else "recorded")
        groups[key] += 1
        then.setdefault(key, set()).update(c for c in stamp.get("changed", []) if not c.startswith(HARNESS))
    out = []
    for (commit, how), n in sorted(groups.items(), key=lambda kv: -kv[1]):
        since = changed_since(commit, root) if commit else ()
        out.append({"commit": commit, "how": how, "runs": n,
                    "changed_then": sorted(c for c in then[(commit, how)] if affects(c, recipe)),
                    "changed_since": [c for c in since if affects(c, recipe)] if commit else None,
                    "not_imported": sorted({c for c in [*then[(commit, how)], *since] if not affects(c, recipe)})})
    return out


def repository_root(where: Path | None = None) -> Path:
    """The top of the git checkout holding ``where`` (default: the working directory)."""
    return Path(git(Path(where or Path.cwd()), "rev-parse", "--show-toplevel").strip())


def code_lines(records: Path, cells: Sequence[str], root: Path) -> list[str]:
    """``python -m recipes.study code``: per cell with runs, whether the code there now can have trained them,
    and the training files that changed since, runs with the same changes counted together."""
    lines = []
    for cell in cells:
        groups = cell_code(records, cell, root)
        if not groups:
            continue
        same = all(g["commit"] and not g["changed_since"] and not g["changed_then"] for g in groups)
        stamped = all(g["how"] == "stamped" for g in groups)
        verdict = ("trained by the code there now" if same and stamped else
                   "recorded with the code there now (dated by their records' commits: older code may have trained "
                   "some)" if same else "not all from the code there now")
        lines.append(f"{cell}: {sum(g['runs'] for g in groups)} runs, {verdict}")
        merged: dict[tuple, list[dict]] = {}
        for g in groups:
            key = (g["how"], g["commit"] is None, tuple(g["changed_then"]), tuple(g["changed_since"] or ()),
                   tuple(g["not_imported"]))
            merged.setdefault(key, []).append(g)
        for (how, undated, then, since, aside), gs in merged.items():
            n = sum(g["runs"] for g in gs)
            if undated:
                lines.append(f"  {n} runs in no commit yet and without a code stamp" if how == "recorded" else
                             f"  {n} runs in no commit yet, stamped with a commit this repository lacks")
                continue
            commits = [g["commit"][:10] for g in gs]
            text = (f"  {n} runs {HOW_SAID[how]} at {len(commits)} commit(s) "
                    f"({', '.join(commits[:3])}{', ...' if len(commits) > 3 else ''})")
            if then:
                text += f"; uncommitted then: {', '.join(then)}"
            text += f"; changed since: {', '.join(since)}" if since else "; unchanged since"
            if aside:
                text += f" (changed, not imported by this recipe: {', '.join(aside)})"
            lines.append(text)
    return lines


def verify_choice(record: dict, variants: Sequence[str]) -> list[dict]:
    """The runs of a cell that ``verify`` trains again: per variant, its first final run (the lowest final seed
    at its best lr), or for a budget check (no final runs) its seed-0 run."""
    best = {v: b["lr"] for v, b in (record.get("best") or {}).items()}
    chosen = []
    for v in variants:
        runs = [r for r in (record.get("runs") or {}).values() if r["variant"] == v and not r.get("knob")]
        final = [r for r in runs if r["seed"] >= FINAL_SEED and best.get(v) == r["lr"]]
        pool = final or [r for r in runs if r["seed"] == 0]
        if pool:
            chosen.append(min(pool, key=lambda r: (r["seed"], r["lr"])))
    return chosen
