"""Rewards from programs that run away from any runner: ``POST /v1/rewards/{rollout}/{attempt}/{credential}``.

A :class:`~fulgor.runner.SubprocessAgent`'s program posts its reward to an endpoint inside its
runner's process. A program that runs with no runner beside it (a Kubernetes Job's pod, see
:mod:`fulgor.runner.kubernetes_jobs`) posts it here instead: the URL carries its attempt's
credential (:mod:`fulgor.credentials`), as the runner's carries an unguessable token, so that
``curl -d '{"value": 1.0}' $FULGOR_REWARD_URL`` needs no header. The body and answers are the
runner endpoint's: ``{"value": 1.0}`` or ``{"values": {...}, "primary": "..."}``, either with
``"feedback"``; 400 for another body, 403 for a credential that is not the attempt's, 409 once the
attempt has ended. The reward is written as the rollout's ``fulgor.reward`` span. Served only by a
server with an operator key (no credential can be checked without one).
"""

from __future__ import annotations

import json

from fulgor.agent.context import AgentError, RolloutContext, use_context
from fulgor.agent.emit import emit_reward
from fulgor.credentials import is_attempt_credential
from fulgor.errors import NotFoundError
from fulgor.server.http import (
    Answer,
    AttemptEndedError,
    ForbiddenError,
    Receive,
    Scope,
    error_answer,
    read_body,
)
from fulgor.server.routing import Route
from fulgor.store.base import Store
from fulgor.store.writer import SpanWriter

__all__ = ["REWARD_PATH", "reward_route"]

REWARD_PATH = "/v1/rewards/{rollout_id}/{attempt_id}/{credential}"
_BODY_LIMIT_BYTES = 64 * 1024
_HOW = 'send JSON like {"value": 1.0} or {"values": {...}, "primary": "..."}'


def reward_route(store: Store, operator_key: str) -> Route:
    """The route that takes an attempt's reward with its credential in the URL."""

    async def post_reward(scope: Scope, receive: Receive, params: dict[str, str]) -> Answer:
        rollout_id, attempt_id = params["rollout_id"], params["attempt_id"]
        if not is_attempt_credential(operator_key, rollout_id, attempt_id, params["credential"].encode()):
            raise ForbiddenError(
                "this reward URL's credential is not its attempt's: post to the URL you were handed"
            )
        await _check_live(store, rollout_id, attempt_id)
        body = await read_body(receive, _BODY_LIMIT_BYTES)
        try:
            data = json.loads(body)
            value = data["values"] if "values" in data else data["value"]
            primary, feedback = data.get("primary"), data.get("feedback")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return error_answer(400, "validation_error", _HOW)
        writer = SpanWriter(store)
        writer.start()
        try:
            with use_context(RolloutContext(rollout_id=rollout_id, attempt_id=attempt_id, writer=writer)):
                reward = emit_reward(value, primary=primary, feedback=feedback)
        except AgentError as error:
            return error_answer(400, "validation_error", error.message)
        finally:
            await writer.close()
        if writer.lost_for(rollout_id):
            return error_answer(503, "store_unavailable", "the reward could not be stored; post it again")
        return Answer(200, json.dumps({"value": reward.value, "primary": reward.primary}).encode())

    return Route("POST", REWARD_PATH, post_reward, open=True)


async def _check_live(store: Store, rollout_id: str, attempt_id: str) -> None:
    try:
        attempts = await store.list_attempts(rollout_id)
    except NotFoundError:
        raise AttemptEndedError("this reward URL's rollout is not in the store") from None
    if not any(a.attempt_id == attempt_id and a.is_live for a in attempts):
        raise AttemptEndedError("this attempt has ended; it takes no more rewards")
