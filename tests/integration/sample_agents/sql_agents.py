"""Variants of the text-to-SQL example's graph with other routing, imported by module:object.

The example's graph stops once its checker says CORRECT; a model that is not trained rarely says
WRONG, so these route after the check on their own: one rewrites until the round limit, one never
stops (a graph that loops past its limit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.graph import END

from examples.sql.agent import MAX_ROUNDS, SqlState, _llms, build_graph, run_graph
from fulgor import LLM, emit_reward, rollout


def _until_the_limit(state: SqlState) -> str:
    return END if state["rounds"] >= MAX_ROUNDS else "rewrite_query"


def _forever(state: SqlState) -> str:
    return "rewrite_query"


async def _run(task: dict[str, Any], llm: LLM, route: Any) -> None:
    graph = build_graph(_llms(llm, headers=False), Path(task["database"]), route=route)
    reward, reason, _ = await run_graph(graph, task)
    emit_reward(reward, feedback=reason)


@rollout
async def always_rewrite(task: dict[str, Any], llm: LLM) -> None:
    """The example's graph, rewriting after every check until MAX_ROUNDS queries have run."""
    await _run(task, llm, _until_the_limit)


@rollout
async def never_stops(task: dict[str, Any], llm: LLM) -> None:
    """The example's graph with routing that never ends: LangGraph's recursion limit stops it."""
    await _run(task, llm, _forever)


@rollout
async def graded_rewrites(task: dict[str, Any], llm: LLM) -> None:
    """As :func:`always_rewrite`, rewarded by the final query's length: a reward that varies within
    a group whatever the model, so that updates have a signal."""
    graph = build_graph(_llms(llm, headers=False), Path(task["database"]), route=_until_the_limit)
    _, _, state = await run_graph(graph, task)
    emit_reward(0.0 if state is None else len(state["query"]) / 100)
