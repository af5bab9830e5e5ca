"""The SQL warm start: a short SFT on synthetic solutions, so the model knows the agents' formats.

A freshly built model writes noise; GRPO needs it to succeed sometimes before it can learn from its
own rollouts. The warm start shows it worked solutions of training tasks in the three agents' exact
conversations (:func:`examples.sql.agent.write_messages`, ``check_messages``, ``rewrite_messages``,
rendered with the engine's chat template):

* the writer: the question, then a query;
* the checker: the question, a query and its result, then ``CORRECT`` or ``WRONG`` by a plain rule:
  WRONG when the result is an error, no row, a zero count or a NULL aggregate, else CORRECT;
* the rewriter: the question, a query whose result the rule calls WRONG and that result, then a
  new query.

The writer's and rewriter's query is the gold query only a fraction of the time
(``gold_fraction``); otherwise it is the gold query's wrong twin (:func:`twin`), one fixed,
systematic mistake per template: a condition dropped, ``or`` for ``and``, ``<`` for ``>``,
``!=`` for ``=``, ``desc`` dropped, ``sum`` for ``avg``, ``d.city`` for ``d.name``, and so on,
each of which gives other rows than the gold query. The model ends up knowing the format, the
tables and how to copy a question's constants into a query, but mostly making its template's
mistake: greedy decoding writes the twin, while sampling writes the gold query often enough for
GRPO to find out from the rewards that it pays.

    python -m examples.sql.warm_start --model runs/sql/base --out runs/sql/warm \\
        --database runs/sql/company.sqlite
"""

from __future__ import annotations

import argparse
import functools
import logging
import random
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from examples.calc.warm_start import train_and_save
from examples.sql.agent import (
    CHECK_SYSTEM,
    REWRITE_SYSTEM,
    WRITE_SYSTEM,
    check_messages,
    rewrite_messages,
    write_messages,
)
from examples.sql.database import TITLES, build_database
from examples.sql.dataset import Task, make_splits
from examples.sql.execution import QueryResult, format_result, run_query

