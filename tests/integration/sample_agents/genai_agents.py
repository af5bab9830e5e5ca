"""An agent whose framework follows OpenTelemetry's GenAI semantic conventions, as AutoGen does: each
agent's turn runs inside an ``invoke_agent`` span naming it (``gen_ai.agent.name``), and the model
is called with the plain openai SDK, which knows nothing of agents."""

from __future__ import annotations

from typing import Any

from fulgor import LLM, rollout


@rollout
async def two_agents_in_spans(task: dict[str, Any], llm: LLM) -> float:
    """A planner's call, a call inside a span below the planner's (its tool, say), a solver's call,
    and a call outside any agent's span: the first three are named by their agent, the last by none."""
    from openai import AsyncOpenAI
    from opentelemetry import trace

    tracer = trace.get_tracer("a-framework")
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none")
    messages = [{"role": "user", "content": task["question"]}]

    async def call() -> None:
        await client.chat.completions.create(model="any-model", messages=messages, max_tokens=4)  # type: ignore[arg-type]

    for agent in ("planner", "solver"):
        with tracer.start_as_current_span(f"invoke_agent {agent}", attributes={"gen_ai.agent.name": agent}):
            await call()
            if agent == "planner":
                with tracer.start_as_current_span("execute_tool search"):
                    await call()
    await call()
    await client.close()
    return 1.0
