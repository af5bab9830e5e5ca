"""The text-to-SQL agent: a LangGraph graph of three agents, a writer, a checker and a rewriter.

    START -> write_query -> execute_query -> check_query -> END
                                  ^               |
                                  +- rewrite_query <- (WRONG, fewer than MAX_ROUNDS queries run)

The writer turns the question into a query, ``execute_query`` runs it on the database (read-only,
within a time limit), the checker reads the query and its result and answers CORRECT or WRONG,
and on WRONG the rewriter writes a new query from the old one and its result. The graph is plain
LangGraph with ``langchain-openai``'s ``ChatOpenAI``: nothing in it knows about training but its
base URL, which fulgor's ``llm`` resource points at the rollout's gateway URL.

Each model call is attributed to the node that made it without any code here: the runner turns on
OpenTelemetry's LangChain instrumentation, whose spans name the node and whose ``traceparent``
header ties the gateway's record of the call to them. An agent that prefers to say so itself
sets an ``X-Fulgor-Agent`` header once on each node's client (``headers=True`` here).

The reward is execution accuracy (:func:`examples.sql.execution.execution_accuracy`): the final
query's rows against the gold query's. A graph that runs past its round limit (LangGraph's
recursion limit) ends the rollout with reward 0 and says why in the reward's feedback.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypedDict

from langchain_core.messages import BaseMessage
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph

from examples.calc.agent import http_client
from examples.sql.database import SCHEMA
from examples.sql.execution import QueryResult, execution_accuracy, format_result, run_query
from fulgor import LLM, emit_reward, rollout

__all__ = [
    "AGENTS",
    "MAX_ROUNDS",
    "SqlState",
    "build_graph",
    "check_messages",
    "parse_query",
    "parse_verdict",
    "rewrite_messages",
    "run_graph",
    "sql_agent",
    "sql_agent_headers",
    "write_messages",
]

MAX_ROUNDS = 3
"""At most this many queries run: the first one and up to two rewrites."""
AGENTS = ("write_query", "check_query", "rewrite_query")
"""The nodes that call the model, which are the agents' names."""
QUERY_TIMEOUT_SECONDS = 2.0

WRITE_SYSTEM = f"Write one SQLite query that answers the question. Tables:\n{SCHEMA}"
CHECK_SYSTEM = "Is the query right for the question, given its result? Reply CORRECT or WRONG."
REWRITE_SYSTEM = f"The query is wrong. Write a corrected SQLite query. Tables:\n{SCHEMA}"

Message = dict[str, str]


class SqlState(TypedDict, total=False):
    """What flows through the graph."""

    question: str
    query: str
    result: str
    verdict: str
    rounds: int


def write_messages(question: str) -> list[Message]:
    """What the writer is asked."""
    return [{"role": "system", "content": WRITE_SYSTEM}, {"role": "user", "content": question}]


def _attempt(question: str, query: str, result: str) -> str:
    return f"Question: {question}\nQuery: {query}\nResult: {result}"


def check_messages(question: str, query: str, result: str) -> list[Message]:
    """What the checker is asked: the question, the query and its result."""
    return [
        {"role": "system", "content": CHECK_SYSTEM},
        {"role": "user", "content": _attempt(question, query, result)},
    ]


def rewrite_messages(question: str, query: str, result: str) -> list[Message]:
    """What the rewriter is asked: the same, and for a new query."""
    return [
        {"role": "system", "content": REWRITE_SYSTEM},
        {"role": "user", "content": _attempt(question, query, result)},
    ]


def parse_query(text: str) -> str:
    """The query in a model's answer: a fenced block's body, else the text, without an ``SQL:`` label.

    >>> parse_query("```sql\\nselect 1;\\n```"), parse_query("SQL: select name from employees")
    ('select 1;', 'select name from employees')
    """
    fenced = re.search(r"```(?:sql)?\s*(.*?)```", text, re.DOTALL | re.IGNORECASE)
    query = fenced.group(1) if fenced else text
    return re.sub(r"^\s*sql\s*:\s*", "", query, flags=re.IGNORECASE).strip()


def parse_verdict(text: str) -> Literal["CORRECT", "WRONG"]:
    """The checker's verdict: WRONG when its answer says so, else CORRECT (a checker that cannot say
    what is wrong lets the query stand).

    >>> parse_verdict("WRONG: the filter is missing"), parse_verdict("looks fine")
    ('WRONG', 'CORRECT')
    """
    return "WRONG" if "WRONG" in text.upper() else "CORRECT"


def _text(message: BaseMessage) -> str:
    return message.content if isinstance(message.content, str) else str(message.content)