__all__ = [
    "WarmStartConfig",
    "broken_queries",
    "checker_verdict",
    "conversations",
    "corpus",
    "made_up_variants",
    "twin",
    "warm_start",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStartConfig:
    """How long and how hard the warm start trains, and how often it shows the gold query.

    For the first ``format_steps`` steps the writer's and rewriter's solutions are the gold query
    with probability ``format_gold_fraction``; for the rest, with ``gold_fraction``. Each step
    learns ``batch_size`` conversations: a share ``checker_share`` of them the checker's,
    ``rewriter_share`` the rewriter's, the rest the writer's. The writer and the rewriter also
    learn from ``variants`` copies of each training task with its names and numbers made up
    (:func:`made_up_variants`): a share ``variant_share`` of their conversations are those.
    """

    gold_fraction: float = 0.3
    format_gold_fraction: float = 0.3
    format_steps: int = 2700
    steps: int = 3000
    batch_size: int = 16
    learning_rate: float = 3e-3
    checker_share: float = 0.15
    rewriter_share: float = 0.15
    variants: int = 4
    variant_share: float = 0.5
    seed: int = 0


def _drop_last_condition(sql: str) -> str:
    return sql.rsplit(" and ", 1)[0]


def _or_for_and(sql: str) -> str:
    head, last = sql.rsplit(" and ", 1)
    return f"{head} or {last}"


def _replace(old: str, new: str) -> Callable[[str], str]:
    def apply(sql: str) -> str:
        return sql.replace(old, new, 1)

    return apply


_TWINS: dict[str, Callable[[str], str]] = {
    "count_department": _replace("d.name =", "d.name !="),
    "count_department_hired_after": _drop_last_condition,
    "count_title_in_city": _or_for_and,
    "list_title_in_department": _or_for_and,
    "list_department_salary_above": _replace("e.salary >", "e.salary <"),
    "list_department_projects_after": _replace("p.started_year >", "p.started_year <"),
    "avg_salary_title_department": _or_for_and,
    "total_budget_department": _replace("sum(", "count("),
    "hours_of_employee": _replace("sum(", "count("),
    "projects_of_employee": _replace("select p.name", "select e.name"),
    "employees_on_project": _replace("select e.name", "select p.name"),
    "department_of_employee": _replace("select d.name", "select d.city"),
    "titles_in_department": _replace(" group by e.title", ""),
    "avg_salary_by_department_hired_after": _replace("avg(", "sum("),
    "top_earners_department": _replace(" desc", ""),
    "largest_projects_started_after": _replace(" desc", ""),
}


def twin(task: Task) -> str:
    """The gold query's wrong twin: the one systematic mistake the warm start teaches for its template.

    >>> twin({"template": "top_earners_department",
    ...       "gold_sql": "select e.name from employees e order by e.salary desc limit 3"})
    'select e.name from employees e order by e.salary limit 3'
    """
    wrong = _TWINS[task["template"]](task["gold_sql"])
    if wrong == task["gold_sql"]:
        raise ValueError(f"the twin of {task['gold_sql']!r} is the gold query itself")
    return wrong


def _is_wrong(result: QueryResult) -> bool:
    """The checker's rule: an error, no row, a zero count or a NULL aggregate is WRONG."""
    return result.rows is None or not result.rows or result.rows in (((0,),), ((None,),))


def checker_verdict(result: QueryResult) -> str:
    """What the warm start's checker answers for a query's result.

    >>> checker_verdict(QueryResult(columns=("n",), rows=((0,),), error=None))
    'WRONG'
    >>> checker_verdict(QueryResult(columns=("n",), rows=((7,),), error=None))
    'CORRECT'
    """
    return "WRONG" if _is_wrong(result) else "CORRECT"


_QUOTED = re.compile(r"'([^']*)'")
_NUMBER = re.compile(r"\b(20\d\d)\b")


def broken_queries(task: Task) -> list[str]:
    """Wrong queries of the kinds a sampling writer makes, whose results the checker calls WRONG:
    the gold query cut short (an error), and with a constant miscopied (no row, or a zero count).

    >>> for query in broken_queries({"gold_sql": "select id from employees where name = 'Anna Adler'"}):
    ...     print(query)
    select id from employees where name = 'Anna
    select id from employees where name = 'anna adler'
    """
    gold = task["gold_sql"]
    words = gold.split(" ")
    cut = " ".join(words[: max(2, len(words) - 1)])
    quoted = _QUOTED.search(gold)
    if quoted is not None:
        start, end = quoted.span(1)
        miscopied = gold[:start] + quoted.group(1).lower() + gold[end:]
    else:
        miscopied = _NUMBER.sub(lambda match: str(int(match.group(1)) + 20), gold, count=1)
    return [cut, miscopied]


# Project names no project of the database has.
_PROJECT_NAMES = (
    "Acorn", "Basalt", "Cedar", "Dune", "Echo", "Fjord", "Glacier", "Heron", "Indigo", "Jasper",
    "Kestrel", "Lotus", "Magnet", "Nectar", "Onyx", "Prism", "Quill", "Raven", "Saffron", "Topaz",
)  # fmt: skip
# Departments and cities the database does not have.
_DEPARTMENTS = (
    "Logistics",
    "Design",
    "Procurement",
    "Security",
    "Quality",
    "Facilities",
    "Strategy",
    "Compliance",
)
_CITIES = ("Prague", "Vienna", "Dublin", "Porto", "Riga", "Geneva", "Bergen", "Krakow")
# Numbers the dataset's questions never ask about: years before or after its pools', other salaries
# and other counts.
_YEARS = (*range(1995, 2010), *range(2023, 2040))
_SALARIES = (35_000, 45_000, 55_000, 65_000, 75_000, 85_000, 95_000, 110_000, 130_000, 150_000)
_COUNTS = (2, 4, 6, 7, 8, 10)


@functools.lru_cache(maxsize=4)
def _made_up_names(database: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Employee names that are no employee's (the employees' first and last names, paired anew) and
    project names that are no project's."""
    connection = sqlite3.connect(f"{Path(database).resolve().as_uri()}?mode=ro", uri=True)
    try:
        employees = {name for (name,) in connection.execute("select name from employees")}
        projects = {name for (name,) in connection.execute("select name from projects")}
    finally:
        connection.close()
    firsts = sorted({name.split(" ")[0] for name in employees})
    lasts = sorted({name.split(" ")[-1] for name in employees})
    pairs = (f"{first} {last}" for first in firsts for last in lasts)
    people = tuple(name for name in pairs if name not in employees)
    return people, tuple(name for name in _PROJECT_NAMES if name not in projects)


def _database_names(database: str) -> list[str]:
    """Every department, city, title, employee and project name in ``database``."""
    connection = sqlite3.connect(f"{Path(database).resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = connection.execute(
            "select name from departments union select city from departments"
            " union select title from employees union select name from employees"
            " union select name from projects order by 1"
        ).fetchall()
    finally:
        connection.close()
    return [name for (name,) in rows]


def _word(value: object) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(str(value))}(?!\w)")


