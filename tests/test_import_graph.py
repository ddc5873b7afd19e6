"""The diffzoo package's imports flow one way: kernels <- layers <- models <- weights / evaluation <- tasks,
data and analysis beside them; only training code (tasks, and data's DataModules) imports Lightning.

The graph is read from the source (ast), so imports inside functions and modules named to
``importlib.import_module`` count as much as the ones at the top of a file.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "diffzoo"

# Subpackage -> the subpackages it may import. kernels and layers import nothing above them; data sets
# know no model (a recipe passes the model's input settings to a DataModule); analysis measures layers
# and reads needle spans from data; weights read, write and convert the models' weights; evaluation
# scores a model it is given (needle contexts from data, attention maps from analysis) and loads none;
# tasks (training) use everything below them; the study harness runs recipes in processes of their own and
# reads only the variant names (layers) and the divergence record's name (tasks).
ALLOWED: dict[str, set[str]] = {
    "kernels": set(),
    "layers": {"kernels"},
    "hosts": {"kernels", "layers"},
    "models": {"kernels", "layers", "hosts"},
    "analysis": {"kernels", "layers", "hosts", "data"},
    "data": set(),
    "weights": {"kernels", "layers", "hosts", "models"},
    "evaluation": {"kernels", "layers", "data", "analysis"},
    "tasks": {"kernels", "layers", "hosts", "models", "data", "analysis", "weights", "evaluation"},
    "study": {"layers", "tasks"},
}

# Subpackages whose modules may import the training framework (Lightning and its metrics): training code.
TRAINING = {"tasks", "data"}
TRAINING_LIBRARIES = ("lightning", "pytorch_lightning", "torchmetrics")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """``(absolute module name, line)`` of every diffzoo import in one source file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from . import x`` / ``from .. import x`` may name submodules: count them one by one.
            targets = [f"{target}.{a.name}" for a in node.names] if not node.module else [target]
            found += [(t, node.lineno) for t in targets]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno))
    return [(t, line) for t, line in found if t == "diffzoo" or t.startswith("diffzoo.")]


def import_graph() -> dict[str, set[tuple[str, int]]]:
    """Module -> the diffzoo modules it imports (with the line), for every source file of the package."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for name, path in modules.items():
        for target, line in imported_modules(path):
            # ``from ..data import needles`` names a module; ``from ..layers import Block`` a package.
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target != name:
                graph[name].add((target, line))
    return graph


def subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_subpackage_has_a_rule() -> None:
    found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert found == set(ALLOWED), f"add the new subpackage(s) {found - set(ALLOWED)} to ALLOWED with their imports"


def test_no_import_cycle_between_modules() -> None:
    graph = {m: {t for t, _ in targets} for m, targets in import_graph().items()}
    graph.pop("diffzoo", None)  # the package root imports its subpackages to register the models
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_subpackages_import_only_downwards() -> None:
    wrong = []
    for module, targets in sorted(import_graph().items()):
        source = subpackage(module)
        if source is None:
            continue
        for target, line in sorted(targets):
            dest = subpackage(target)
            if target == "diffzoo":
                wrong.append(f"{module}:{line} imports the package root (import the subpackage it needs)")
            elif dest is not None and dest != source and dest not in ALLOWED[source]:
                wrong.append(f"{module}:{line} imports {target} ({source} may import {sorted(ALLOWED[source])})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def training_imports(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` of every import of a training library (:data:`TRAINING_LIBRARIES`) in one file,
    including imports inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(n, node.lineno) for n in names if n.split(".")[0] in TRAINING_LIBRARIES]
    return found


def test_only_training_code_imports_lightning() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if subpackage(module) in TRAINING:
            continue
        wrong += [f"{module}:{line} imports {name}" for name, line in training_imports(path)]
    assert not wrong, "Lightning outside training code (diffzoo.tasks / diffzoo.data):\n" + "\n".join(wrong)


def test_training_imports_are_found(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("import lightning.pytorch as pl\ndef f():\n    from torchmetrics import MeanMetric\nimport torchvision\n")
    assert training_imports(path) == [("lightning.pytorch", 1), ("torchmetrics", 3)]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ..evaluation.retrieval import f\n", {("diffzoo.evaluation.retrieval", 1)}),
        ("from .. import models\n", {("diffzoo.models", 1)}),
        ("def f():\n    from ..layers import Block\n", {("diffzoo.layers", 2)}),
        ('import importlib\nimportlib.import_module("diffzoo.models.clip")\n', {("diffzoo.models.clip", 2)}),
        ("import torch\nimport diffzoo_other\n", set()),
    ],
)
def test_the_scanner_sees_every_kind_of_import(tmp_path: Path, monkeypatch, source: str, expected: set) -> None:
    """What the checks above rely on: relative, lazy and importlib imports are all found."""
    fake = tmp_path / "diffzoo"
    (fake / "analysis").mkdir(parents=True)
    (fake / "analysis" / "mod.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert set(imported_modules(fake / "analysis" / "mod.py")) == expected


def test_find_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("host", ["open_clip", "timm"])
def test_layers_and_kernels_import_without_a_host_library(host: str) -> None:
    """Without open_clip or timm, ``import diffzoo`` warns (naming what to install) and the attention works."""
    import subprocess
    import sys

    code = (
        f"import sys, warnings; sys.modules[{host!r}] = None\n"  # makes `import {host}` fail as if not installed
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import diffzoo\n"
        "import torch\n"
        "from diffzoo.layers import DiffAttention\n"
        "y = DiffAttention(dim=32, num_heads=2)(torch.randn(1, 5, 32))\n"
        "assert y.shape == (1, 5, 32)\n"
        "assert 'diffzoo.models' not in sys.modules\n"
        "print([str(w.message) for w in caught if 'diffzoo.models' in str(w.message)])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{host} is not installed" in proc.stdout and "pip install" in proc.stdout, proc.stdout
