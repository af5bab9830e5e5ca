"""The calc agent written with AutoGen AgentChat: an ``AssistantAgent`` whose calculator is the MCP
server next to this file, started over stdio for the rollout and stopped with it.

Run once per rollout as a program (a ``SubprocessAgent``, see ``runner.py``): the task comes in
``FULGOR_TASK``, the model behind ``OPENAI_BASE_URL``; it prints the agent's final reply on the
last line of stdout, and the reward is the calc task's own check of it. Nothing here knows about
training but the environment variables every OpenAI client reads. ``CALC_MCP_SERVER`` names another
server module to start instead of ``examples.calc_autogen.calculator_server``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams

from examples.calc.calculator import MAX_TURNS, SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parents[2]
AGENT_NAME = "calculator_agent"
# A model AutoGen does not know by name needs its capabilities stated.
MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


async def main() -> None:
    task = json.loads(os.environ["FULGOR_TASK"])
    sampling = (
        json.loads(os.environ.get("FULGOR_RESOURCES", "{}")).get("llm", {}).get("sampling_parameters", {})
    )
    client = OpenAIChatCompletionClient(
        model=os.environ["FULGOR_MODEL"],
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        model_info=MODEL_INFO,
        default_headers={"X-Fulgor-Agent": AGENT_NAME},
        **{k: v for k, v in sampling.items() if k in ("temperature", "top_p", "max_tokens", "seed")},
    )
    server = StdioServerParams(
        command=sys.executable,
        args=["-m", os.environ.get("CALC_MCP_SERVER", "examples.calc_autogen.calculator_server")],
        env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")},
        read_timeout_seconds=30,
    )
    try:
        async with McpWorkbench(server) as workbench:
            agent = AssistantAgent(
                AGENT_NAME,
                model_client=client,
                workbench=workbench,
                system_message=SYSTEM_PROMPT,
                max_tool_iterations=MAX_TURNS,
            )
            result = await agent.run(task=task["question"])
    except Exception as error:
        # The MCP server's own stderr (why it stopped) is already above, on this process's stderr.
        print(f"the calculator MCP server failed: {type(error).__name__}: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        await client.close()
    final = result.messages[-1]
    # Only the model's own reply answers: a run that ends on a tool call ends on its result's
    # summary (a ToolCallSummaryMessage), which is the calculator's number, not the model's.
    answer = final.content if final.type == "TextMessage" and isinstance(final.content, str) else None
    print(json.dumps({"answer": answer, "last": final.type, "messages": len(result.messages)}))


if __name__ == "__main__":
    asyncio.run(main())
