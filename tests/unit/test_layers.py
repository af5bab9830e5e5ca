"""Imports point one way: no module of src/fulgor imports from a room on its own layer or above.

The layers, lowest first, are the ones docs/architecture.md draws. Every import counts: at the top
of a module, inside a function (a lazy import of an optional dependency) and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "fulgor"

# Lowest first. A room may import from rooms on lower layers only; "fulgor" is the package's own
# __init__ (the public names), which only the command line above it imports.
LAYERS: list[set[str]] = [
    {"version", "errors", "semconv", "credentials", "limits"},
    {"types"},
    {"net"},
    {"weights"},
    {"store", "engine", "adapters", "testing"},
    {"gateway", "agent", "algorithms"},
    {"runner", "server"},
    {"training"},
    {"dashboard"},
    {"fulgor"},
    {"cli"},
]
LAYER_OF = {room: index for index, rooms in enumerate(LAYERS) for room in rooms}


def room_of(module: str) -> str:
    """The room a dotted module name lives in: ``fulgor.store.sqlite`` -> ``store``."""
    parts = module.split(".")
    return "fulgor" if len(parts) == 1 else parts[1]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every fulgor module ``path`` imports, wherever the import stands."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fulgor":  # `from fulgor import store` names a room; other names the root
                found += [(node.lineno, _from_root(alias.name)) for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, module) for line, module in found if module.split(".")[0] == "fulgor"]


def _from_root(name: str) -> str:
    is_room = (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()
    return f"fulgor.{name}" if is_room else "fulgor"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert rooms == set(LAYER_OF), "place each new room on a layer in LAYERS (and docs/architecture.md)"


def test_no_import_points_up_or_sideways() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = room_of(module_name(path))
        for line, module in imported_modules(path):
            there = room_of(module)
            if there != here and LAYER_OF[there] >= LAYER_OF[here]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({here}) imports {module} ({there})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fulgor.gateway import Gateway\n"
        "def f():\n    from fulgor import __version__, store\n"
    )
    assert [(line, room_of(name)) for line, name in imported_modules(module)] == [
        (3, "gateway"),
        (5, "fulgor"),
        (5, "store"),
    ]