def _made_up(task: Task, rng: random.Random) -> Task | None:
    """``task`` with its constants made up, or None when it has none to make up: an employee or
    project that the database does not have, a year, salary or count no question asks about. A
    title is drawn afresh from the real ones, and the department or city beside it made up, so
    that the pair is no real one; elsewhere the department or city stays (each of the few is in
    many training questions already)."""
    people, projects = _made_up_names(str(task["database"]))
    question, sql, constants = task["question"], task["gold_sql"], dict(task["constants"])
    for key, value in task["constants"].items():
        new: Any
        if key in ("department", "city") and "title" not in task["constants"]:
            continue  # every question names one of the few departments or cities: no need
        if key in ("employee", "project", "department", "city"):
            pools = {"employee": people, "project": projects, "department": _DEPARTMENTS, "city": _CITIES}
            new = rng.choice(pools[key])
            question, sql = question.replace(value, new), sql.replace(f"'{value}'", f"'{new}'")
        elif key == "title":
            new = rng.choice([title for title in TITLES if title != value])
            question = question.replace(f"{value.lower()}s", f"{new.lower()}s").replace(value, new)
            sql = sql.replace(f"'{value}'", f"'{new}'")
        elif key == "salary":
            new = rng.choice(_SALARIES)
            question = question.replace(f"${value:,}", f"${new:,}")
            sql = _word(value).sub(str(new), sql)
        else:  # hired_after, started_after, n
            new = rng.choice(_COUNTS if key == "n" else _YEARS)
            question, sql = _word(value).sub(str(new), question), _word(value).sub(str(new), sql)
        constants[key] = new
    if constants == task["constants"]:
        return None
    return {**task, "question": question, "gold_sql": sql, "constants": constants}


def made_up_variants(tasks: Sequence[Task], count: int) -> list[Task]:
    """``count`` copies of each task with its constants made up (:func:`_made_up`); none of a task
    that asks only about departments or cities.

    A model that saw each name or year in a few questions learns the ones it saw, not to copy them
    from the question; in the copies the employees' first and last names are paired anew, projects
    have other names, the numbers are ones no question asks about and the titles are paired with
    made-up departments and cities, so the model learns to copy the question's constants into its
    query. A made-up department, city, employee or project is not in the task's database and a
    made-up number is outside the dataset's pools, so no copy is a (template, constants) pair of
    any split. The same tasks always give the same copies.
    """
    variants = []
    for task in tasks:
        rng = random.Random(f"sql-warm-start-variants:{task['id']}")
        for number in range(count):
            variant = _made_up(task, rng)
            if variant is None:
                break
            variants.append({**variant, "id": f"{task['id']}-made-up-{number}"})
    return variants


Conversation = list[dict[str, str]]


def _answer(messages: list[dict[str, str]], text: str) -> Conversation:
    return [*messages, {"role": "assistant", "content": text}]


@dataclass(frozen=True)
class Conversations:
    """A task's synthetic solutions: each agent's conversations, by what their query is."""

    writer: dict[str, Conversation]
    """``"gold"`` and ``"twin"``: the writer's answer is that query."""
    checker: list[Conversation]
    """The checker on the gold query, the twin and the broken queries, answering by the rule."""
    rewriter: list[dict[str, Conversation]]
    """For each wrong query the checker calls WRONG: ``"gold"`` and ``"twin"``, the rewriter's answer."""


def conversations(task: Task) -> Conversations:
    """Every synthetic solution of ``task``, each query run on the task's ``database`` for its result."""
    database = task["database"]
    gold, wrong = task["gold_sql"], twin(task)
    question = task["question"]
    results = {query: run_query(database, query) for query in (gold, wrong, *broken_queries(task))}
    checker = [
        _answer(check_messages(question, query, format_result(result)), checker_verdict(result))
        for query, result in results.items()
    ]
    rewriter = [
        {
            answer: _answer(rewrite_messages(question, query, format_result(result)), sql)
            for answer, sql in (("gold", gold), ("twin", wrong))
        }
        for query, result in results.items()
        if query != gold and _is_wrong(result)
    ]
    writer = {
        "gold": _answer(write_messages(question), gold),
        "twin": _answer(write_messages(question), wrong),
    }
    return Conversations(writer, checker, rewriter)


def corpus(tasks: Sequence[Task]) -> list[str]:
    """Texts of the task for the tokenizer to learn from (``fulgor model init --corpus``).

    The agents' system prompts (the schema with them), each name of the tasks' database (every
    department, city, title, employee and project) as a question and a query write it, each task's (and
    made-up variant's) question, gold query, twin, the checker's prompt on them and its verdicts:
    with a vocabulary fitted to them, a query takes a few dozen tokens, and a name is one or two
    tokens in a question and in a query alike (a project only a few tasks ask about would be cut
    into pieces in the query, which a model this small cannot copy them into).
    """
    texts = [WRITE_SYSTEM, CHECK_SYSTEM, REWRITE_SYSTEM, "CORRECT", "WRONG"] * 50
    for database in sorted({str(task["database"]) for task in tasks}):
        texts += [f" {name} = '{name}'" for name in _database_names(database)] * 20
    for task in [*tasks, *made_up_variants(tasks, WarmStartConfig.variants)]:
        gold, wrong = task["gold_sql"], twin(task)
        texts += [task["question"], gold, wrong]
        texts += [check_messages(task["question"], query, "")[1]["content"] for query in (gold, wrong)]
    return texts


