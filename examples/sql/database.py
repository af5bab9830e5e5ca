"""The example's company database: departments, their employees and projects, and who works on what.

The rows come from fixed word lists and a seeded ``random.Random``, so a seed always gives the same
database. Salaries are distinct, and so are budgets, so "the three best-paid" or "the largest
projects" never tie. Every department has at least six employees and one project, and every city
hosts a department. A one-row-per-key ``meta`` table records the seed and the schema version;
:func:`build_database` reuses a file that already holds them.

    python -m examples.sql.database runs/sql/company.db    # writes the seed-0 database
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "CITIES",
    "DEPARTMENTS",
    "HIRED_YEARS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "STARTED_YEARS",
    "TITLES",
    "Rows",
    "build_database",
    "make_rows",
    "populate",
]

Rows = dict[str, list[tuple[Any, ...]]]

SCHEMA_VERSION = 1

SCHEMA = (
    "departments(id, name, city)\n"
    "employees(id, name, department_id, title, salary, hired_year)\n"
    "projects(id, name, department_id, budget, started_year)\n"
    "assignments(employee_id, project_id, hours)"
)

DEPARTMENTS = ("Sales", "Marketing", "Engineering", "Finance", "Support", "Research", "Legal", "Operations")
CITIES = ("Berlin", "Lisbon", "Madrid", "Oslo", "Warsaw")
TITLES = (
    "Associate",
    "Coordinator",
    "Analyst",
    "Specialist",
    "Consultant",
    "Engineer",
    "Manager",
    "Director",
)
HIRED_YEARS = tuple(range(2008, 2025))
STARTED_YEARS = tuple(range(2015, 2025))

_DEPARTMENT_WEIGHTS = (3, 2, 4, 2, 3, 2, 1, 2)
_TITLE_WEIGHTS = (4, 3, 4, 3, 2, 4, 2, 1)
_TITLE_BASE_SALARY = (42_000, 48_000, 58_000, 60_000, 68_000, 76_000, 92_000, 125_000)
_FIRST_NAMES = (
    "Anna", "Ben", "Carla", "David", "Elena", "Felix", "Grace", "Hugo", "Ines", "Jonas",
    "Karin", "Leo", "Maria", "Nils", "Olga", "Pablo", "Rita", "Samir", "Tara", "Victor",
    "Wanda", "Yusuf", "Zoe", "Marek", "Lena", "Omar", "Sofia", "Tomas", "Irene", "Kofi",
)  # fmt: skip
_LAST_NAMES = (
    "Adler", "Berg", "Costa", "Diaz", "Eriksen", "Fischer", "Garcia", "Hansen", "Ivanova", "Jensen",
    "Kowalski", "Lopez", "Moreau", "Novak", "Olsen", "Petrov", "Quinn", "Romero", "Silva", "Torres",
    "Umar", "Vogel", "Weber", "Young", "Zielinski", "Santos", "Larsen", "Meyer", "Nowak", "Keller",
)  # fmt: skip
_PROJECT_NAMES = (
    "Apollo", "Beacon", "Cobalt", "Delta", "Ember", "Falcon", "Granite", "Harbor", "Iris", "Juniper",
    "Keystone", "Lumen", "Meridian", "Nimbus", "Orion", "Pioneer", "Quartz", "Redwood", "Summit", "Tundra",
    "Unity", "Vertex", "Willow", "Zephyr", "Atlas", "Bridge", "Compass", "Horizon", "Lighthouse", "Mosaic",
    "Nova", "Polaris", "Sierra", "Titan", "Voyager", "Aurora",
)  # fmt: skip
_EMPLOYEES, _PROJECTS, _ASSIGNMENTS, _MIN_STAFF = 120, 30, 300, 6

_DDL = (
    "create table departments (id integer primary key, name text not null unique, city text not null)",
    "create table employees (id integer primary key, name text not null unique,"
    " department_id integer not null references departments(id), title text not null,"
    " salary integer not null, hired_year integer not null)",
    "create table projects (id integer primary key, name text not null unique,"
    " department_id integer not null references departments(id), budget integer not null,"
    " started_year integer not null)",
    "create table assignments (employee_id integer not null references employees(id),"
    " project_id integer not null references projects(id), hours integer not null,"
    " primary key (employee_id, project_id))",
    "create table meta (key text primary key, value text not null)",
)


def make_rows(seed: int = 0) -> Rows:
    """Every table's rows for ``seed``, in id order (``meta`` excluded).

    >>> make_rows(0) == make_rows(0), make_rows(0) == make_rows(1)
    (True, False)
    >>> [len(rows) for rows in make_rows(0).values()]
    [8, 120, 30, 300]
    """
    rng = random.Random(f"sql-database:{seed}")
    departments = _departments(rng)
    employees = _employees(rng)
    projects = _projects(rng)
    return {
        "departments": departments,
        "employees": employees,
        "projects": projects,
        "assignments": _assignments(rng, employees, projects),
    }


def _departments(rng: random.Random) -> list[tuple[Any, ...]]:
    """Each city hosts at least one department; the rest go to random cities."""
    cities = rng.sample(CITIES, len(CITIES))
    cities += [rng.choice(CITIES) for _ in range(len(DEPARTMENTS) - len(CITIES))]
    rng.shuffle(cities)
    return [
        (index + 1, name, city) for index, (name, city) in enumerate(zip(DEPARTMENTS, cities, strict=True))
    ]


def _employees(rng: random.Random) -> list[tuple[Any, ...]]:
    everyone = [f"{first} {last}" for first in _FIRST_NAMES for last in _LAST_NAMES]
    names = rng.sample(everyone, _EMPLOYEES)
    department_ids = [1 + index % len(DEPARTMENTS) for index in range(_MIN_STAFF * len(DEPARTMENTS))]
    department_ids += rng.choices(
        range(1, len(DEPARTMENTS) + 1), weights=_DEPARTMENT_WEIGHTS, k=_EMPLOYEES - len(department_ids)
    )
    rng.shuffle(department_ids)
    salaries: set[int] = set()
    rows: list[tuple[Any, ...]] = []
    for index, (name, department_id) in enumerate(zip(names, department_ids, strict=True)):
        title = rng.choices(range(len(TITLES)), weights=_TITLE_WEIGHTS)[0]
        salary = _TITLE_BASE_SALARY[title] + 500 * rng.randrange(60)
        while salary in salaries:
            salary += 500
        salaries.add(salary)
        rows.append((index + 1, name, department_id, TITLES[title], salary, rng.choice(HIRED_YEARS)))
    return rows


def _projects(rng: random.Random) -> list[tuple[Any, ...]]:
    """Every department runs at least one project; budgets are distinct multiples of 5,000."""
    names = rng.sample(_PROJECT_NAMES, _PROJECTS)
    department_ids = list(range(1, len(DEPARTMENTS) + 1))
    department_ids += rng.choices(department_ids, weights=_DEPARTMENT_WEIGHTS, k=_PROJECTS - len(DEPARTMENTS))
    rng.shuffle(department_ids)
    budgets = rng.sample(range(50_000, 2_000_001, 5_000), _PROJECTS)
    years = [rng.choice(STARTED_YEARS) for _ in range(_PROJECTS)]
    return [
        (index + 1, name, department_id, budget, year)
        for index, (name, department_id, budget, year) in enumerate(
            zip(names, department_ids, budgets, years, strict=True)
        )
    ]


def _assignments(
    rng: random.Random, employees: list[tuple[Any, ...]], projects: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """Distinct (employee, project) pairs, mostly within the employee's own department."""
    by_department: dict[int, list[int]] = {}
    for project_id, _, department_id, *_ in projects:
        by_department.setdefault(department_id, []).append(project_id)
    all_projects = [project[0] for project in projects]
    pairs: set[tuple[int, int]] = set()
    while len(pairs) < _ASSIGNMENTS:
        employee_id, _, department_id, *_ = rng.choice(employees)
        own = by_department[department_id]
        pairs.add((employee_id, rng.choice(own if rng.random() < 0.7 else all_projects)))
    return [(employee, project, 5 * rng.randint(2, 80)) for employee, project in sorted(pairs)]


