"""The docs live in the repository and follow the tree.

No tracked file refers to a document outside the repository, and every path that the docs under
``docs/`` name in backticks (under ``src/``, ``tests/``, ``examples/`` or ``benchmarks/``) exists, so
the docs cannot drift from the tree silently.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Spelled in pieces so that this file does not match itself.
OUTSIDE_REFERENCES = ("../" + "shared", "DESIGN" + ".md", "STYLE" + ".md")
TREE_ROOTS = ("src/", "tests/", "examples/", "benchmarks/")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`([^`]+)`")
_PLACEHOLDER = re.compile(r"<[^<>/]+>")


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: there is no list of tracked files to read")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def named_paths(markdown: str) -> list[str]:
    """Paths under the tree's roots named in inline code spans (fenced blocks are left out)."""
    spans = (" ".join(span.split()) for span in _CODE_SPAN.findall(_FENCE.sub("", markdown)))
    return [span for span in spans if span.startswith(TREE_ROOTS)]


def exists(path: str) -> bool:
    """Whether ``path`` is in the tree; a ``<placeholder>`` part or a ``*`` matches any name there."""
    pattern = _PLACEHOLDER.sub("*", path)
    if "*" not in pattern:
        return (ROOT / path).exists()
    return any(ROOT.glob(pattern.rstrip("/")))


def test_no_tracked_file_refers_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary, or deleted in the work tree and not yet committed
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            found += [f"{where}: {word}" for word in OUTSIDE_REFERENCES if word in line]
    assert not found, "references to documents outside the repository:\n" + "\n".join(found)


def test_docs_name_only_paths_that_exist() -> None:
    documents = sorted(DOCS.glob("*.md"))
    assert DOCS / "architecture.md" in documents
    missing = [
        f"{document.relative_to(ROOT)}: {path}"
        for document in documents
        for path in named_paths(document.read_text(encoding="utf-8"))
        if not exists(path)
    ]
    assert not missing, "paths the docs name that are not in the tree:\n" + "\n".join(missing)


def test_the_path_check_reads_spans_and_placeholders() -> None:
    markdown = (
        "See `src/fulgor/store/base.py` and `tests/unit/<component>/`, not `fulgor.store`;\n"
        "`tests/unit/store/test_conformance_*.py` too.\n"
        "```\nsrc/fulgor/nowhere.py `src/fulgor/nowhere.py`\n```\n"
    )
    assert named_paths(markdown) == [
        "src/fulgor/store/base.py",
        "tests/unit/<component>/",
        "tests/unit/store/test_conformance_*.py",
    ]
    assert exists("tests/unit/<component>/")
    assert exists("tests/unit/store/test_conformance_*.py")
    assert not exists("src/fulgor/<component>/nowhere.py")
