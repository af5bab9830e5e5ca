"""``POST /v1/rewards/{rollout}/{attempt}/{credential}``: a program with no runner beside it (a
Kubernetes Job's pod) posts its reward with its attempt's credential in the URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.unit.server.served import TOKEN, claimed, served_store

from fulgor import semconv
from fulgor.credentials import attempt_credential
from fulgor.server import BackgroundServer, ServerConfig, create_app
from fulgor.store import SyncStore
from fulgor.store.sqlite import SqliteStore
from fulgor.types import AttemptedRollout


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, SyncStore]]:
    with served_store(tmp_path) as served:
        yield served


def reward_url(url: str, attempt: AttemptedRollout, key: str = TOKEN) -> str:
    ids = (attempt.rollout_id, attempt.attempt.attempt_id)
    return f"{url}/v1/rewards/{ids[0]}/{ids[1]}/{attempt_credential(key, *ids)}"


def test_a_reward_posted_with_the_attempts_credential_is_its_reward_span(
    served: tuple[str, SyncStore],
) -> None:
    url, store = served
    attempt = claimed(store)
    body = {"values": {"f1": 0.5, "exact": 1.0}, "primary": "exact", "feedback": "expected 4"}
    answer = httpx.post(reward_url(url, attempt), json=body)
    assert answer.status_code == 200
    assert answer.json() == {"value": 1.0, "primary": "exact"}
    [span] = list(store.query_spans(attempt.rollout_id))
    assert span.name == semconv.SPAN_REWARD
    assert span.attempt_id == attempt.attempt.attempt_id
    assert span.attributes[semconv.ATTR_REWARD_VALUE] == 1.0
    assert span.attributes[semconv.ATTR_REWARD_FEEDBACK] == "expected 4"


def test_another_attempts_credential_a_bad_body_and_an_ended_attempt_are_refused(
    served: tuple[str, SyncStore],
) -> None:
    url, store = served
    first, second = claimed(store), claimed(store)
    wrong = reward_url(url, first).rsplit("/", 1)[0] + "/" + reward_url(url, second).rsplit("/", 1)[1]
    refused = httpx.post(wrong, json={"value": 1.0})
    assert refused.status_code == 403
    assert "post to the URL you were handed" in refused.json()["error"]["message"]
    bad = httpx.post(reward_url(url, first), content=b"1.0")
    assert bad.status_code == 400
    assert '{"value": 1.0}' in bad.json()["error"]["message"]
    not_finite = httpx.post(reward_url(url, first), json={"value": "high"})
    assert not_finite.status_code == 400
    store.update_attempt(first.rollout_id, first.attempt.attempt_id, status="succeeded")
    ended = httpx.post(reward_url(url, first), json={"value": 1.0})
    assert ended.status_code == 409
    assert "has ended" in ended.json()["error"]["message"]
    assert list(store.query_spans(first.rollout_id)) == []


def test_a_server_without_an_operator_key_serves_no_reward_route(tmp_path: Path) -> None:
    config = ServerConfig(store=SqliteStore(tmp_path / "s.sqlite"))
    with BackgroundServer(create_app(config)) as server:
        answer = httpx.post(f"{server.url}/v1/rewards/ro-1/at-1/fulgor-attempt-x", json={"value": 1.0})
    assert answer.status_code == 404
