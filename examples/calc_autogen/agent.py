"""The calc agent written with AutoGen AgentChat: an ``AssistantAgent`` whose calculator is the MCP
server next to this file.

    fulgor train --agent examples.calc_autogen.agent:autogen_calc \\
        --runner-python .frameworks/autogen/bin/python --train tasks.jsonl --model DIR

AutoGen 0.7.5 pins protobuf 5.29, older than fulgor's TensorBoard extra needs, so it lives in a
virtual environment of its own (``make .frameworks/autogen/.installed``, which holds fulgor's core
too), and the trainer starts its runner processes on that environment's Python
(``Trainer(runner_python=...)``). AutoGen is imported there once per runner process, never here at
import time: the trainer imports this module too, to name the agent to its runners.

One calculator server (``McpWorkbench(StdioServerParams(...))``) per event loop serves the rollouts
running there: the first rollout of a runner process starts it, and it ends with the process (an
MCP stdio server exits when its stdin closes). A server that dies fails the rollouts that called it
with a clear error, and the next rollout starts another. ``CALC_MCP_SERVER`` names another server
module to start instead of ``examples.calc_autogen.calculator_server``.

Nothing here knows about training but the ``llm`` resource (the rollout's gateway URL and model);
the reward is the calc task's own check of the agent's final reply. Its calls are named
``calculator_agent`` by fulgor, from the ``invoke_agent`` span AutoGen opens around the agent's run
(:mod:`fulgor.agent.genai`; the environment has ``opentelemetry-sdk``, so the span is recorded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import weakref
from pathlib import Path
from typing import Any

from examples.calc.agent import http_client
from examples.calc.calculator import MAX_TURNS, SYSTEM_PROMPT
from examples.calc.reward import reward
from fulgor import LLM, rollout

__all__ = ["AGENT_NAME", "MODEL_INFO", "autogen_calc", "calculator_workbench"]

ROOT = Path(__file__).resolve().parents[2]
AGENT_NAME = "calculator_agent"
SERVER_MODULE = "examples.calc_autogen.calculator_server"
# A model AutoGen does not know by name needs its capabilities stated.
MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
_SERVER_HELP = "its own last words are on the runner's stderr (under a Trainer, run_dir/logs/runners.log)"
_WORKBENCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
    weakref.WeakKeyDictionary()
)


def _autogen() -> tuple[Any, Any, Any, Any]:
    """AutoGen's classes, or an ImportError saying which Python the runners need."""
    try:
        from autogen_agentchat.agents import AssistantAgent
        from autogen_ext.models.openai import OpenAIChatCompletionClient
        from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams
    except ImportError as error:
        raise ImportError(
            f"the AutoGen calc agent needs AutoGen, which {sys.executable} lacks ({error}): start the "
            "runners on the AutoGen environment's Python (Trainer(runner_python=...), fulgor train "
            "--runner-python .frameworks/autogen/bin/python; make .frameworks/autogen/.installed builds it)"
        ) from error
    # AutoGen's event log holds every model call's whole request and response (token ids included)
    # at INFO: megabytes a training step in the runners' log.
    logging.getLogger("autogen_core.events").setLevel(logging.WARNING)
    return AssistantAgent, OpenAIChatCompletionClient, McpWorkbench, StdioServerParams


async def _start_workbench() -> Any:
    _, _, McpWorkbench, StdioServerParams = _autogen()
    server = StdioServerParams(
        command=sys.executable,
        args=["-m", os.environ.get("CALC_MCP_SERVER", SERVER_MODULE)],
        env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")},
        read_timeout_seconds=30,
    )
    workbench = McpWorkbench(server)
    await workbench.start()
    try:
        await asyncio.wait_for(workbench.list_tools(), timeout=60)  # the server is up and answers
    except BaseException:
        with contextlib.suppress(Exception):
            await workbench.stop()
        raise
    return workbench


async def calculator_workbench() -> Any:
    """This event loop's running calculator server, started on first use (or after one died)."""
    loop = asyncio.get_running_loop()
    starting = _WORKBENCHES.get(loop)
    if starting is None or (starting.done() and (starting.cancelled() or starting.exception())):
        starting = _WORKBENCHES[loop] = loop.create_task(_start_workbench(), name="calc-mcp-server")
    try:
        return await asyncio.shield(starting)
    except ImportError:
        raise
    except Exception as error:
        raise RuntimeError(
            f"the calculator MCP server did not start ({type(error).__name__}: {error}); {_SERVER_HELP}"
        ) from error


async def _forget_if_stopped(workbench: Any) -> bool:
    """After a failure: whether the server has stopped (it no longer answers); a stopped one is
    forgotten, so that the next rollout starts another."""
    try:
        await asyncio.wait_for(workbench.list_tools(), timeout=10)
        return False
    except Exception:
        loop = asyncio.get_running_loop()
        starting = _WORKBENCHES.get(loop)
        if (
            starting is not None
            and starting.done()
            and not starting.cancelled()
            and starting.exception() is None
            and starting.result() is workbench
        ):
            del _WORKBENCHES[loop]
        with contextlib.suppress(Exception):
            await workbench.stop()
        return True


def _stopped(error: BaseException | None) -> RuntimeError:
    said = "a tool call failed" if error is None else f"{type(error).__name__}: {error}"
    return RuntimeError(f"the calculator MCP server stopped ({said}); {_SERVER_HELP}")


@rollout
async def autogen_calc(task: dict[str, Any], llm: LLM) -> float:
    """One problem: the AssistantAgent calls the MCP calculator as often as ``max_tool_iterations``
    allows; only a reply the model wrote answers (a run that ends on a tool call ends on the
    calculator's number, a ``ToolCallSummaryMessage``, which is not the model's answer)."""
    AssistantAgent, OpenAIChatCompletionClient, _, _ = _autogen()
    workbench = await calculator_workbench()
    sampling = {k: v for k, v in llm.sampling_parameters.items() if v is not None}
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.endpoint,
        api_key=llm.api_key or "fulgor",
        model_info=MODEL_INFO,
        http_client=http_client(),  # shared by the loop's rollouts: never closed here
        max_retries=2,
        **sampling,
    )
    agent = AssistantAgent(
        AGENT_NAME,
        model_client=client,
        workbench=workbench,
        system_message=SYSTEM_PROMPT,
        max_tool_iterations=MAX_TURNS,
    )
    try:
        result = await agent.run(task=task["question"])
    except Exception as error:
        if await _forget_if_stopped(workbench):
            raise _stopped(error) from error
        raise
    # A call to a dead server comes back to the model as an error text, not an exception.
    tool_failed = any(
        getattr(outcome, "is_error", False)
        for message in result.messages
        if message.type == "ToolCallExecutionEvent"
        for outcome in message.content
    )
    if tool_failed and await _forget_if_stopped(workbench):
        raise _stopped(None)
    final = result.messages[-1]
    answer = final.content if final.type == "TextMessage" and isinstance(final.content, str) else None
    return reward(answer, int(task["answer"]))
