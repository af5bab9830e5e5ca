"""The gateway's guarantees: rollout checks, auth, pause/drain, missing ids, retries, routing,
cancellation on disconnect, backpressure from a slow store, empty bodies."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
import openai
import pytest
from gateway_support import assert_matches, gateway_env, wait_for_disconnect

from fulgor import semconv
from fulgor.credentials import attempt_credential
from fulgor.gateway import GatewayConfig
from fulgor.net.sockets import bind_socket
from fulgor.store.memory import MemoryStore
from fulgor.testing import ScriptedOpenAIServer, ScriptedReply
from fulgor.types import Attempt, Span

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_unknown_and_finished_rollouts_are_refused_with_a_clear_message(
    upstream: ScriptedOpenAIServer,
) -> None:
    async with gateway_env([upstream.url], GatewayConfig(rollout_cache_seconds=0)) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient() as http:
            unknown = await http.post(f"{env.url}/r/nope/nope/v1/chat/completions", json=CHAT)
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "rollout_not_found"
            assert "does not exist" in unknown.json()["error"]["message"]
            other = await http.post(f"{env.url}/r/{rollout.rollout_id}/other/v1/chat/completions", json=CHAT)
            assert other.status_code == 404
            await env.store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")
            finished = await http.post(f"{base_url}/chat/completions", json=CHAT)
            assert finished.status_code == 409
            assert "has ended (succeeded)" in finished.json()["error"]["message"]
            lost = await http.post(f"{env.url}/elsewhere", json=CHAT)
            assert lost.status_code == 404
    assert upstream.requests == []


async def test_the_operator_key_or_the_attempts_credential_is_required_when_set(
    upstream: ScriptedOpenAIServer,
) -> None:
    async with gateway_env([upstream.url], GatewayConfig(api_key="s3cret")) as env:
        rollout, base_url = await env.rollout()
        with pytest.raises(openai.PermissionDeniedError, match="not this attempt's credential"):
            await openai.AsyncOpenAI(base_url=base_url, api_key="wrong").chat.completions.create(**CHAT)  # type: ignore[call-overload]
        reply = await openai.AsyncOpenAI(base_url=base_url, api_key="s3cret").chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert reply.choices[0].message.content == "ok"
        credential = attempt_credential("s3cret", rollout.rollout_id, rollout.attempt.attempt_id)
        agent = openai.AsyncOpenAI(base_url=base_url, api_key=credential)
        assert (await agent.chat.completions.create(**CHAT)).choices[0].message.content == "ok"  # type: ignore[call-overload]
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{env.url}/gateway/state")).status_code == 401
            as_agent = {"Authorization": f"Bearer {credential}"}
            assert (await http.get(f"{env.url}/gateway/state", headers=as_agent)).status_code == 403
        await env.calls(rollout, 2)
    assert "s3cret" not in str(upstream.request_headers)
    assert credential not in str(upstream.request_headers)


async def test_pause_refuses_new_calls_and_drains_the_ones_in_flight() -> None:
    async with (
        ScriptedOpenAIServer(delay_seconds=0.3) as upstream,
        gateway_env([upstream.url], GatewayConfig(retry_after_seconds=3)) as env,
    ):
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient(timeout=10) as http:
            in_flight = asyncio.create_task(http.post(f"{base_url}/chat/completions", json=CHAT))
            for _ in range(500):
                if env.gateway.in_flight:
                    break
                await asyncio.sleep(0.01)
            pause = asyncio.create_task(
                http.post(f"{env.url}/gateway/pause", json={"drain_timeout_seconds": 5})
            )
            await asyncio.sleep(0.05)
            refused = await http.post(f"{base_url}/chat/completions", json=CHAT)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "3"
            assert refused.json()["error"]["code"] == "gateway_paused"
            state = (await http.get(f"{env.url}/gateway/state")).json()
            assert state["paused"] is True
            assert state["in_flight"] == 1
            drained = (await pause).json()
            assert drained["drained"] is True
            assert drained["in_flight"] == 0
            assert (await in_flight).status_code == 200
            not_a_version = await http.post(f"{env.url}/gateway/resume", json={"model_version": "v7"})
            assert not_a_version.status_code == 400
            assert "model_version must be a whole number" in not_a_version.json()["error"]["message"]
            resumed = (await http.post(f"{env.url}/gateway/resume", json={"model_version": 7})).json()
            assert resumed["paused"] is False
            assert (await http.post(f"{base_url}/chat/completions", json=CHAT)).status_code == 200
        calls = await env.calls(rollout, 2)
        assert [call.model_version for call in calls] == [None, 7]


class SlowGuardStore(MemoryStore):
    """A store that takes a while to answer the gateway's rollout check (a remote store under load)."""

    def __init__(self) -> None:
        super().__init__()
        self.checking = asyncio.Event()

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        self.checking.set()
        await asyncio.sleep(0.3)
        return await super().list_attempts(rollout_id)


