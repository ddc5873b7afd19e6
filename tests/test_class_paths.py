"""Every class path written as a string (``class_path:`` in a YAML config, ``--trainer.callbacks+=...`` or
a logger's ``class_path`` in Python, a class named in a docstring) names a class that imports: a module
moved or a class renamed would otherwise break only when that config or command runs."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("diffzoo", "recipes", "benchmarks", "tests")
PACKAGES = ("diffzoo", "recipes", "lightning", "torch", "timm", "open_clip", "transformers")
# a dotted name that starts at one of PACKAGES and ends in a capitalised name (a class)
CLASS_PATH = re.compile(r"(?<![\w.])((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)*\.[A-Z]\w*)")


def _strings(path: Path) -> list[tuple[str, int]]:
    """``(text, line)`` of every string in a file: each constant of a Python source, a YAML file whole."""
    text = path.read_text()
    if path.suffix != ".py":
        return [(text, 1)]
    return [(node.value, node.lineno) for node in ast.walk(ast.parse(text, str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def class_paths(text: str) -> list[str]:
    return CLASS_PATH.findall(text)


def found() -> dict[str, list[str]]:
    """Class path -> the places (``file:line``) that write it."""
    files = [p for d in SOURCES for ext in ("py", "yaml", "yml") for p in (ROOT / d).rglob(f"*.{ext}")]
    where: dict[str, list[str]] = {}
    for path in sorted(files):
        if path.resolve() == Path(__file__).resolve():
            continue  # the examples below
        for text, line in _strings(path):
            for name in class_paths(text):
                where.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line}")
    return where


def resolve(name: str) -> object:
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"no module of {name} imports")


def test_the_configs_and_sources_name_class_paths() -> None:
    names = found()
    assert "diffzoo.tasks.resume.AppendingCSVLogger" in names  # recipes/_cli.py
    assert "diffzoo.data.speech.SynthKeywordsDataModule" in names  # recipes/configs/speech_synth.yaml
    assert "diffzoo.tasks.monitor.GradNormMonitor" in names  # the study's --trainer.callbacks+=


def test_every_string_class_path_imports() -> None:
    broken = []
    for name, places in found().items():
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            broken.append(f"{name} ({', '.join(places)}): {e}")
    assert not broken, "class paths written as strings that do not import:\n" + "\n".join(broken)


@pytest.mark.parametrize(("text", "expected"), [
    ("class_path: diffzoo.data.speech.SynthKeywordsDataModule\n", ["diffzoo.data.speech.SynthKeywordsDataModule"]),
    ("--trainer.callbacks+=diffzoo.tasks.monitor.GradNormMonitor", ["diffzoo.tasks.monitor.GradNormMonitor"]),
    (":class:`~lightning.pytorch.callbacks.ModelCheckpoint`", ["lightning.pytorch.callbacks.ModelCheckpoint"]),
    ("python -m recipes.sweep and torch.nn.functional.relu", []),
    ("mydiffzoo.tasks.Thing and x.diffzoo.tasks.Thing", []),
])
def test_the_scanner_finds_class_paths_and_only_those(text: str, expected: list[str]) -> None:
    assert class_paths(text) == expected


def test_a_moved_class_is_reported() -> None:
    with pytest.raises(AttributeError):
        resolve("diffzoo.tasks.resume.NoSuchLogger")
    with pytest.raises((AttributeError, ImportError)):
        resolve("diffzoo.no_such_module.Thing")
