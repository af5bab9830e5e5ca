"""The framework matrix: a minimal agent of each supported framework, unchanged but for its base URL,
runs through the real gateway in front of fulgor's local engine (a tiny model on CPU), whole and
streamed where the framework streams. Every recorded call must carry the ids and logprobs the engine
sampled (a forward pass over exactly those ids gives the same logprobs), and its response ids must
decode to the text the agent received. The README's table of supported frameworks is this matrix.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from gateway_support import GatewayEnv, gateway_env
from tests.engine_support import assert_sampled_by
from tests.offline import offline_part

from fulgor import semconv
from fulgor.engine.app import create_app
from fulgor.engine.local import EngineConfig, LocalEngine
from fulgor.engine.models import init_model
from fulgor.net.asgi import ServerThread
from fulgor.types import ModelCall

ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(__file__).with_name("frameworks")
README = ROOT / "README.md"
MODEL = "tiny"


@dataclass(frozen=True)
class Framework:
    """One row of the matrix: its agent program, the virtual environment it runs from (None: the
    test's own), how many calls it makes (None: it decides), and whether it also streams."""

    script: str
    venv: str | None = None
    calls: int | None = 2
    streams: bool = True
    texts_are_replies: bool = True
    """Whether the texts the agent prints are the calls' replies as the engine wrote them."""


MATRIX = {
    "openai SDK, chat completions": Framework("openai_chat.py"),
    "openai SDK, Responses API": Framework("openai_responses.py"),
    "Anthropic SDK": Framework("anthropic_sdk.py"),
    "LangChain": Framework("langchain_agent.py"),
    "LangGraph": Framework("langgraph_agent.py"),
    "OpenAI Agents SDK": Framework("agents_sdk.py"),
    "AutoGen AgentChat": Framework("autogen_agent.py", venv="autogen"),
    # A crew parses its agent's reply (ReAct) and may ask again: how many calls is its own choice.
    "CrewAI": Framework("crewai_agent.py", venv="crewai", calls=None, texts_are_replies=False),
    "curl (bash)": Framework("curl_agent.sh"),
}


def taught_to_stop(model_dir: Path, steps: int = 60) -> None:
    """A few steps of SFT (seconds on CPU) so that the tiny model answers a chat in a few tokens and
    stops: an untrained one runs to ``max_tokens``, and a response cut off there is ``incomplete``,
    which the Agents SDK raises on, as it would for any model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(steps):
        rows = []
        for _ in range(8):
            a, b = rng.randrange(10), rng.randrange(10)
            messages = [{"role": "user", "content": f"{rng.choice(['What is', 'Add'])} {a} + {b}?"}]
            prompt = list(
                tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=True
                )["input_ids"]
            )
            rows.append(
                (prompt, [*tokenizer.encode(str(a + b), add_special_tokens=False), tokenizer.eos_token_id])
            )
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100)
        for i, (prompt, answer) in enumerate(rows):
            ids[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
            labels[i, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer)
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LocalEngine:
    model_dir = init_model(tmp_path_factory.mktemp("matrix") / MODEL, "tiny", seed=0)
    taught_to_stop(model_dir)
    return LocalEngine.from_config(EngineConfig(model=model_dir, device="cpu", max_model_len=2048, seed=0))


@pytest.fixture(scope="module")
def engine_url(engine: LocalEngine) -> Iterator[str]:
    with ServerThread(create_app(engine)) as server:
        yield f"{server.url}/v1"


@pytest.fixture
async def env(engine_url: str) -> AsyncIterator[GatewayEnv]:
    async with gateway_env([engine_url]) as env:
        yield env


def interpreter(framework: Framework) -> list[str]:
    if framework.script.endswith(".sh"):
        return ["bash"]
    if framework.venv is None:
        return [sys.executable]
    python = ROOT / ".frameworks" / framework.venv / "bin" / "python"
    if not python.is_file():
        message = f"{python} is missing: make test builds it (make .frameworks/{framework.venv}/.installed)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return [str(python)]


def agent_environment(base_url: str) -> dict[str, str]:
    """What a SubprocessAgent gives its program, as far as a model client reads it."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT")}
    return {
        **keep,
        # The frameworks' own telemetry would try to reach their vendors' servers.
        **offline_part(os.environ),
        "OTEL_SDK_DISABLED": "true",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "attempt-credential",
        "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": "attempt-credential",
        "FULGOR_MODEL": MODEL,
    }


def texts_of(framework: Framework, stdout: str) -> list[str]:
    if framework.script.endswith(".sh"):  # curl prints the whole answer, then the stream's events
        first, *events = [line for line in stdout.splitlines() if line.strip()]
        chunks = [json.loads(line[len("data: ") :]) for line in events if line != "data: [DONE]"]
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        return [json.loads(first)["choices"][0]["message"]["content"], streamed]
    texts: list[str] = json.loads(stdout.strip().splitlines()[-1])["texts"]
    return texts


async def recorded(env: GatewayEnv, rollout_id: str) -> list[tuple[ModelCall, dict[str, object]]]:
    await env.gateway.settle()
    spans = await env.store.query_spans(rollout_id, name=semconv.SPAN_MODEL_CALL)
    return [(ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]), s.attributes) for s in spans]


@pytest.mark.parametrize("name", list(MATRIX))
async def test_each_framework_records_the_engines_ids(
    name: str, env: GatewayEnv, engine: LocalEngine
) -> None:
    framework = MATRIX[name]
    command = [*interpreter(framework), str(AGENTS / framework.script)]
    rollout, base_url = await env.rollout()
    result = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=240, env=agent_environment(base_url)
    )
    assert result.returncode == 0, result.stderr[-4000:]
    texts = texts_of(framework, result.stdout)
    calls = [call for call, _ in await recorded(env, rollout.rollout_id)]
    if framework.calls is not None:
        assert len(calls) == framework.calls, [c.request for c in calls]
    assert calls, "the agent made no call through the gateway"
    streamed = [bool(call.request.get("stream")) for call in calls]
    assert any(streamed) == framework.streams, streamed
    assert not all(streamed), "every call was streamed: the whole one is missing"
    for call in calls:
        assert call.error is None, call.error
        assert_sampled_by(engine, call)
    if framework.texts_are_replies:
        tokenizer = engine.tokenizer
        decoded = [
            tokenizer.decode(call.response_token_ids or [], skip_special_tokens=True) for call in calls
        ]
        assert [t.strip() for t in decoded] == [t.strip() for t in texts]


def test_the_readme_table_of_frameworks_is_the_matrix() -> None:
    section = README.read_text().split("#### Supported frameworks", 1)[1].split("\n#", 1)[0]
    rows = [
        line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| framework")
    ]
    names = [re.sub(r"\s+", " ", row.split("|")[1].strip()) for row in rows if not set(row) <= set("|- ")]
    assert names == list(MATRIX)