async def test_a_call_still_being_checked_when_the_gateway_pauses_is_drained_and_refused(
    upstream: ScriptedOpenAIServer,
) -> None:
    store = SlowGuardStore()
    async with gateway_env([upstream.url], store=store) as env:
        _, base_url = await env.rollout()
        async with httpx.AsyncClient(timeout=10) as http:
            call = asyncio.create_task(http.post(f"{base_url}/chat/completions", json=CHAT))
            await asyncio.wait_for(store.checking.wait(), timeout=5)
            drained = (await http.post(f"{env.url}/gateway/pause", json={"drain_timeout_seconds": 5})).json()
            assert drained["drained"] is True
            refused = await call
            assert refused.status_code == 429
            assert "retry-after" in refused.headers
    assert upstream.requests == []


async def test_drain_rollouts_waits_for_a_call_still_being_checked(upstream: ScriptedOpenAIServer) -> None:
    store = SlowGuardStore()
    async with gateway_env([upstream.url], store=store) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient(timeout=10) as http:
            call = asyncio.create_task(http.post(f"{base_url}/chat/completions", json=CHAT))
            await asyncio.wait_for(store.checking.wait(), timeout=5)
            assert await env.gateway.drain_rollouts([rollout.rollout_id], timeout_seconds=5)
            await env.gateway.recorder.caught_up()
            assert len(await env.store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL)) == 1
            assert (await call).status_code == 200


async def test_an_empty_or_unfinished_body_is_a_bad_request_and_goes_nowhere(
    upstream: ScriptedOpenAIServer,
) -> None:
    async with gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient() as http:
            empty = await http.post(f"{base_url}/chat/completions", content=b"")
            assert empty.status_code == 400
            assert empty.json()["error"]["code"] == "invalid_request"
            messages = await http.post(f"{base_url}/messages", content=b"")
            assert messages.status_code == 400
            assert messages.json()["error"]["type"] == "invalid_request_error"
        # An agent that goes away before its body has arrived: nothing is forwarded or recorded.
        target = base_url.split("/", 3)[3]
        _, writer = await asyncio.open_connection("127.0.0.1", int(env.url.rsplit(":", 1)[1]))
        head = f"POST /{target}/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
        writer.write(head.encode())
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        await asyncio.sleep(0.3)
        await env.gateway.settle()
        assert await env.store.query_spans(rollout.rollout_id) == []
    assert upstream.requests == []


async def test_one_rollouts_calls_can_settle_while_anothers_stay_in_flight() -> None:
    async with (
        ScriptedOpenAIServer(delay_seconds=0.5) as upstream,
        gateway_env([upstream.url]) as env,
    ):
        done, done_url = await env.rollout()
        busy, busy_url = await env.rollout()
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.post(f"{done_url}/chat/completions", json=CHAT)).status_code == 200
            in_flight = asyncio.create_task(http.post(f"{busy_url}/chat/completions", json=CHAT))
            for _ in range(500):
                if env.gateway.in_flight:
                    break
                await asyncio.sleep(0.01)
            # The finished rollout settles at once, its call stored, though another call is running.
            assert await env.gateway.drain_rollouts([done.rollout_id], timeout_seconds=0.1) is True
            await asyncio.wait_for(env.gateway.recorder.caught_up(), timeout=2)
            assert len(await env.store.query_spans(done.rollout_id, name=semconv.SPAN_MODEL_CALL)) == 1
            assert env.gateway.in_flight == 1
            assert await env.gateway.drain_rollouts([busy.rollout_id], timeout_seconds=0.05) is False
            assert await env.gateway.drain_rollouts([busy.rollout_id, done.rollout_id], timeout_seconds=5)
            assert (await in_flight).status_code == 200
            await env.gateway.recorder.caught_up()
            assert len(await env.store.query_spans(busy.rollout_id, name=semconv.SPAN_MODEL_CALL)) == 1


async def test_calls_without_token_ids_are_flagged() -> None:
    async with (
        ScriptedOpenAIServer(supports_token_ids=False) as upstream,
        gateway_env([upstream.url]) as env,
    ):
        rollout, base_url = await env.rollout()
        reply = await openai.AsyncOpenAI(base_url=base_url, api_key="x").chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert reply.choices[0].message.content == "ok"
        [call] = await env.calls(rollout, 1)
        assert call.token_ids_missing
        assert call.prompt_token_ids is None
        assert call.response_token_ids is None
        [span] = await env.store.query_spans(rollout.rollout_id)
        assert set(span.attributes) == {semconv.ATTR_MODEL_CALL}  # the ModelCall is the one home
        assert env.gateway.state()["recorder"]["token_ids_missing"] == 1


