"""The calc task through AutoGen AgentChat with its calculator as an MCP server (stdio), run by the
trainer's runner processes on AutoGen's own virtual environment (``runner_python``): every call
recorded with the engine's ids and the agent's name, the MCP tool listed and called, one server per
runner shared by its rollouts, and a crashing tool server failing its rollout with a clear error
and leaving no process behind."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.engine_support import assert_ids_recorded, assert_logprobs_of, stored_calls
from tests.integration.trainer_support import scripted_trainer
from tests.process_support import left_behind

pytest.importorskip("torch")

from examples.calc.dataset import make_splits
from examples.calc.train import main, run_demo
from examples.calc.warm_start import WarmStartConfig, solution
from examples.calc_autogen.agent import AGENT_NAME, autogen_calc
from examples.calc_autogen.train import AUTOGEN_TOOL, ROOT, autogen_demo_agent, autogen_python
from fulgor import GRPO, RolloutConfig, Trainer
from fulgor.adapters import DriftReport
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply, ScriptedToolCall
from fulgor.training.run_report import read_metrics
from fulgor.types import ModelCall

CRASHING_SERVER = "tests.integration.crashing_mcp_server"
ANNOUNCING_SERVER = "tests.integration.announcing_mcp_server"


@pytest.fixture(scope="module")
def python() -> str:
    """The AutoGen environment's Python: make test builds it, so CI must have it."""
    try:
        return autogen_python()
    except ConfigError as error:
        if os.environ.get("CI"):
            pytest.fail(str(error))
        pytest.skip(str(error))


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


async def span_names(run_dir: Path, rollout_id: str) -> set[str]:
    store = SqliteStore(run_dir / "store.sqlite")
    try:
        return {span.name for span in await store.query_spans(rollout_id)}
    finally:
        await store.close()


def agent_processes() -> list[str]:
    """Processes this test started still running (the runner pool, its runners, their servers), and
    this example's orphans (an MCP server that outlived its runner is no longer below the test)."""
    return left_behind("examples.calc_autogen", CRASHING_SERVER, ANNOUNCING_SERVER)


def calculator_call(task: dict[str, object]) -> ScriptedReply:
    expression = f"{task['a']}{task['op']}{task['b']}"
    return ScriptedReply(text="", tool_calls=(ScriptedToolCall("calculator", {"expression": expression}),))


def test_the_autogen_agent_runs_on_its_own_python_with_its_calls_recorded(
    tmp_path: Path, python: str
) -> None:
    assert importlib.util.find_spec("autogen_agentchat") is None  # only the AutoGen Python can run it
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    tasks = make_splits(seed=0, sizes=(8, 4, 4))["train"][:3]
    trainer = Trainer(
        algorithm=GRPO(max_tokens=16),
        engine=EngineConfig(model=model, device="cpu"),
        run_dir=tmp_path / "run",
        n_runners=1,
        runner_python=python,
        progress=False,
    )
    report = trainer.dev(autogen_calc, tasks)
    assert [r.status for r in report.rollouts] == ["succeeded"] * 3
    # AutoGen's own OpenTelemetry spans are recorded with the rollout's.
    names = asyncio.run(span_names(tmp_path / "run", report.rollouts[0].rollout_id))
    assert f"invoke_agent {AGENT_NAME}" in names
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(model)
    for status, calls, _ in asyncio.run(recorded(tmp_path / "run")):
        assert status == "succeeded"
        assert calls
        for call in calls:
            assert_logprobs_of(weights, call)  # exactly the ids the engine sampled, with its logprobs
            assert call.agent_name == AGENT_NAME  # by fulgor, from AutoGen's own invoke_agent span
            # The tool the model was offered is the MCP server's, as AutoGen writes it.
            assert call.request["tools"] == [AUTOGEN_TOOL]
    assert not agent_processes()