def warm_start(
    base: str | Path,
    out: str | Path,
    tasks: Sequence[Task],
    config: WarmStartConfig | None = None,
) -> Path:
    """Fine-tune the model in ``base`` on synthetic solutions of ``tasks``; save it to ``out``.

    Each task holds the path of its ``database``, as the agent's tasks do: the queries' results
    go into the checker's and rewriter's prompts. The solutions go the way of SFT's distillation
    (:mod:`fulgor.algorithms.sft.distill`): each is a chat transcript, rendered with the model's own
    chat template and checked to render faithfully, then learned by the same update.
    """
    import torch

    from fulgor.adapters.transcripts import Transcript
    from fulgor.algorithms.sft import SFTConfig, SFTUpdater
    from fulgor.algorithms.sft.distill import teacher_data
    from fulgor.weights.loading import eos_token_ids
    from fulgor.weights.policy import load_policy

    config = config or WarmStartConfig()
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    policy = load_policy(Path(base), "cpu")
    updater = SFTUpdater(policy.model, SFTConfig(learning_rate=config.learning_rate))
    stops = eos_token_ids(policy.model, policy.tokenizer)  # where the engine ends a turn

    # Every conversation of every task and made-up variant, rendered once and checked. The
    # variants' results are their own (often no row), so only the writer and rewriter learn them.
    real = [conversations(task) for task in tasks]
    made_up = [replace(conversations(t), checker=[]) for t in made_up_variants(tasks, config.variants)]
    named: list[tuple[str, Conversation]] = []
    for source, solved in (("task", real), ("variant", made_up)):
        for index, found in enumerate(solved):
            prefix = f"{source}-{index}"
            named += [(f"{prefix}-write-{kind}", messages) for kind, messages in found.writer.items()]
            named += [(f"{prefix}-check-{n}", messages) for n, messages in enumerate(found.checker)]
            for n, answers in enumerate(found.rewriter):
                named += [(f"{prefix}-rewrite-{n}-{kind}", messages) for kind, messages in answers.items()]
    transcripts = [Transcript.of(messages, name=name) for name, messages in named]
    rendered = teacher_data(transcripts, policy.tokenizer, stop_token_ids=stops)
    if rendered.unusable:
        raise ValueError(f"the warm start's solutions do not render faithfully: {rendered.summary()}")
    rows = {trajectory.rollout_id: trajectory for trajectory in rendered.trajectories}
    rewritten = {
        source: [index for index, found in enumerate(solved) if found.rewriter]
        for source, solved in (("task", real), ("variant", made_up))
    }

    def pick(step: int) -> Any:
        """One conversation: an agent by its share, a task or a variant, and for a query the gold
        one or the twin."""
        fraction = config.format_gold_fraction if step <= config.format_steps else config.gold_fraction
        kind = "gold" if rng.random() < fraction else "twin"
        agent = rng.random()
        if agent < config.checker_share:
            index = rng.randrange(len(real))
            return rows[f"task-{index}-check-{rng.randrange(len(real[index].checker))}"]
        source, solved = (
            ("variant", made_up) if made_up and rng.random() < config.variant_share else ("task", real)
        )
        if agent < config.checker_share + config.rewriter_share:
            index = rng.choice(rewritten[source])
            return rows[f"{source}-{index}-rewrite-{rng.randrange(len(solved[index].rewriter))}-{kind}"]
        return rows[f"{source}-{rng.randrange(len(solved))}-write-{kind}"]

    # A short linear warm-up, the full rate for the first phase, then a decay to a quarter.
    return train_and_save(
        policy,
        updater,
        Path(out),
        steps=config.steps,
        first_steps=config.format_steps,
        batch=lambda step: [pick(step) for _ in range(config.batch_size)],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True, help="the model directory to start from")
    parser.add_argument("--out", type=Path, required=True, help="where to save the warm-started model")
    parser.add_argument("--database", type=Path, required=True, help="the company database (built if absent)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=WarmStartConfig.steps)
    parser.add_argument("--format-steps", type=int, default=WarmStartConfig.format_steps)
    parser.add_argument("--gold-fraction", type=float, default=WarmStartConfig.gold_fraction)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = WarmStartConfig(
        gold_fraction=args.gold_fraction, format_steps=args.format_steps, steps=args.steps, seed=args.seed
    )
    database = str(build_database(args.database))
    tasks = [{**task, "database": database} for task in make_splits(args.seed)["train"]]
    warm_start(args.model, args.out, tasks, config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
