"""The SQL warm start's synthetic solutions: wrong twins that are really wrong, the checker's rule,
made-up constants that are in no split, and conversations that render faithfully for the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples.sql.agent import parse_query, parse_verdict
from examples.sql.database import TITLES, build_database
from examples.sql.dataset import TEMPLATES, make_splits
from examples.sql.execution import execution_accuracy, run_query
from examples.sql.warm_start import (
    WarmStartConfig,
    broken_queries,
    checker_verdict,
    conversations,
    corpus,
    made_up_variants,
    twin,
)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    database = str(build_database(tmp_path_factory.mktemp("sql") / "company.sqlite"))
    return {
        name: [{**task, "database": database} for task in split] for name, split in make_splits(0).items()
    }


def every(tasks: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [task for split in tasks.values() for task in split]


def test_every_template_has_a_twin_that_differs_from_gold_and_scores_zero(
    tasks: dict[str, list[dict[str, Any]]],
) -> None:
    everything = every(tasks)
    assert {task["template"] for task in everything} == set(TEMPLATES)
    scores = []
    for task in everything:
        wrong = twin(task)
        assert wrong != task["gold_sql"]
        assert run_query(task["database"], wrong).ok, wrong  # a mistake, not a syntax error
        scores.append(execution_accuracy(task["database"], wrong, task["gold_sql"]))
    assert sum(scores) <= 0.01 * len(scores)  # measured: none of the 592 tasks


def test_the_checkers_rule_passes_gold_and_fails_broken_queries(
    tasks: dict[str, list[dict[str, Any]]],
) -> None:
    for task in tasks["train"][:100]:
        assert checker_verdict(run_query(task["database"], task["gold_sql"])) == "CORRECT"
        for query in broken_queries(task):
            assert query != task["gold_sql"]
            assert checker_verdict(run_query(task["database"], query)) == "WRONG", query


def test_made_up_constants_are_in_no_split_and_replace_the_real_ones(
    tasks: dict[str, list[dict[str, Any]]],
) -> None:
    train = tasks["train"]
    variants = made_up_variants(train, 2)
    assert variants == made_up_variants(train, 2)
    only_places = [task for task in train if set(task["constants"]) <= {"department", "city"}]
    assert only_places
    assert len(variants) == 2 * (len(train) - len(only_places))
    pairs = {(task["template"], tuple(sorted(task["constants"].items()))) for task in every(tasks)}
    database = train[0]["database"]
    names = {
        name for (name,) in _rows(database, "select name from employees union select name from projects")
    }
    places = {value for row in _rows(database, "select name, city from departments") for value in row}
    by_id = {task["id"]: task for task in train}
    for variant in variants:
        original = by_id[variant["id"].rsplit("-made-up-", 1)[0]]
        assert (variant["template"], tuple(sorted(variant["constants"].items()))) not in pairs
        assert twin(variant) != variant["gold_sql"]
        assert variant["constants"].keys() == original["constants"].keys()
        for key, value in variant["constants"].items():
            if key in ("department", "city") and "title" not in variant["constants"]:
                assert value == original["constants"][key]
                continue
            assert value != original["constants"][key]
            assert value not in names | places
            if key == "title":
                assert value in TITLES  # a real title, in a question otherwise made up
                continue
            shown = f"${value:,}" if key == "salary" else str(value)
            assert shown in variant["question"], (key, variant["question"])
            assert (f"'{value}'" if isinstance(value, str) else str(value)) in variant["gold_sql"]
        # The rest of the question and the query are the original's, word for word.
        assert variant["question"].count(" ") == original["question"].count(" ")
        assert variant["gold_sql"].split(" ")[:6] == original["gold_sql"].split(" ")[:6]


def _rows(database: str, sql: str) -> list[tuple[Any, ...]]:
    result = run_query(database, sql)
    assert result.rows is not None
    return list(result.rows)


def test_the_solutions_render_faithfully_in_the_agents_conversations(
    tmp_path: Path, tasks: dict[str, list[dict[str, Any]]]
) -> None:
    pytest.importorskip("transformers")
    from fulgor.adapters.transcripts import Transcript
    from fulgor.algorithms.sft.distill import teacher_data
    from fulgor.engine.models import init_model
    from fulgor.weights.loading import eos_token_ids, load_model

    # The demo's tokenizer (fitted to the whole training split), and one task of each template
    # with its made-up variant.
    base = init_model(tmp_path / "base", "tiny", seed=0, corpus=corpus(tasks["train"]))
    loaded = load_model(base, device="cpu")
    train = list({task["template"]: task for task in tasks["train"]}.values())
    solutions = [conversations(task) for task in [*train, *made_up_variants(train, 1)]]
    transcripts, answers = [], []
    for number, found in enumerate(solutions):
        for messages in [
            *found.writer.values(),
            *found.checker,
            *(m for answer in found.rewriter for m in answer.values()),
        ]:
            transcripts.append(Transcript.of(messages, name=f"solution-{number}-{len(transcripts)}"))
            answers.append(messages[-1]["content"])
    stops = eos_token_ids(loaded.model, loaded.tokenizer)
    rendered = teacher_data(transcripts, loaded.tokenizer, stop_token_ids=stops)
    assert not rendered.unusable, rendered.summary()
    assert len(rendered.trajectories) == len(transcripts)
    for trajectory, answer in zip(rendered.trajectories, answers, strict=True):
        [row] = trajectory.rows
        trained = [t for t, mask in zip(row.token_ids, row.loss_mask, strict=True) if mask and t not in stops]
        text = loaded.tokenizer.decode(trained, skip_special_tokens=True)
        assert text == answer  # what the model learns is exactly the answer, as the agent parses it
        if answer in ("CORRECT", "WRONG"):
            assert parse_verdict(text) == answer
        else:
            assert parse_query(text) == answer


def test_each_agent_is_shown_its_own_conversation(tasks: dict[str, list[dict[str, Any]]]) -> None:
    from examples.sql.agent import CHECK_SYSTEM, REWRITE_SYSTEM, WRITE_SYSTEM

    for task in tasks["train"][:50]:
        found = conversations(task)
        assert found.writer["gold"][-1]["content"] == task["gold_sql"]
        assert found.writer["twin"][-1]["content"] == twin(task)
        assert all(m[0]["content"] == WRITE_SYSTEM for m in found.writer.values())
        assert found.checker[0][-1]["content"] == "CORRECT"  # the gold query's result
        assert all(m[0]["content"] == CHECK_SYSTEM for m in found.checker)
        # The rewriter is asked only after a WRONG verdict: each of its prompts holds a query whose
        # result the checker's rule calls WRONG, and it answers with the gold query or the twin.
        assert found.rewriter
        for answers in found.rewriter:
            assert [answers[k][-1]["content"] for k in ("gold", "twin")] == [task["gold_sql"], twin(task)]
            prompt = answers["gold"][1]["content"]
            assert answers["gold"][0]["content"] == REWRITE_SYSTEM
            result = prompt.rsplit("\nResult: ", 1)[1]
            assert result.startswith("error") or result in ("0 rows", "1 row: (0,)", "1 row: (None,)")


def test_the_demo_learns_what_it_documents(tmp_path: Path, tasks: dict[str, list[dict[str, Any]]]) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from examples.sql.train import demo_grpo
    from fulgor.engine.models import init_model

    grpo = demo_grpo()
    # Steps of 64 rollouts (8 questions x 8), stopping once 570 s are used; the writer's and the
    # rewriter's calls are trained, not the checker's.
    assert (grpo.batch_tasks, grpo.group_size, grpo.max_seconds) == (8, 8, 570.0)
    assert grpo.agent_match == "write|rewrite"
    assert demo_grpo(agent_match=None).agent_match is None
    # The warm start shows the gold query 30% of the time, the twin otherwise.
    assert WarmStartConfig().gold_fraction == WarmStartConfig().format_gold_fraction == 0.3
    # With the demo's tokenizer every gold query and twin fits in max_tokens, its end of turn too.
    base = init_model(tmp_path / "base", "tiny", seed=0, corpus=corpus(tasks["train"]))
    tokenizer = AutoTokenizer.from_pretrained(base)
    lengths = [
        len(tokenizer(query, add_special_tokens=False)["input_ids"])
        for task in every(tasks)
        for query in (task["gold_sql"], twin(task))
    ]
    assert max(lengths) < grpo.max_tokens


def test_the_documented_examples_run() -> None:
    import doctest

    import examples.sql.warm_start

    result = doctest.testmod(examples.sql.warm_start)
    assert result.attempted
    assert not result.failed