Route = Callable[[SqlState], str]


def _route(state: SqlState) -> str:
    """After the check: done when the checker says CORRECT or MAX_ROUNDS queries have run."""
    return END if state["verdict"] == "CORRECT" or state["rounds"] >= MAX_ROUNDS else "rewrite_query"


def build_graph(llms: dict[str, ChatOpenAI], database: Path, *, route: Route = _route) -> Any:
    """The compiled graph; ``llms`` holds each agent's model client by node name (:data:`AGENTS`)."""

    async def write_query(state: SqlState) -> SqlState:
        answer = await llms["write_query"].ainvoke(write_messages(state["question"]))
        return {"query": parse_query(_text(answer)), "rounds": 0}

    def execute_query(state: SqlState) -> SqlState:
        result = run_query(database, state["query"], timeout_seconds=QUERY_TIMEOUT_SECONDS)
        return {"result": format_result(result), "rounds": state["rounds"] + 1}

    async def check_query(state: SqlState) -> SqlState:
        messages = check_messages(state["question"], state["query"], state["result"])
        answer = await llms["check_query"].ainvoke(messages)
        return {"verdict": parse_verdict(_text(answer))}

    async def rewrite_query(state: SqlState) -> SqlState:
        messages = rewrite_messages(state["question"], state["query"], state["result"])
        answer = await llms["rewrite_query"].ainvoke(messages)
        return {"query": parse_query(_text(answer))}

    graph = StateGraph(SqlState)
    graph.add_node("write_query", write_query)
    graph.add_node("execute_query", execute_query)
    graph.add_node("check_query", check_query)
    graph.add_node("rewrite_query", rewrite_query)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "execute_query")
    graph.add_edge("execute_query", "check_query")
    graph.add_conditional_edges("check_query", route, ["rewrite_query", END])
    graph.add_edge("rewrite_query", "execute_query")
    return graph.compile()


RECURSION_LIMIT = 3 * MAX_ROUNDS + 1
"""LangGraph's limit for MAX_ROUNDS rounds: they take 3 steps each (write or rewrite, execute,
check), and LangGraph stops a graph once its steps reach the limit."""


async def run_graph(graph: Any, task: dict[str, Any]) -> tuple[float, str, SqlState | None]:
    """Run ``graph`` on the task's question: its reward, the reason for it, and the final state
    (None when the graph ran past its round limit)."""
    try:
        state: SqlState = await graph.ainvoke(
            {"question": task["question"]}, config={"recursion_limit": RECURSION_LIMIT}
        )
    except GraphRecursionError:
        return 0.0, f"the graph ran past its limit of {MAX_ROUNDS} rounds ({RECURSION_LIMIT} steps)", None
    database = Path(task["database"])
    reward = execution_accuracy(
        database, state["query"], task["gold_sql"], timeout_seconds=QUERY_TIMEOUT_SECONDS
    )
    return reward, _reason(reward, run_query(database, state["query"])), state


def _reason(reward: float, result: QueryResult) -> str:
    if reward == 1.0:
        return "the query's rows equal the gold query's"
    if not result.ok:
        return f"the query scores 0: {result.error}"
    return "the query runs, but its rows differ from the gold query's"


def _llms(llm: LLM, headers: bool) -> dict[str, ChatOpenAI]:
    sampling = dict(llm.sampling_parameters)
    return {
        name: ChatOpenAI(
            base_url=llm.endpoint,
            api_key=llm.api_key or "fulgor",  # type: ignore[arg-type]
            model=llm.model,
            temperature=sampling.get("temperature"),
            top_p=sampling.get("top_p"),
            max_tokens=sampling.get("max_tokens"),  # type: ignore[call-arg]
            max_retries=2,
            http_async_client=http_client(),
            default_headers={"X-Fulgor-Agent": name} if headers else None,
        )
        for name in AGENTS
    }


async def _answer(task: dict[str, Any], llm: LLM, headers: bool) -> None:
    reward, reason, _ = await run_graph(build_graph(_llms(llm, headers), Path(task["database"])), task)
    emit_reward(reward, feedback=reason)  # the reward, with the reason the task gives for it


@rollout
async def sql_agent(task: dict[str, Any], llm: LLM) -> None:
    """One question through the graph; calls attributed by the agent's OpenTelemetry spans."""
    return await _answer(task, llm, headers=False)


@rollout
async def sql_agent_headers(task: dict[str, Any], llm: LLM) -> None:
    """The same graph, each node's client naming its agent with an ``X-Fulgor-Agent`` header."""
    return await _answer(task, llm, headers=True)
