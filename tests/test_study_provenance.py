"""What provenance.ONLY_FOR claims: each listed file is loaded by the recipes named and by no other.

The study's `code` report and its resume of paused runs ignore a change to such a file for every other recipe,
so the claim is checked the way it matters: each family's study command runs (its quick limits) in a process of
its own, and the repository files that process loaded are listed at its exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffzoo.layers.spec import MAIN_VARIANTS
from diffzoo.study.families import FAMILIES
from diffzoo.study.provenance import ONLY_FOR, affects
from diffzoo.study.sweep import fixed_args

ROOT = Path(__file__).resolve().parents[1]

# runs a module as `python -m` does and writes, at exit, every file of this repository it loaded
_LOADED = """
import atexit, json, runpy, sys
out, root, module = sys.argv[1], sys.argv[2], sys.argv[3]

def dump():
    files = {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
    with open(out, "w") as f:
        json.dump(sorted(p[len(root) + 1:] for p in files if p.startswith(root + "/")), f)

atexit.register(dump)
sys.argv = [module, *sys.argv[4:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def loaded_files(family: str, tmp_path: Path) -> list[str]:
    """Repository files (relative paths) loaded by one quick run of ``family``'s study command."""
    fam = FAMILIES[family]
    variant = next(v for v in MAIN_VARIANTS if v != "softmax")  # a differential variant: the most code
    args = [*fixed_args(fam), *fam.variants[variant], "--model.lr", "1e-3", *fam.seed_args(0), *fam.monitor_args,
            *fam.quick, "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    if family == "speech":  # a small synthesised set (the study's would take minutes to make), in tmp_path
        args += ["--data.init_args.clips_per_word", "[2, 1, 1]", "--data.init_args.silence_clips", "[2, 1, 1]",
                 "--data.init_args.batch_size", "16", "--data.init_args.cache_dir", str(tmp_path / "synth")]
    out = tmp_path / "loaded.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _LOADED, str(out), str(ROOT), fam.recipe, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


RECIPES = sorted({f.recipe for f in FAMILIES.values()})


def test_every_listed_file_is_a_training_file_of_a_known_recipe():
    for path, recipes in ONLY_FOR.items():
        assert (ROOT / path).is_file() and path.startswith(("diffzoo/", "recipes/")), path
        assert not path.startswith(("diffzoo/study/", "recipes/study.py", "recipes/sweep.py")), path  # harness
        assert set(recipes) <= set(RECIPES), (path, recipes)  # () for a file no training loads
    # the report's statistics: no training loads them (checked below), so no recipe's runs count them as changed
    assert ONLY_FOR["diffzoo/stats.py"] == () and not any(affects("diffzoo/stats.py", r) for r in RECIPES)
    assert affects("diffzoo/stats.py", None)  # a recipe not named: any file may change it


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_recipe_loads_the_files_listed_for_it_and_none_listed_only_for_others(family, tmp_path):
    loaded = loaded_files(family, tmp_path)
    recipe = FAMILIES[family].recipe
    assert f"{recipe.replace('.', '/')}.py" in loaded and any(p.startswith("diffzoo/layers/") for p in loaded)
    assert "diffzoo/study/families.py" not in loaded  # a training loads no harness code
    assert [p for p, recipes in ONLY_FOR.items() if recipe in recipes and p not in loaded] == []
    assert [p for p, recipes in ONLY_FOR.items() if recipe not in recipes and p in loaded] == []
