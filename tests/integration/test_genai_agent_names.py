"""A framework that follows OpenTelemetry's GenAI semantic conventions (AutoGen does) needs nothing
but its base URL for its calls to name their agents: each model call made inside an agent's
``invoke_agent`` span, or a span below it, is recorded with that agent's name; a call outside any
agent's span with none. The agent runs in the trainer's runner processes, through the real gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.engine_support import stored_calls
from tests.integration.sample_agents.genai_agents import two_agents_in_spans
from tests.integration.trainer_support import scripted_trainer

from fulgor.testing.openai_server import ScriptedOpenAIServer

pytest.importorskip("opentelemetry.sdk")


def test_each_call_is_named_by_the_agent_span_it_is_made_in(tmp_path: Path) -> None:
    with ScriptedOpenAIServer() as upstream:
        tasks = [{"question": "2 + 2?"}, {"question": "3 + 3?"}]
        report = scripted_trainer(upstream, tmp_path / "run").dev(two_agents_in_spans, tasks)
    assert [r.status for r in report.rollouts] == ["succeeded"] * 2
    calls = asyncio.run(stored_calls(tmp_path / "run" / "store.sqlite"))
    names = [call.agent_name for call in calls]
    assert names == ["planner", "planner", "solver", None] * 2
