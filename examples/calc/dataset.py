"""Generated arithmetic word problems with train/val/test splits that never share a problem.

Each task is ``{"question": str, "answer": int, "a": int, "b": int, "op": str}``. Two-digit
multiplication dominates (a small model cannot do it in its head, so the calculator matters), with
some addition and subtraction. The same seed always gives the same splits.

    python -m examples.calc.dataset --out runs/calc/data   # writes train/val/test.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

__all__ = ["Task", "make_splits", "make_task"]

Task = dict[str, Any]

_TEMPLATES = {
    "*": ["What is {a} times {b}?", "A box holds {a} rows of {b} eggs. How many eggs?", "Compute {a}*{b}."],
    "+": ["What is {a} plus {b}?", "Ann has {a} stamps and gets {b} more. How many now?"],
    "-": ["What is {a} minus {b}?", "A tank holds {a} litres and {b} leak out. How many are left?"],
}
_OPERATIONS = {"*": lambda a, b: a * b, "+": lambda a, b: a + b, "-": lambda a, b: a - b}


def make_task(a: int, b: int, op: str, template: int = 0) -> Task:
    """One problem.

    >>> make_task(12, 7, "*")["answer"]
    84
    """
    question = _TEMPLATES[op][template % len(_TEMPLATES[op])].format(a=a, b=b)
    return {"question": question, "answer": _OPERATIONS[op](a, b), "a": a, "b": b, "op": op}


def make_splits(seed: int = 0, sizes: tuple[int, int, int] = (512, 64, 128)) -> dict[str, list[Task]]:
    """Disjoint train/val/test splits: no two tasks share an operation and its operands, in either
    order for ``*`` and ``+`` (12*34 and 34*12 are one problem)."""
    rng = random.Random(seed)
    seen: set[tuple[int, int, str]] = set()
    tasks: list[Task] = []
    while len(tasks) < sum(sizes):
        op = rng.choices(["*", "+", "-"], weights=[6, 1, 1])[0]
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if op == "-" and b > a:
            a, b = b, a
        key = (min(a, b), max(a, b), op) if op in "*+" else (a, b, op)
        if key in seen:
            continue
        seen.add(key)
        tasks.append(make_task(a, b, op, rng.randrange(3)))
    train, val = sizes[0], sizes[0] + sizes[1]
    return {"train": tasks[:train], "val": tasks[train:val], "test": tasks[val:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, tasks in make_splits(args.seed).items():
        (args.out / f"{name}.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
