"""Nobody writes where they do not belong: what an agent can do with the credential it is handed.

Everything is real: a SQLite store, the server app with the gateway on loopback (as the Trainer
runs them, with an operator key), a scripted OpenAI upstream, the openai SDK and raw HTTP. Each
test is one of the attacks an agent could once make with the key it was given (then the run's own
key), and shows that it now does no harm.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fulgor import semconv
from fulgor.adapters import rollout_reward
from fulgor.agent import AgentError, RolloutContext, emit_reward, use_context
from fulgor.credentials import attempt_credential, new_operator_key
from fulgor.gateway import GatewayConfig, create_gateway_app
from fulgor.net.asgi import serve_asgi
from fulgor.runner import Runner, RunnerConfig, SubprocessAgent
from fulgor.server import ServerConfig, create_app
from fulgor.store import SqliteStore
from fulgor.store.writer import SpanWriter
from fulgor.testing import ScriptedOpenAIServer
from fulgor.types import LLM, AttemptedRollout, RolloutRequest, Span

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Run:
    url: str
    key: str
    store: SqliteStore
    mine: AttemptedRollout
    theirs: AttemptedRollout

    @property
    def credential(self) -> str:
        """The credential the runner hands the agent of ``mine``."""
        return attempt_credential(self.key, self.mine.rollout_id, self.mine.attempt.attempt_id)

    def base_url(self, rollout: AttemptedRollout) -> str:
        return f"{self.url}/r/{rollout.rollout_id}/{rollout.attempt.attempt_id}/v1"

    def as_agent(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}

    def as_operator(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture
async def run(tmp_path: Path) -> AsyncIterator[Run]:
    store = SqliteStore(tmp_path / "store.sqlite")
    key = new_operator_key()
    async with ScriptedOpenAIServer() as upstream:
        # No cached rollout checks: a credential stops working the moment its attempt ends (by
        # default the gateway's check is cached for rollout_cache_seconds, 2 s).
        config = GatewayConfig(api_key=key, rollout_cache_seconds=0.0)
        gateway = create_gateway_app(store, [upstream.url], config)
        app = create_app(ServerConfig(store=store, gateway=gateway, token=key))
        async with serve_asgi(app, on_shutdown=app.draining.begin) as url:
            await store.enqueue([RolloutRequest(input={"n": 1}), RolloutRequest(input={"n": 2})])
            mine, theirs = await store.claim("w", limit=2)
            yield Run(url, key, store, mine, theirs)


def otlp(rollout: AttemptedRollout, name: str, attributes: dict[str, Any], span_id: str) -> dict[str, Any]:
    """An OTLP/JSON export of one span that names ``rollout`` in its resource attributes."""
    resource = [
        {"key": semconv.RESOURCE_ROLLOUT_ID, "value": {"stringValue": rollout.rollout_id}},
        {"key": semconv.RESOURCE_ATTEMPT_ID, "value": {"stringValue": rollout.attempt.attempt_id}},
    ]
    values = [{"key": k, "value": {"doubleValue": v}} for k, v in attributes.items()]
    span = {
        "traceId": "ab" * 16,
        "spanId": span_id,
        "name": name,
        "startTimeUnixNano": "1",
        "attributes": values,
    }
    return {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [{"spans": [span]}]}]}


async def test_a_credential_reaches_its_own_rollouts_gateway_url_and_no_other(run: Run) -> None:
    own = openai.AsyncOpenAI(base_url=run.base_url(run.mine), api_key=run.credential, max_retries=0)
    assert (await own.chat.completions.create(**CHAT)).choices[0].message.content
    other = openai.AsyncOpenAI(base_url=run.base_url(run.theirs), api_key=run.credential, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="not this attempt's credential"):
        await other.chat.completions.create(**CHAT)
    operator = openai.AsyncOpenAI(base_url=run.base_url(run.theirs), api_key=run.key, max_retries=0)
    assert (await operator.chat.completions.create(**CHAT)).choices[0].message.content
    await run.store.update_attempt(run.mine.rollout_id, run.mine.attempt.attempt_id, status="succeeded")
    with pytest.raises(openai.ConflictError):  # the credential stops working when the attempt ends
        await own.chat.completions.create(**CHAT)


async def test_a_credential_opens_no_store_operation(run: Run) -> None:
    reward = {"spans": [{"rollout_id": run.theirs.rollout_id, "attempt_id": run.theirs.attempt.attempt_id,
                         "trace_id": "t", "span_id": "forged", "name": semconv.SPAN_REWARD, "start_time": 1.0,
                         "attributes": {semconv.ATTR_REWARD_VALUE: 555.0}}]}  # fmt: skip
    own_attempt = f"/api/v1/rollouts/{run.mine.rollout_id}/attempts/{run.mine.attempt.attempt_id}"
    async with httpx.AsyncClient(base_url=run.url, headers=run.as_agent()) as http:
        listed = await http.get("/api/v1/rollouts")
        written = await http.post("/api/v1/spans", json=reward)
        patched = await http.patch(own_attempt, json={"metadata": {"reward": 555}})
        ended = await http.patch(own_attempt, json={"status": "succeeded"})
    assert [r.status_code for r in (listed, written, patched, ended)] == [403] * 4
    assert await run.store.query_spans(run.theirs.rollout_id) == []
    [attempt] = await run.store.list_attempts(run.mine.rollout_id)
    assert (attempt.status, attempt.metadata) == ("preparing", {})


async def test_an_agent_cannot_pause_or_resume_the_gateway(run: Run) -> None:
    async with httpx.AsyncClient(base_url=run.url) as http:
        paused = await http.post("/gateway/pause", headers=run.as_agent(), json={})
        resumed = await http.post("/gateway/resume", headers=run.as_agent(), json={"model_version": 99})
        state = (await http.get("/gateway/state", headers=run.as_operator())).json()
    assert (paused.status_code, resumed.status_code) == (403, 403)
    assert "operator key" in paused.json()["error"]["message"]
    assert (state["paused"], state["model_version"]) == (False, None)


async def test_otlp_with_a_credential_writes_into_its_own_live_attempt_only(run: Run) -> None:
    await run.store.add_spans(
        [Span(rollout_id=run.theirs.rollout_id, attempt_id=run.theirs.attempt.attempt_id, trace_id="t",
              span_id="genuine", name=semconv.SPAN_REWARD, start_time=0.0,
              attributes={semconv.ATTR_REWARD_VALUE: 0.0})]
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=run.url, headers=run.as_agent()) as http:
        # Naming another rollout in the resource attributes: not this credential's attempt.
        forged = await http.post(
            "/v1/traces",
            json=otlp(run.theirs, semconv.SPAN_REWARD, {semconv.ATTR_REWARD_VALUE: 555.0}, "01" * 8),
        )
        # A made-up model call in its own attempt: only the gateway records those.
        call = await http.post("/v1/traces", json=otlp(run.mine, semconv.SPAN_MODEL_CALL, {}, "02" * 8))
        step = await http.post("/v1/traces", json=otlp(run.mine, "agent.step", {"score": 1.0}, "03" * 8))
        await run.store.update_attempt(run.mine.rollout_id, run.mine.attempt.attempt_id, status="succeeded")
        late = await http.post(
            "/v1/traces",
            json=otlp(run.mine, semconv.SPAN_REWARD, {semconv.ATTR_REWARD_VALUE: 555.0}, "04" * 8),
        )
    assert forged.status_code == 403
    assert rollout_reward(await run.store.query_spans(run.theirs.rollout_id)) == 0.0
    assert call.status_code == 200
    assert "come from the gateway only" in call.json()["partialSuccess"]["errorMessage"]
    assert step.status_code == 200
    assert late.status_code == 409  # after the attempt ended, no reward
    assert [s.name for s in await run.store.query_spans(run.mine.rollout_id)] == ["agent.step"]


async def test_a_subprocess_agent_gets_its_attempts_credential_and_never_the_operator_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_operator_key()
    monkeypatch.setenv("FULGOR_TOKEN", key)  # as a runner process holds it
    store = SqliteStore(tmp_path / "store.sqlite")
    await store.put_resources({"llm": LLM(endpoint="http://engine/v1", model="m", api_key="upstream-key")})
    [queued] = await store.enqueue([RolloutRequest(input={})])
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    agent = SubprocessAgent(["python", "-c", script], reward_fn=lambda result: 1.0)
    runner = Runner(agent, store, config=RunnerConfig(claim_wait_seconds=0.2, gateway_url="http://gw"))
    task = asyncio.create_task(runner.run())
    await store.wait([queued.rollout_id], timeout_seconds=30)
    runner.stop()
    await task
    [attempt] = await store.list_attempts(queued.rollout_id)
    [message] = await store.query_spans(queued.rollout_id, name=semconv.SPAN_MESSAGE)
    await store.close()
    environment = json.loads(message.attributes[semconv.ATTR_MESSAGE_BODY])
    credential = attempt_credential(key, queued.rollout_id, attempt.attempt_id)
    assert environment["OPENAI_API_KEY"] == environment["ANTHROPIC_API_KEY"] == credential
    assert "FULGOR_TOKEN" not in environment
    assert key not in message.attributes[semconv.ATTR_MESSAGE_BODY]
    assert "upstream-key" not in message.attributes[semconv.ATTR_MESSAGE_BODY]


async def test_a_reward_url_refuses_rewards_once_its_attempt_has_ended(tmp_path: Path) -> None:
    from fulgor.runner.subprocess_agent import _RewardEndpoint

    store = SqliteStore(tmp_path / "store.sqlite")
    await store.enqueue([RolloutRequest(input={}), RolloutRequest(input={})])
    ended, running = await store.claim("w", limit=2)
    endpoint, writer = _RewardEndpoint(), SpanWriter(store)
    contexts = [RolloutContext(r.rollout_id, r.attempt.attempt_id, writer) for r in (ended, running)]
    ended_url, running_url = [await endpoint.register(context) for context in contexts]
    endpoint.unregister(contexts[0])  # its program has exited and its attempt is over
    async with httpx.AsyncClient() as http:
        late = await http.post(ended_url, json={"value": 555.0})
        live = await http.post(running_url, json={"value": 1.0})
    endpoint.unregister(contexts[1])
    await writer.close()
    assert (late.status_code, late.json()["error"]["code"]) == (409, "attempt_ended")
    assert live.status_code == 200
    assert await store.query_spans(ended.rollout_id) == []
    await store.close()


async def test_an_in_process_agent_records_no_model_call_and_nothing_after_its_attempt(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "store.sqlite")
    claimed = await store.start_rollout(RolloutRequest(input={}), "w")
    writer = SpanWriter(store)
    context = RolloutContext(claimed.rollout_id, claimed.attempt.attempt_id, writer)
    forged = Span(rollout_id=claimed.rollout_id, attempt_id=claimed.attempt.attempt_id, trace_id="t",
                  span_id="s", name=semconv.SPAN_MODEL_CALL, start_time=0.0)  # fmt: skip
    with pytest.raises(AgentError, match="come from the gateway alone"):
        context.record(forged)
    await writer.close()  # the runner closes it when the attempt ends
    with use_context(context), pytest.raises(AgentError, match="has ended"):
        emit_reward(555.0)
    assert await store.query_spans(claimed.rollout_id) == []
    await store.close()