def test_the_mcp_calculator_answers_and_the_conversation_is_the_warm_starts(
    tmp_path: Path, python: str
) -> None:
    (task,) = make_splits(seed=0, sizes=(8, 4, 4))["train"][:1]
    with ScriptedOpenAIServer() as upstream:  # a simulated model on loopback: it calls the tool, then answers
        upstream.script(calculator_call(task), ScriptedReply(text=f"Answer: {task['answer']}"))
        report = scripted_trainer(upstream, tmp_path / "run", runner_python=python).dev(autogen_calc, [task])
    assert [(r.status, r.reward) for r in report.rollouts] == [("succeeded", 1.0)]
    [(_, [first, second], _)] = asyncio.run(recorded(tmp_path / "run"))
    assert first.response["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    tool_result = second.request["messages"][-1]
    assert tool_result["role"] == "tool"
    assert tool_result["content"] == str(task["answer"])  # computed by the MCP server's calculator
    # What the warm start teaches is what the agent sends: its messages (but for the ids the
    # model's call carries, and the user's name, which the chat template does not write) and tool.
    expected = solution(task, use_tool=True)[:4]
    call_id = second.request["messages"][2]["tool_calls"][0]["id"]
    expected[2]["tool_calls"][0]["id"] = expected[3]["tool_call_id"] = call_id
    sent = [{k: v for k, v in m.items() if k != "name"} for m in second.request["messages"]]
    assert sent == expected
    assert second.request["tools"] == [AUTOGEN_TOOL]


def test_one_calculator_server_serves_a_runners_rollouts(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALC_MCP_SERVER", ANNOUNCING_SERVER)
    tasks = make_splits(seed=0, sizes=(8, 4, 4))["train"][:4]
    with ScriptedOpenAIServer() as upstream:  # one rollout at a time: the replies come in order
        for task in tasks:
            upstream.script(calculator_call(task), ScriptedReply(text=f"Answer: {task['answer']}"))
        trainer = scripted_trainer(upstream, tmp_path / "run", runner_python=python, max_concurrency=1)
        report = trainer.dev(autogen_calc, tasks)
    assert [(r.status, r.reward) for r in report.rollouts] == [("succeeded", 1.0)] * 4
    log = (tmp_path / "run" / "logs" / "runners.log").read_text()
    assert log.count("calculator server") == 1, log[-3000:]
    assert not agent_processes()


def test_a_crashing_tool_server_fails_its_rollout_clearly_and_the_retry_starts_another(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALC_MCP_SERVER", CRASHING_SERVER)
    (task,) = make_splits(seed=0, sizes=(8, 4, 4))["train"][:1]
    with ScriptedOpenAIServer() as upstream:
        upstream.script(*[calculator_call(task)] * 4)  # each attempt calls the tool, which crashes
        trainer = scripted_trainer(
            upstream,
            tmp_path / "run",
            runner_python=python,
            rollout_config=RolloutConfig(timeout_seconds=120, max_attempts=2, retry_on=("failed",)),
        )
        report = trainer.dev(autogen_calc, [task])
    assert [r.status for r in report.rollouts] == ["failed"]
    [(status, _, error)] = asyncio.run(recorded(tmp_path / "run"))
    assert status == "failed"
    assert error is not None
    assert "the calculator MCP server stopped" in error
    assert "runners.log" in error
    log = (tmp_path / "run" / "logs" / "runners.log").read_text()
    assert log.count("calculator server crashed") == 2, log[-3000:]  # its own last words, each attempt's
    assert not agent_processes()


def test_fulgor_train_runs_and_trains_it_from_the_command_line(tmp_path: Path, python: str) -> None:
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    tasks = make_splits(seed=0, sizes=(8, 4, 4))["train"][:2]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))

    def train(runner_python: str, run_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fulgor.cli.main", "train",
             "--agent", "examples.calc_autogen.agent:autogen_calc", "--runner-python", runner_python,
             *(options or ["--dev"]), "--train", str(tmp_path / "tasks.jsonl"), "--model", str(model),
             "--device", "cpu", "--run-dir", str(run_dir), "--n-runners", "1", "--max-tokens", "16"],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip

    result = train(python, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 rollouts, 2 succeeded" in result.stdout
    found = asyncio.run(recorded(tmp_path / "run"))
    assert [status for status, _, _ in found] == ["succeeded", "succeeded"]
    assert all(calls for _, calls, _ in found)
    for call in (call for _, calls, _ in found for call in calls):
        assert call.agent_name == AGENT_NAME
        assert_ids_recorded(call)
    # This environment's Python cannot import AutoGen: the rollouts fail, saying which Python to use.
    result = train(sys.executable, tmp_path / "plain")
    assert result.returncode == 1
    [(status, _, error)] = asyncio.run(recorded(tmp_path / "plain"))[:1]
    assert status == "failed"
    assert error is not None
    assert "--runner-python .frameworks/autogen/bin/python" in error
    # And a GRPO step of two rollouts, from the same command without --dev.
    result = train(python, tmp_path / "grpo", "--steps", "1", "--group-size", "2", "--batch-tasks", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    history = read_metrics(tmp_path / "grpo")
    assert [m["step"] for m in history] == [1]  # no validation split: no step 0
    assert (history[0]["rollouts"], history[0]["rollouts_failed"]) == (2, 0)
    assert (tmp_path / "grpo" / "checkpoints" / "step-1" / "config.json").is_file()
    trained = asyncio.run(stored_calls(tmp_path / "grpo" / "store.sqlite"))
    assert trained
    for call in trained:
        assert call.agent_name == AGENT_NAME
        assert_ids_recorded(call)
    assert not agent_processes()


def test_the_calc_demos_pipeline_trains_it_through_its_own_python(tmp_path: Path, python: str) -> None:
    result = run_demo(
        tmp_path / "calc-autogen",
        max_steps=1,
        warm=WarmStartConfig(steps=2, batch_size=4),
        progress=False,
        sizes=(16, 4, 4),
        agent=autogen_demo_agent(),
    )
    [step] = [m for m in result.history if m["step"] == 1]
    assert step["rollouts"] == 64
    assert step["rollouts_failed"] == 0
    assert step["drift/calls_trained"] == step["drift/calls_total"] > 0
    assert all(step[f"drift/{name}"] == 0 for name in DriftReport.LOSSES)
    assert result.test_after["val_rollouts_failed"] == 0
    # AutoGen ran them (this Python cannot import it): the tool offered is as AutoGen writes it.
    found = asyncio.run(recorded(tmp_path / "calc-autogen" / "grpo"))
    assert all(call.request["tools"] == [AUTOGEN_TOOL] for _, calls, _ in found for call in calls)
    assert not agent_processes()


@pytest.mark.slow(minutes=15)
def test_grpo_teaches_the_autogen_agent_the_calculator(
    tmp_path: Path, python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m examples.calc_autogen.train`` for 30 steps, held to the calc demo's acceptance:
    seed 0's warm start right on under 30% of the validation problems, at least 90% of the test
    problems after GRPO, and no token lost."""
    run_dir = tmp_path / "calc-autogen"
    assert main(["--run-dir", str(run_dir), "--steps", "30"], agent=autogen_demo_agent()) == 0
    history = read_metrics(run_dir / "grpo")
    assert history[0]["val_accuracy"] < 0.30
    for metrics in history[1:]:
        assert metrics["rollouts_failed"] == 0, metrics
        assert all(metrics[f"drift/{name}"] == 0 for name in DriftReport.LOSSES), metrics
    result = json.loads((run_dir / "result.json").read_text())
    assert result["test_after"]["val_accuracy"] >= 0.90, history
    assert "calc-autogen: GRPO" in (run_dir / "grpo" / "report.html").read_text()
    assert "held-out test accuracy" in capsys.readouterr().out
    assert not agent_processes()
