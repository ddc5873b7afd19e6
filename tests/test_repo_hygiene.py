"""Every document the repository cites is in the repository: no outside design notes, no broken links."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"

# Citations of documents that do not ship with the repository (patterns built in pieces, so this file
# does not match itself).
OUTSIDE = [
    re.compile(r"\b" + "SP" + r"EC\b"),  # an outside design note, "...section N" or "....md"
    re.compile(r"(?i)\bthe " + "sp" + r"ec\b"),
    re.compile(r"\.\./" + "shared" + r"\b"),  # a folder beside the checkout
]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # markdown link target
# ``docs/design.md, "Section"`` and ``docs/design.md ("Section", "Other")`` in code and docs
DESIGN_CITATION = re.compile(r"design\.md[,:]?\s*\(?((?:\"[^\"\n]+\"(?:,\s*|\s+and\s+)?)+)")


def repo_files() -> list[Path]:
    """The files git tracks, plus the new ones it does not ignore."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True,
            text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def text_files() -> dict[Path, str]:
    texts = {}
    for path in repo_files():
        data = path.read_bytes()
        if b"\0" not in data:
            texts[path] = data.decode("utf-8", errors="replace")
    return texts


def slug(heading: str) -> str:
    """The anchor a markdown renderer gives a heading (GitHub's rule: lower case, punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", markdown, re.M)]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = []
    for path, text in text_files().items():
        for n, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in OUTSIDE):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not found, "cite docs/design.md (section name) or the paper instead:\n" + "\n".join(found)


def test_markdown_links_stay_inside_the_repository_and_resolve() -> None:
    broken = []
    for path, text in text_files().items():
        if path.suffix != ".md":
            continue
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO)}: ({target})"
            if REPO not in dest.parents and dest != REPO:
                broken.append(f"{where} points outside the repository")
            elif not dest.exists():
                broken.append(f"{where} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest.read_text())}:
                broken.append(f"{where} names no heading of {dest.name}")
    assert not broken, "\n".join(broken)


def test_design_citations_name_existing_sections() -> None:
    sections = set(headings(DESIGN.read_text()))
    cited, wrong = 0, []
    for path, text in text_files().items():
        if path in (DESIGN, Path(__file__).resolve()):  # this file holds examples, not citations
            continue
        for match in DESIGN_CITATION.finditer(text):
            for name in re.findall(r"\"([^\"\n]+)\"", match.group(1)):
                cited += 1
                if name not in sections:
                    wrong.append(f"{path.relative_to(REPO)}: \"{name}\"")
    assert cited > 0, "no citation of docs/design.md found: the pattern no longer matches how the code cites it"
    assert not wrong, f"cited sections missing from docs/design.md (it has {sorted(sections)}):\n" + "\n".join(wrong)


def test_the_patterns_catch_what_they_are_for() -> None:
    """The checks above rely on these patterns; a pattern that matches nothing would pass silently."""
    assert any(p.search("the math (" + "SP" + "EC section 1)") for p in OUTSIDE)
    assert any(p.search("see " + "SP" + "EC.md section 5") for p in OUTSIDE)
    assert any(p.search("as the " + "sp" + "ec says") for p in OUTSIDE)
    assert any(p.search("../" + "shared/notes.md") for p in OUTSIDE)
    assert not any(p.search(s) for p in OUTSIDE for s in ("SpecAugment", "spectrogram", "a specific case", "spec = x"))
    names = [re.findall(r"\"([^\"\n]+)\"", m.group(1)) for m in DESIGN_CITATION.finditer(
        'docs/design.md, "Kernel cost model"; docs/design.md ("Attention noise", "Low-bit attention")'
    )]
    assert names == [["Kernel cost model"], ["Attention noise", "Low-bit attention"]]
    assert slug("Differential attention V1") == "differential-attention-v1"
    assert slug("Per-head norm and output scale") == "per-head-norm-and-output-scale"