async def test_transient_upstream_errors_are_retried(upstream: ScriptedOpenAIServer) -> None:
    upstream.fail_next(2, status=503)
    async with gateway_env([upstream.url]) as env:
        rollout, base_url = await env.rollout()
        reply = await openai.AsyncOpenAI(
            base_url=base_url, api_key="x", max_retries=0
        ).chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert reply.choices[0].message.content == "ok"
        [call] = await env.calls(rollout, 1)
        assert_matches(call, upstream.samples[0])
    assert len(upstream.requests) == 3


async def test_a_dead_replica_fails_over_and_rollouts_stick_to_one_replica() -> None:
    dead = bind_socket("127.0.0.1", 0)
    dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}/v1"
    dead.close()
    async with ScriptedOpenAIServer() as first, ScriptedOpenAIServer() as second:
        async with gateway_env([first.url, second.url]) as env:
            # Ids are random: take rollouts until both replicas have one (six at least).
            rollouts = [await env.rollout() for _ in range(6)]
            while len({env.gateway.upstreams.replica_for(r.rollout_id) for r, _ in rollouts}) < 2:
                rollouts.append(await env.rollout())
            for _, base_url in rollouts:
                client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
                for _ in range(3):
                    await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
            for rollout, _ in rollouts:
                calls = await env.calls(rollout, 3)
                assert len({call.engine_replica for call in calls}) == 1
            assert first.requests
            assert second.requests
        async with gateway_env([dead_url, first.url]) as env:
            rollout, base_url = await env.rollout()
            await openai.AsyncOpenAI(base_url=base_url, api_key="x").chat.completions.create(**CHAT)  # type: ignore[call-overload]
            [call] = await env.calls(rollout, 1)
            assert call.engine_replica == first.url


async def test_no_upstream_answering_gives_502_and_a_recorded_error() -> None:
    dead = bind_socket("127.0.0.1", 0)
    dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}/v1"
    dead.close()
    async with gateway_env([dead_url], GatewayConfig(max_retries=1, retry_backoff_seconds=0.01)) as env:
        rollout, base_url = await env.rollout()
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{base_url}/chat/completions", json=CHAT)
        assert response.status_code == 502
        assert "check that the engine is running" in response.json()["error"]["message"]
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "no upstream answered" in call.error


async def test_an_agent_that_disconnects_cancels_the_upstream_call() -> None:
    async with (
        ScriptedOpenAIServer(
            default_reply=ScriptedReply(text="x" * 200), token_delay_seconds=0.02
        ) as upstream,
        gateway_env([upstream.url]) as env,
    ):
        rollout, base_url = await env.rollout()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
        stream = await client.chat.completions.create(stream=True, **CHAT)  # type: ignore[call-overload]
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 5:
                break
        await stream.close()
        await wait_for_disconnect(upstream)
        assert upstream.disconnects == 1
        [call] = await env.calls(rollout, 1)
        assert call.error is not None
        assert "disconnected" in call.error


class SlowStore(MemoryStore):
    """A store whose writes take a while, to exercise backpressure."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        await asyncio.sleep(0.05)
        self.batches.append(len(spans))
        return await super().add_spans(spans)


async def test_a_slow_store_applies_backpressure_and_loses_nothing(upstream: ScriptedOpenAIServer) -> None:
    store = SlowStore()
    config = GatewayConfig(record_queue_size=4, record_batch_size=4)
    async with gateway_env([upstream.url], config, store=store) as env:
        rollout, base_url = await env.rollout()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
        await asyncio.gather(*(client.chat.completions.create(**CHAT) for _ in range(20)))  # type: ignore[call-overload]
        calls = await env.calls(rollout, 20)
        assert all(not call.token_ids_missing for call in calls)
        assert max(store.batches) <= 4
        assert len(store.batches) >= 5
        assert env.gateway.state()["recorder"]["spans_lost"] == 0


class HeldWritesStore(MemoryStore):
    """A store whose span writes wait until the test releases them."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()
        self.released = asyncio.Event()

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        self.writing.set()
        await self.released.wait()
        return await super().add_spans(spans)


async def test_the_agent_gets_its_answer_before_the_call_is_written(upstream: ScriptedOpenAIServer) -> None:
    store = HeldWritesStore()
    async with gateway_env([upstream.url], store=store) as env:
        rollout, base_url = await env.rollout()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        reply = await asyncio.wait_for(client.chat.completions.create(**CHAT), timeout=10)  # type: ignore[call-overload]
        assert reply.choices[0].message.content == "ok"
        await asyncio.wait_for(store.writing.wait(), timeout=10)
        assert await store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL) == []
        store.released.set()
        [call] = await env.calls(rollout, 1)
        assert_matches(call, upstream.samples[0])
