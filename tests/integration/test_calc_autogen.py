"""The calc task through AutoGen AgentChat with its calculator as an MCP server (stdio), run by fulgor
as a program from AutoGen's own virtual environment: every call recorded with the engine's ids and
the agent's name, the MCP tool listed and called, and a crashing tool server failing its rollout
with a clear error and leaving no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from examples.calc.calculator import CALCULATOR_TOOL
from examples.calc.dataset import make_splits
from examples.calc_autogen.runner import ROOT, AutogenCalc
from fulgor import GRPO, RolloutConfig, Trainer
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from fulgor.types import ModelCall

AUTOGEN_PYTHON = ROOT / ".frameworks" / "autogen" / "bin" / "python"
CRASHING_SERVER = "tests.integration.crashing_mcp_server"


@pytest.fixture(autouse=True)
def autogen_environment() -> None:
    if not AUTOGEN_PYTHON.is_file() and not os.environ.get("FULGOR_AUTOGEN_PYTHON"):
        message = f"{AUTOGEN_PYTHON} is missing: make test builds it (make .frameworks/autogen/.installed)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


async def recorded(run_dir: Path) -> list[tuple[str, list[ModelCall], str | None]]:
    """Each rollout's status, model calls and latest attempt's error, oldest first."""
    store = SqliteStore(run_dir / "store.sqlite")
    try:
        found = []
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id, name="fulgor.model_call")
            calls = [ModelCall.model_validate(s.attributes["fulgor.model_call"]) for s in spans]
            attempts = await store.list_attempts(rollout.rollout_id)
            found.append((rollout.status, calls, attempts[-1].error))
        return found
    finally:
        await store.close()


def agent_processes() -> list[str]:
    """Processes of this example still running (the agent program or an MCP server)."""
    listing = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [
        line for line in listing.splitlines() if "examples.calc_autogen" in line or CRASHING_SERVER in line
    ]


def test_the_autogen_agent_runs_on_the_local_engine_with_its_calls_recorded(tmp_path: Path) -> None:
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    tasks = make_splits(seed=0, sizes=(8, 4, 4))["train"][:3]
    trainer = Trainer(
        algorithm=GRPO(max_tokens=16),
        engine=EngineConfig(model=model, device="cpu"),
        run_dir=tmp_path / "run",
        n_runners=1,
        progress=False,
    )
    report = trainer.dev(AutogenCalc(), tasks)
    assert [r.status for r in report.rollouts] == ["succeeded"] * 3
    for status, calls, _ in asyncio.run(recorded(tmp_path / "run")):
        assert status == "succeeded"
        assert calls
        for call in calls:
            assert not call.token_ids_missing
            assert call.prompt_token_ids
            assert call.response_token_ids
            assert call.response_logprobs
            assert call.agent_name == "calculator_agent"  # its X-Fulgor-Agent header
            # The tool the model was offered is the MCP server's: the calc demo's calculator.
            (tool,) = call.request["tools"]
            assert tool["function"]["name"] == "calculator"
            assert tool["function"]["description"] == CALCULATOR_TOOL["function"]["description"]
            assert tool["function"]["parameters"]["properties"] == {"expression": {"type": "string"}}
    assert not agent_processes()


def test_the_mcp_calculator_answers_the_agents_tool_call(tmp_path: Path) -> None:
    (task,) = make_splits(seed=0, sizes=(8, 4, 4))["train"][:1]
    expression = f"{task['a']}{task['op']}{task['b']}"
    replies = [
        ScriptedReply(text="", tool_calls=(ScriptedToolCall("calculator", {"expression": expression}),)),
        ScriptedReply(text=f"Answer: {task['answer']}"),
    ]
    with ScriptedOpenAIServer() as upstream:  # a simulated model on loopback: it calls the tool, then answers
        upstream.script(*replies)
        trainer = Trainer(
            algorithm=GRPO(),
            upstream=upstream.url,
            model="scripted",
            run_dir=tmp_path / "run",
            n_runners=1,
            progress=False,
        )
        report = trainer.dev(AutogenCalc(), [task])
    assert [(r.status, r.reward) for r in report.rollouts] == [("succeeded", 1.0)]
    [(_, [first, second], _)] = asyncio.run(recorded(tmp_path / "run"))
    assert first.response["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    tool_result = second.request["messages"][-1]
    assert tool_result["role"] == "tool"
    assert tool_result["content"] == str(task["answer"])  # computed by the MCP server's calculator
    assert "tools" in second.request  # the agent went on with its tools: the row merges
    assert not agent_processes()


def test_a_crashing_tool_server_fails_its_rollout_clearly_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALC_MCP_SERVER", CRASHING_SERVER)
    (task,) = make_splits(seed=0, sizes=(8, 4, 4))["train"][:1]
    replies = [
        ScriptedReply(text="", tool_calls=(ScriptedToolCall("calculator", {"expression": "1+1"}),))
    ] * 2
    with ScriptedOpenAIServer() as upstream:
        upstream.script(*replies)
        trainer = Trainer(
            algorithm=GRPO(),
            upstream=upstream.url,
            model="scripted",
            run_dir=tmp_path / "run",
            n_runners=1,
            progress=False,
            rollout_config=RolloutConfig(timeout_seconds=120, max_attempts=2, retry_on=("failed",)),
        )
        report = trainer.dev(AutogenCalc(), [task])
    assert [r.status for r in report.rollouts] == ["failed"]
    [(status, _, error)] = asyncio.run(recorded(tmp_path / "run"))
    assert status == "failed"
    assert error is not None
    assert "the AutoGen agent exited with code" in error
    assert "calculator server crashed" in error  # the server's own last words, through the agent
    assert "the calculator MCP server failed" in error
    assert not agent_processes()


def test_fulgor_train_dev_runs_it_from_the_command_line(tmp_path: Path) -> None:
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    tasks = make_splits(seed=0, sizes=(8, 4, 4))["train"][:2]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    result = subprocess.run(
        [sys.executable, "-m", "fulgor.cli.main", "train",
         "--agent", "examples.calc_autogen.runner:AutogenCalc", "--dev",
         "--train", str(tmp_path / "tasks.jsonl"), "--model", str(model), "--device", "cpu",
         "--run-dir", str(tmp_path / "run"), "--n-runners", "1", "--max-tokens", "16"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 rollouts, 2 succeeded" in result.stdout
    found = asyncio.run(recorded(tmp_path / "run"))
    assert [status for status, _, _ in found] == ["succeeded", "succeeded"]
    assert all(calls and calls[0].agent_name == "calculator_agent" for _, calls, _ in found)
    assert not agent_processes()
