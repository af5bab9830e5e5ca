"""Zero-code agents through the whole system: ``fulgor serve --upstream`` and ``fulgor runner``.

A Python script that knows only the ``openai`` SDK and a bash script that knows only curl each
call the model through the gateway and post their reward; the store ends up with their calls
(token ids included) and rewards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fulgor import LLM, RolloutRequest, semconv
from fulgor.store.client import StoreClient
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply

ROOT = Path(__file__).resolve().parents[2]

PYTHON_AGENT = """
import json, os, urllib.request
from openai import OpenAI

task = json.loads(os.environ["FULGOR_TASK"])
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
reply = client.chat.completions.create(
    model=os.environ["FULGOR_MODEL"], messages=[{"role": "user", "content": task["question"]}]
)
value = 1.0 if reply.choices[0].message.content.strip() == str(task["answer"]) else 0.0
body = json.dumps({"value": value}).encode()
urllib.request.urlopen(urllib.request.Request(os.environ["FULGOR_REWARD_URL"], data=body))
"""

BASH_AGENT = """#!/usr/bin/env bash
set -euo pipefail
field() { python3 -c "import json,os; print(json.loads(os.environ['FULGOR_TASK'])['$1'])"; }
question=$(field question)
message="{\\"role\\": \\"user\\", \\"content\\": \\"$question\\"}"
answer=$(curl -sf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \\
  -H 'Content-Type: application/json' -d "{\\"model\\": \\"$FULGOR_MODEL\\", \\"messages\\": [$message]}" \\
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
value=0.0
if [ "$answer" = "$(field answer)" ]; then value=1.0; fi
curl -sf -o /dev/null -d "{\\"value\\": $value}" "$FULGOR_REWARD_URL"
"""

AGENTS_MODULE = """
import sys
from fulgor import SubprocessAgent

python_agent = SubprocessAgent([sys.executable, "{python}"], name="python-openai")
bash_agent = SubprocessAgent(["bash", "{bash}"], name="bash-curl")
"""


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


@pytest.fixture
def agents_module(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "agent.py").write_text(PYTHON_AGENT)
    (tmp_path / "agent.sh").write_text(BASH_AGENT)
    package = tmp_path / "zero_code_agents.py"
    package.write_text(AGENTS_MODULE.format(python=tmp_path / "agent.py", bash=tmp_path / "agent.sh"))
    return tmp_path, "zero_code_agents"


@pytest.mark.parametrize("agent", ["python_agent", "bash_agent"])
def test_zero_code_agents_through_serve_gateway_and_runner(
    agents_module: tuple[Path, str], tmp_path: Path, agent: str
) -> None:
    directory, module = agents_module
    env = {**os.environ, "PYTHONPATH": f"{directory}:{ROOT}"}
    with ScriptedOpenAIServer(default_reply=ScriptedReply(text="4")) as upstream:
        serve = start(
            [sys.executable, "-m", "fulgor.cli.main", "serve", "--port", "0", "--upstream", upstream.url,
             "--store", f"sqlite:///{tmp_path}/store.sqlite"],
            env,
        )  # fmt: skip
        assert serve.stdout is not None
        url = serve.stdout.readline().strip()
        runner = None
        try:
            rollout_ids = asyncio.run(_enqueue(url))
            runner = start(
                [sys.executable, "-m", "fulgor.cli.main", "runner", "--agent", f"{module}:{agent}",
                 "--store", url, "--gateway-url", url, "--max-concurrency", "2", "--heartbeat-seconds", "1"],
                env,
            )  # fmt: skip
            results = asyncio.run(_results(url, rollout_ids))
        finally:
            if runner is not None:
                stop(runner)
            stop(serve)
    (right_calls, right_reward), (wrong_calls, wrong_reward) = results
    assert (right_reward, wrong_reward) == (1.0, 0.0)
    for calls in (right_calls, wrong_calls):
        [call] = calls
        assert call["response_token_ids"] == [ord("4")]
        assert call["prompt_token_ids"]
    assert len(upstream.samples) == 2


async def _enqueue(url: str) -> list[str]:
    store = StoreClient(url)
    await store.put_resources({"llm": LLM(endpoint="http://unused/v1", model="scripted-model")})
    created = await store.enqueue(
        [
            RolloutRequest(input={"question": "2+2", "answer": 4}),
            RolloutRequest(input={"question": "2+3", "answer": 5}),
        ]
    )
    await store.close()
    return [r.rollout_id for r in created]


async def _results(url: str, rollout_ids: list[str]) -> list[tuple[list[dict[str, object]], float]]:
    store = StoreClient(url)
    done = await store.wait(rollout_ids, timeout_seconds=60)
    assert [r.status for r in done] == ["succeeded", "succeeded"]
    results = []
    for rollout_id in rollout_ids:
        calls = await store.query_spans(rollout_id, name=semconv.SPAN_MODEL_CALL)
        [reward] = await store.query_spans(rollout_id, name=semconv.SPAN_REWARD)
        results.append(
            (
                [s.attributes[semconv.ATTR_MODEL_CALL] for s in calls],
                reward.attributes[semconv.ATTR_REWARD_VALUE],
            )
        )
    await store.close()
    return results
