"""Questions about the company database, each with its gold SQL, in train/val/test splits.

A template is a question kind with three or four paraphrases and one gold query; its constants (a
department, a city, a title, a year, a salary, an employee, a project, how many) fill both. Every
gold query is written in one canonical style, so a small model can learn it: lower-case keywords;
one table without aliases; joins with the aliases ``e``, ``d``, ``p``, ``a``, starting from the
table holding the foreign key (``from employees e join departments d on e.department_id = d.id``);
a grouping key first; ``order by ... desc limit n`` for the top-n questions.

A (template, constants) pair is kept only when its gold query, run on the database of ``db_seed``,
gives a useful answer: some rows, not a count of zero or a NULL aggregate, and exactly n rows for a
top-n question. Each task is one pair with one of its paraphrases:
``{"id", "question", "gold_sql", "template", "kind", "constants"}``. No pair is in two tasks, so no
pair is in two splits. The same seed always gives the same splits.

    python -m examples.sql.dataset --out runs/sql/data   # writes train/val/test.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sqlite3
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from examples.sql.database import CITIES, DEPARTMENTS, TITLES, make_rows, populate

__all__ = ["KINDS", "TEMPLATES", "Task", "distinct_pairs", "make_splits"]

Task = dict[str, Any]

KINDS = ("count", "list", "aggregate", "join", "group", "top")


@dataclass(frozen=True)
class _Template:
    name: str
    kind: str
    questions: tuple[str, ...]
    sql: str
    constants: tuple[str, ...]


_TEMPLATE_LIST = (
    _Template(
        "count_department",
        "count",
        (
            "How many employees work in the {department} department?",
            "What is the number of employees in {department}?",
            "Count the employees of the {department} department.",
            "How many people does the {department} department employ?",
        ),
        "select count(*) from employees e join departments d on e.department_id = d.id"
        " where d.name = '{department}'",
        ("department",),
    ),
    _Template(
        "count_department_hired_after",
        "count",
        (
            "How many employees of the {department} department were hired after {hired_after}?",
            "How many people joined {department} after {hired_after}?",
            "Count the {department} employees hired later than {hired_after}.",
        ),
        "select count(*) from employees e join departments d on e.department_id = d.id"
        " where d.name = '{department}' and e.hired_year > {hired_after}",
        ("department", "hired_after"),
    ),
    _Template(
        "count_title_in_city",
        "count",
        (
            "How many {titles} work in {city}?",
            "How many employees with the title {title} are based in {city}?",
            "Count the {titles} in the {city} offices.",
        ),
        "select count(*) from employees e join departments d on e.department_id = d.id"
        " where d.city = '{city}' and e.title = '{title}'",
        ("title", "city"),
    ),
    _Template(
        "list_title_in_department",
        "list",
        (
            "Who are the {titles} in the {department} department?",
            "List the employees of {department} with the title {title}.",
            "Name every {title} working in {department}.",
        ),
        "select e.name from employees e join departments d on e.department_id = d.id"
        " where d.name = '{department}' and e.title = '{title}'",
        ("department", "title"),
    ),
    _Template(
        "list_department_salary_above",
        "list",
        (
            "Which employees in {department} earn more than {salary_text}?",
            "List the {department} employees with a salary above {salary_text}.",
            "Who in the {department} department is paid over {salary_text} a year?",
        ),
        "select e.name from employees e join departments d on e.department_id = d.id"
        " where d.name = '{department}' and e.salary > {salary}",
        ("department", "salary"),
    ),
    _Template(
        "list_department_projects_after",
        "list",
        (
            "Which projects of the {department} department started after {started_after}?",
            "List the {department} projects begun later than {started_after}.",
            "What {department} projects started later than {started_after}?",
        ),
        "select p.name from projects p join departments d on p.department_id = d.id"
        " where d.name = '{department}' and p.started_year > {started_after}",
        ("department", "started_after"),
    ),
    _Template(
        "avg_salary_title_department",
        "aggregate",
        (
            "What is the average salary of the {titles} in {department}?",
            "On average, how much does someone titled {title} in the {department} department earn?",
            "Give the mean salary of employees titled {title} in {department}.",
        ),
        "select avg(e.salary) from employees e join departments d on e.department_id = d.id"
        " where d.name = '{department}' and e.title = '{title}'",
        ("department", "title"),
    ),
    _Template(
        "total_budget_department",
        "aggregate",
        (
            "What is the total budget of the projects run by {department}?",
            "How much budget do the {department} department's projects have altogether?",
            "Sum the budgets of all {department} projects.",
        ),
        "select sum(p.budget) from projects p join departments d on p.department_id = d.id"
        " where d.name = '{department}'",
        ("department",),
    ),
    _Template(
        "hours_of_employee",
        "aggregate",
        (
            "How many hours has {employee} logged on projects in total?",
            "What is the total number of project hours for {employee}?",
            "Add up the hours {employee} spends on projects.",
        ),
        "select sum(a.hours) from assignments a join employees e on a.employee_id = e.id"
        " where e.name = '{employee}'",
        ("employee",),
    ),
    _Template(
        "projects_of_employee",
        "join",
        (
            "Which projects does {employee} work on?",
            "List the projects {employee} is assigned to.",
            "What projects is {employee} part of?",
        ),
        "select p.name from assignments a join employees e on a.employee_id = e.id"
        " join projects p on a.project_id = p.id"
        " where e.name = '{employee}'",
        ("employee",),
    ),
    _Template(
        "employees_on_project",
        "join",
        (
            "Which employees are assigned to the {project} project?",
            "Who works on project {project}?",
            "List everyone on the {project} project.",
        ),
        "select e.name from assignments a join employees e on a.employee_id = e.id"
        " join projects p on a.project_id = p.id"
        " where p.name = '{project}'",
        ("project",),
    ),
    _Template(
        "department_of_employee",
        "join",
        (
            "Which department does {employee} work in?",
            "What department is {employee} part of?",
            "Name the department of {employee}.",
        ),
        "select d.name from employees e join departments d on e.department_id = d.id"
        " where e.name = '{employee}'",
        ("employee",),
    ),
    _Template(
        "titles_in_department",
        "group",
        (
            "How many employees hold each title in the {department} department?",
            "For each title, count the employees of {department}.",
            "Give the headcount per title in {department}.",
        ),
        "select e.title, count(*) from employees e join departments d on e.department_id = d.id"
        " where d.name = '{department}' group by e.title",
        ("department",),
    ),
    _Template(
        "avg_salary_by_department_hired_after",
        "group",
        (
            "What is the average salary in each department of the employees hired after {hired_after}?",
            "For each department, give the mean salary of staff who joined after {hired_after}.",
            "Per department, how much do employees hired later than {hired_after} earn on average?",
        ),
        "select d.name, avg(e.salary) from employees e join departments d on e.department_id = d.id"
        " where e.hired_year > {hired_after} group by d.name",
        ("hired_after",),
    ),
    _Template(
        "top_earners_department",
        "top",
        (
            "Who are the {n} best-paid employees in {department}, highest salary first?",
            "List the {n} employees of {department} with the highest salaries, highest first.",
            "Name the top {n} earners of {department} in order of salary.",
        ),
        "select e.name from employees e join departments d on e.department_id = d.id"
        " where d.name = '{department}' order by e.salary desc limit {n}",
        ("department", "n"),
    ),
    _Template(
        "largest_projects_started_after",
        "top",
        (
            "Which {n} projects started after {started_after} have the largest budgets, largest first?",
            "Name the {n} biggest-budget projects begun after {started_after}, in order of budget.",
            "List the top {n} projects by budget among those started after {started_after}.",
        ),
        "select name from projects where started_year > {started_after} order by budget desc limit {n}",
        ("started_after", "n"),
    ),
)
_BY_NAME = {template.name: template for template in _TEMPLATE_LIST}
TEMPLATES = tuple(_BY_NAME)

_SALARIES = (50_000, 60_000, 70_000, 80_000, 90_000, 100_000, 120_000)


def _pools(db_seed: int) -> dict[str, tuple[Any, ...]]:
    """Each constant's candidate values; employee and project names come from the database's rows."""
    rows = make_rows(db_seed)
    return {
        "department": DEPARTMENTS,
        "city": CITIES,
        "title": TITLES,
        "hired_after": tuple(range(2010, 2023)),
        "started_after": tuple(range(2014, 2023)),
        "salary": _SALARIES,
        "n": (3, 5),
        "employee": tuple(sorted(row[1] for row in rows["employees"])),
        "project": tuple(sorted(row[1] for row in rows["projects"])),
    }


def _gold_sql(template: _Template, constants: dict[str, Any]) -> str:
    quoted = {k: v.replace("'", "''") if isinstance(v, str) else v for k, v in constants.items()}
    return template.sql.format(**quoted)


def _question(template: _Template, constants: dict[str, Any], paraphrase: int) -> str:
    fields = dict(constants)
    if "title" in constants:
        fields["titles"] = constants["title"].lower() + "s"
    if "salary" in constants:
        fields["salary_text"] = f"${constants['salary']:,}"
    return template.questions[paraphrase].format(**fields)


def _useful(template: _Template, constants: dict[str, Any], rows: list[tuple[Any, ...]]) -> bool:
    """Some rows, no zero count or NULL aggregate, and exactly n rows for a top-n question."""
    if not rows or rows in ([(0,)], [(None,)]):
        return False
    return template.kind != "top" or len(rows) == constants["n"]


@functools.lru_cache(maxsize=8)
def _pairs(db_seed: int) -> dict[str, tuple[tuple[tuple[str, Any], ...], ...]]:
    """Each template's useful constants on ``db_seed``'s database, as sorted item tuples."""
    pools = _pools(db_seed)
    connection = sqlite3.connect(":memory:")
    try:
        populate(connection, db_seed)
        useful: dict[str, tuple[tuple[tuple[str, Any], ...], ...]] = {}
        for template in _TEMPLATE_LIST:
            kept = []
            for values in product(*(pools[name] for name in template.constants)):
                constants = dict(zip(template.constants, values, strict=True))
                rows = connection.execute(_gold_sql(template, constants)).fetchall()
                if _useful(template, constants, rows):
                    kept.append(tuple(sorted(constants.items())))
            useful[template.name] = tuple(kept)
        return useful
    finally:
        connection.close()


def distinct_pairs(db_seed: int = 0) -> int:
    """How many (template, constants) pairs exist on ``db_seed``'s database: the most tasks the
    three splits can hold together."""
    return sum(len(pairs) for pairs in _pairs(db_seed).values())


def _task(task_id: str, template: _Template, constants: dict[str, Any], paraphrase: int) -> Task:
    return {
        "id": task_id,
        "question": _question(template, constants, paraphrase),
        "gold_sql": _gold_sql(template, constants),
        "template": template.name,
        "kind": template.kind,
        "constants": constants,
    }


def make_splits(
    seed: int = 0, sizes: tuple[int, int, int] = (400, 64, 128), *, db_seed: int = 0
) -> dict[str, list[Task]]:
    """Disjoint train/val/test splits of distinct (template, constants) pairs, each with a random
    paraphrase. The pairs are taken from the templates in turn, so small templates are used whole
    and the large ones share the rest evenly; each split has about the same mix.

    >>> splits = make_splits(sizes=(10, 2, 2))
    >>> [len(splits[name]) for name in ("train", "val", "test")], splits == make_splits(sizes=(10, 2, 2))
    ([10, 2, 2], True)
    """
    if len(sizes) != 3 or any(size < 0 for size in sizes):
        raise ValueError(f"sizes must be three counts >= 0 (train, val, test), got {sizes!r}")
    pairs = _pairs(db_seed)
    available = sum(len(kept) for kept in pairs.values())
    if sum(sizes) > available:
        raise ValueError(
            f"sizes {tuple(sizes)} ask for {sum(sizes)} distinct (template, constants) pairs, but the"
            f" {len(TEMPLATES)} templates have only {available} on the database of seed {db_seed}"
        )
    rng = random.Random(f"sql-splits:{seed}")
    queues = [rng.sample(pairs[name], len(pairs[name])) for name in TEMPLATES]
    order = [
        (name, queue[turn])
        for turn in range(max(map(len, queues)))
        for name, queue in zip(TEMPLATES, queues, strict=True)
        if turn < len(queue)
    ]
    chosen = order[: sum(sizes)]
    rng.shuffle(chosen)
    bounds = {
        "train": (0, sizes[0]),
        "val": (sizes[0], sizes[0] + sizes[1]),
        "test": (sizes[0] + sizes[1], sum(sizes)),
    }
    splits: dict[str, list[Task]] = {}
    for split, (start, stop) in bounds.items():
        tasks = []
        for index, (name, items) in enumerate(chosen[start:stop]):
            template = _BY_NAME[name]
            paraphrase = rng.randrange(len(template.questions))
            tasks.append(_task(f"sql-{seed}-{split}-{index}", template, dict(items), paraphrase))
        splits[split] = tasks
    return splits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db-seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, tasks in make_splits(args.seed, db_seed=args.db_seed).items():
        (args.out / f"{name}.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
