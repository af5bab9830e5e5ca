"""``fulgor serve --upstream``: the store and the gateway in one process, one key for both."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from fulgor import semconv
from fulgor.store import SqliteStore, SyncStore
from fulgor.store.client import StoreClient
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply
from fulgor.types import ModelCall, RolloutRequest

TOKEN = "run-key-123"


@pytest.fixture
def upstream() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default_reply=ScriptedReply(text="42")) as server:
        yield server


@contextlib.contextmanager
def serving(tmp_path: Path, upstreams: list[str], token: str | None = None) -> Iterator[str]:
    """``fulgor serve --upstream ...`` on a free port, its URL; SIGTERM on leaving (a clean exit)."""
    command = [sys.executable, "-m", "fulgor.cli.main", "serve", "--port", "0"]
    command += ["--store", f"sqlite:///{tmp_path}/store.sqlite"]
    for url in upstreams:
        command += ["--upstream", url]
    env = {key: value for key, value in os.environ.items() if key != "FULGOR_TOKEN"}
    if token is not None:
        env["FULGOR_TOKEN"] = token
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://"), process.stderr.read() if process.stderr else ""
        yield url
    finally:
        process.send_signal(signal.SIGTERM)  # the gateway writes the calls it still holds, then stops
        assert process.wait(timeout=15) == 0


@pytest.fixture
def serve(tmp_path: Path, upstream: ScriptedOpenAIServer) -> Iterator[str]:
    with serving(tmp_path, [upstream.url], TOKEN) as url:
        yield url


def test_one_process_serves_the_store_and_records_calls_through_the_gateway(
    serve: str, upstream: ScriptedOpenAIServer
) -> None:
    with SyncStore(StoreClient(serve, token=TOKEN)) as store:
        [rollout] = store.enqueue([RolloutRequest(input={"q": 1})])
        [claimed] = store.claim("w1")
        base = f"{serve}/r/{claimed.rollout_id}/{claimed.attempt.attempt_id}"

        chat = openai.OpenAI(base_url=f"{base}/v1", api_key=TOKEN)
        reply = chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "6*7?"}])
        assert reply.choices[0].message.content == "42"
        message = anthropic.Anthropic(base_url=base, api_key=TOKEN).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "6*7?"}]
        )
        assert message.content[0].text == "42"  # type: ignore[union-attr]
        with pytest.raises(openai.PermissionDeniedError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong").models.list()

        store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
        spans = store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL)
    calls = [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]
    assert len(calls) == 2
    for call, sample in zip(calls, upstream.samples, strict=True):
        assert call.prompt_token_ids == sample.prompt_token_ids
        assert call.response_token_ids == sample.token_ids
        assert call.response_logprobs == pytest.approx(sample.logprobs)


def test_the_store_api_still_needs_the_key(serve: str) -> None:
    from fulgor.errors import FulgorError

    with SyncStore(StoreClient(serve, token="wrong")) as store, pytest.raises(FulgorError):
        store.stats()


def test_each_upstream_given_is_a_replica_the_gateway_fails_over_to(
    tmp_path: Path, upstream: ScriptedOpenAIServer
) -> None:
    with socket.socket() as probe:  # a port nothing listens on: a replica that is down
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    with serving(tmp_path, [dead, upstream.url]) as url:
        assert httpx.get(f"{url}/gateway/state").json()["upstreams"] == [dead, upstream.url]
        with SyncStore(StoreClient(url)) as store:
            rollouts = [store.start_rollout(RolloutRequest(input=i), "w1") for i in range(4)]
        for rollout in rollouts:
            base = f"{url}/r/{rollout.rollout_id}/{rollout.attempt.attempt_id}/v1"
            chat = openai.OpenAI(base_url=base, api_key="-", max_retries=0)
            reply = chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "6*7?"}])
            assert reply.choices[0].message.content == "42"
    with SyncStore(SqliteStore(tmp_path / "store.sqlite")) as store:
        spans = [s for r in rollouts for s in store.query_spans(r.rollout_id, name=semconv.SPAN_MODEL_CALL)]
    calls = [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]
    assert [call.engine_replica for call in calls] == [upstream.url] * 4


def test_an_upstream_given_as_its_root_url_is_used_under_v1(
    tmp_path: Path, upstream: ScriptedOpenAIServer
) -> None:
    root = upstream.url.removesuffix("/v1")  # what `fulgor engine` prints
    with serving(tmp_path, [root]) as url:
        assert httpx.get(f"{url}/gateway/state").json()["upstreams"] == [upstream.url]
        with SyncStore(StoreClient(url)) as store:
            rollout = store.start_rollout(RolloutRequest(input=1), "w1")
        base = f"{url}/r/{rollout.rollout_id}/{rollout.attempt.attempt_id}/v1"
        reply = openai.OpenAI(base_url=base, api_key="-").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "6*7?"}]
        )
        assert reply.choices[0].message.content == "42"


def test_an_upstream_url_that_is_no_openai_base_url_is_one_error_line(
    tmp_path: Path, upstream: ScriptedOpenAIServer
) -> None:
    wrong = upstream.url.removesuffix("/v1") + "/openai"
    command = [sys.executable, "-m", "fulgor.cli.main", "serve", "--port", "0"]
    command += ["--store", f"sqlite:///{tmp_path}/store.sqlite", "--upstream", wrong]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"upstream {wrong} answers 404 to GET /models" in error
    assert "ending in /v1" in error
    assert "Traceback" not in result.stderr
