"""The RAG agent, written with the OpenAI Agents SDK: an ``Agent`` that searches the passages
through an MCP tool server and answers ``Answer: NAME``.

Nothing in it knows about training: its model is the SDK's own ``OpenAIResponsesModel`` on an
``AsyncOpenAI`` client whose base URL is the rollout's gateway (fulgor's runner names each call
with the SDK agent's name), its tool is the MCP server of :mod:`examples.rag.search_server`, and
the reward is the task's own check (:mod:`examples.rag.reward`). The same code runs against any
OpenAI-compatible model that serves the Responses API.

The search server runs over stdio, one per event loop (a runner process) and index, shared by the
rollouts running there: it starts with the first rollout and ends with the process (an MCP stdio
server exits when its stdin closes). A server that dies fails the rollouts using it with the SDK's
error, and the next rollout starts a new one.
"""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from pathlib import Path
from typing import Any

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from agents.mcp import MCPServerStdio
from openai import AsyncOpenAI

from examples.calc.agent import http_client
from examples.rag.reward import score
from fulgor import LLM, emit_reward, rollout

__all__ = ["AGENT_NAME", "INSTRUCTIONS", "MAX_TURNS", "rag_agent", "search_server"]

set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers otherwise

ROOT = Path(__file__).resolve().parents[2]
AGENT_NAME = "researcher"
INSTRUCTIONS = (
    "Answer the question from the passages. Search for a name and one word of the question, "
    "read the result, and search again for the name it gives until you know the answer. "
    "Then reply with Answer: NAME"
)
MAX_TURNS = 5
"""Model calls per question: three searches answer the longest question; two more spare."""
SERVER_MODULE = "examples.rag.search_server"
"""The search server's module; ``RAG_MCP_SERVER`` names another to start instead."""


class _SharedServer:
    """One MCP server, started and kept open by a task of its own so that any rollout's task can
    call it (anyio wants a server's context entered and left by one task)."""

    def __init__(self, index: str) -> None:
        self.server = MCPServerStdio(
            {
                "command": sys.executable,
                "args": ["-m", os.environ.get("RAG_MCP_SERVER", SERVER_MODULE), index],
                "env": {"PYTHONPATH": str(ROOT), "PATH": ""},
            },
            cache_tools_list=True,
            name="rag-search",
            client_session_timeout_seconds=30,
            failure_error_function=None,  # a server that fails fails the rollout, not the answer
        )
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = asyncio.Event()
        self.task = asyncio.create_task(self._own(), name="rag-search-server")

    async def _own(self) -> None:
        try:
            async with self.server:
                self.ready.set_result(None)
                await self.closed.wait()
        except BaseException as error:
            if not self.ready.done():
                self.ready.set_exception(error)
            raise
        finally:
            self.closed.set()

    @property
    def alive(self) -> bool:
        return not self.closed.is_set() and not self.task.done()

    async def check(self) -> bool:
        """Whether the server still answers a ping (after a failed rollout: was it the server?);
        one that does not is closed, and the next rollout starts another."""
        try:
            session = self.server.session
            if session is None:
                raise RuntimeError("no session")
            await asyncio.wait_for(session.send_ping(), timeout=5)
            return True
        except Exception:
            self.closed.set()
            return False


_SERVERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _SharedServer]] = (
    weakref.WeakKeyDictionary()
)


async def search_server(index: str) -> _SharedServer:
    """This event loop's running search server over ``index``, started on first use."""
    servers = _SERVERS.setdefault(asyncio.get_running_loop(), {})
    shared = servers.get(index)
    if shared is None or not shared.alive:
        shared = servers[index] = _SharedServer(index)
    try:
        await asyncio.shield(shared.ready)
    except Exception as error:
        raise RuntimeError(
            f"the search MCP server over {index} did not start ({type(error).__name__}: {error}); "
            "its own last words are on the runner's stderr (under a Trainer, run_dir/logs/runners.log)"
        ) from error
    return shared


@rollout
async def rag_agent(task: dict[str, Any], llm: LLM) -> None:
    """One question: the agent searches and answers; the reward is 0.1 x format + 0.9 x F1."""
    if not isinstance(task.get("index"), str):
        raise ValueError(
            "a RAG task names its search index: {'question': ..., 'answer': ..., 'index': 'path/to/"
            "index.sqlite'} (examples.rag.index.build_index writes one)"
        )
    shared = await search_server(task["index"])
    client = AsyncOpenAI(
        base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=2, http_client=http_client()
    )
    sampling = llm.sampling_parameters
    agent = Agent(
        name=AGENT_NAME,
        instructions=INSTRUCTIONS,
        model=OpenAIResponsesModel(model=llm.model, openai_client=client),
        model_settings=ModelSettings(
            temperature=sampling.get("temperature"),
            top_p=sampling.get("top_p"),
            max_tokens=sampling.get("max_tokens"),
        ),
        mcp_servers=[shared.server],
    )
    final: str | None = None
    try:
        result = await Runner.run(agent, task["question"], max_turns=MAX_TURNS)
        final = str(result.final_output)
    except (MaxTurnsExceeded, ModelBehaviorError):
        pass  # searched past its turns, or its reply broke off or did not parse: no answer
    except Exception as error:
        if not await shared.check():
            raise RuntimeError(
                f"the search MCP server stopped ({type(error).__name__}: {error}); "
                "its own last words are on the runner's stderr (under a Trainer, run_dir/logs/runners.log)"
            ) from error
        raise
    values = score(final, task["answer"])
    emit_reward(dict(values), primary="reward", feedback=f"gold answer: {task['answer']}; replied: {final!r}")
