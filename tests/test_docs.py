"""The Python examples in docs/ run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("name", ["layers.md", "analysis.md"])
def test_doc_examples_run(name):
    blocks = python_blocks(DOCS / name)
    assert len(blocks) >= 3, f"{name} lost its examples"
    for i, code in enumerate(blocks):
        namespace: dict = {"__name__": f"docs_{name}_{i}"}
        exec(compile(code, f"{name}[block {i}]", "exec"), namespace)