def populate(connection: sqlite3.Connection, seed: int = 0) -> None:
    """Create the tables in an empty database and fill them with ``seed``'s rows and the meta row."""
    for statement in _DDL:
        connection.execute(statement)
    for table, rows in make_rows(seed).items():
        marks = ", ".join("?" * len(rows[0]))
        connection.executemany(f"insert into {table} values ({marks})", rows)
    connection.executemany(
        "insert into meta values (?, ?)", [("seed", str(seed)), ("schema_version", str(SCHEMA_VERSION))]
    )
    connection.commit()


def _holds(path: Path, seed: int) -> bool:
    """Whether ``path`` is this schema version's database for ``seed``."""
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            meta = dict(connection.execute("select key, value from meta").fetchall())
        finally:
            connection.close()
    except sqlite3.Error:
        return False
    return meta == {"seed": str(seed), "schema_version": str(SCHEMA_VERSION)}


def build_database(path: Path, seed: int = 0) -> Path:
    """Write ``seed``'s database to ``path`` (atomically: a temporary file beside it, then
    ``os.replace``) and return ``path``; a file that already holds it is kept as it is."""
    path = Path(path)
    if path.exists() and _holds(path, seed):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    try:
        connection = sqlite3.connect(temporary)
        try:
            populate(connection, seed)
        finally:
            connection.close()
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_database(args.path, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
