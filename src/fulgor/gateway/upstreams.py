"""UpstreamPool: picks a replica per rollout, injects the token id request, retries transient errors.

All calls of one rollout go to one replica (the rollout id hashed over the replicas), so a
multi-turn agent reuses that replica's prefix cache. A connection failure moves the call to the
next replica; a 429/502/503/504 answer is retried on the same one; both wait
``retry_backoff_seconds``, doubled after every try, up to ``max_retries`` retries. A replica that
took the request but did not answer within the read timeout is not retried anywhere
(:class:`~fulgor.gateway.errors.UpstreamTimeoutError`): it may still be generating.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import zlib
from collections.abc import Sequence
from typing import Any

from fulgor.errors import ConfigError
from fulgor.gateway.config import Upstream
from fulgor.gateway.errors import UpstreamError, UpstreamTimeoutError
from fulgor.net.http_client import HttpClient, HttpResponse, TransportError

__all__ = ["UpstreamPool", "check_upstreams", "served_model", "with_token_id_request"]

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({429, 502, 503, 504})


def with_token_id_request(request: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """A copy of the request that also asks for vLLM token ids and the sampled tokens' logprobs."""
    upstream = {**request, "return_token_ids": True}
    if endpoint == "chat":
        upstream["logprobs"] = True
    elif request.get("logprobs") is None:
        upstream["logprobs"] = 0
    return upstream


class UpstreamPool:
    def __init__(
        self,
        upstreams: Sequence[Upstream],
        client: HttpClient,
        *,
        max_retries: int = 3,
        retry_backoff_seconds: float = 0.2,
    ) -> None:
        if not upstreams:
            raise ValueError("the gateway needs at least one upstream")
        self.upstreams = tuple(upstreams)
        self._client = client
        self._max_retries = max_retries
        self._backoff = retry_backoff_seconds
        self._headers = {u.url: _headers(u) for u in self.upstreams}

    def replica_for(self, rollout_id: str) -> int:
        """The index of the rollout's replica: stable across calls and processes."""
        if len(self.upstreams) == 1:
            return 0
        return zlib.crc32(rollout_id.encode()) % len(self.upstreams)

    async def send(
        self, rollout_id: str, method: str, suffix: str, body: bytes = b""
    ) -> tuple[HttpResponse, Upstream]:
        """Send to the rollout's replica, retrying as the module docstring says."""
        index = self.replica_for(rollout_id)
        delay = self._backoff
        last_error = "no attempt made"
        for attempt in range(self._max_retries + 1):
            upstream = self.upstreams[index % len(self.upstreams)]
            key = (upstream.scheme, upstream.host, upstream.port)
            try:
                response = await self._client.request(
                    method, key, upstream.base_path + suffix, self._headers[upstream.url], body
                )
            except OSError as error:
                last_error = f"{upstream.url}: {type(error).__name__}: {error}"
                if _timed_out_after_sending(error):
                    raise UpstreamTimeoutError(
                        f"{last_error}; the call is not retried, as the engine may still be generating "
                        "(raise read_timeout_seconds for long generations)"
                    ) from None
                index += 1
            else:
                if response.status not in _RETRY_STATUSES or attempt == self._max_retries:
                    return response, upstream
                last_error = f"{upstream.url} answered {response.status}"
                await response.read()
            if attempt < self._max_retries:
                logger.warning("upstream call failed (%s); retrying in %.2fs", last_error, delay)
                await asyncio.sleep(delay)
                delay *= 2
        raise UpstreamError(
            f"no upstream answered after {self._max_retries + 1} tries (last: {last_error}); "
            "check that the engine is running at the upstream URL"
        )


def _timed_out_after_sending(error: OSError) -> bool:
    """True for a response that did not come in time, False for a connection that could not be
    made (safe to send elsewhere)."""
    return isinstance(error, TransportError) and error.timed_out and error.sent


def _headers(upstream: Upstream) -> str:
    lines = "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    if upstream.api_key:
        lines += f"Authorization: Bearer {upstream.api_key}\r\n"
    return lines


# A server that answers these to GET .../models is there (401/403: it wants a key the gateway may
# send only with calls); a 404 means this is not its OpenAI base URL.
_THERE = frozenset({200, 401, 403})


async def check_upstreams(upstreams: Sequence[Upstream], timeout_seconds: float = 5.0) -> list[Upstream]:
    """Each upstream as the gateway should call it, after asking it for ``GET {url}/models``.

    An upstream given without its ``/v1`` (``fulgor engine`` prints its root URL) that answers at
    ``{url}/v1/models`` is used at ``{url}/v1``. One that answers 404 at both is refused with a
    ConfigError that says what to pass. One that cannot be reached yet is kept, with a warning: an
    engine may start after the gateway, and calls fail (and are retried) until it answers.
    """
    client = HttpClient(connect_timeout_seconds=timeout_seconds, read_timeout_seconds=timeout_seconds)
    try:
        return [await _checked(client, upstream) for upstream in upstreams]
    finally:
        await client.close()


async def _checked(client: HttpClient, upstream: Upstream) -> Upstream:
    status = await _models_status(client, upstream)
    if status is None or status in _THERE:
        return upstream
    if status == 404 and not upstream.base_path.endswith("/v1"):
        with_v1 = dataclasses.replace(upstream, url=upstream.url.rstrip("/") + "/v1")
        if await _models_status(client, with_v1) in _THERE:
            logger.info("upstream %s serves the OpenAI API under /v1: using %s", upstream.url, with_v1.url)
            return with_v1
    if status == 404:
        raise ConfigError(
            f"upstream {upstream.url} answers 404 to GET /models (and /v1/models): it is not the base "
            "URL of an OpenAI-compatible server; pass the URL its API lives under, ending in /v1 "
            "(fulgor engine's is the URL it prints, plus /v1)"
        )
    logger.warning("upstream %s answered %d to GET /models; calls may fail", upstream.url, status)
    return upstream


async def _models_status(client: HttpClient, upstream: Upstream) -> int | None:
    """The status of ``GET {url}/models``; None when the upstream cannot be reached (warned)."""
    try:
        response = await client.request(
            "GET",
            (upstream.scheme, upstream.host, upstream.port),
            upstream.base_path + "/models",
            _headers(upstream),
        )
        await response.read()
    except OSError as error:
        logger.warning(
            "upstream %s cannot be reached yet (%s); its calls fail until it answers", upstream.url, error
        )
        return None
    return response.status


async def served_model(upstream: Upstream, timeout_seconds: float = 10.0) -> str:
    """The one model ``GET {url}/models`` lists (a vLLM server serves one); a ConfigError that says
    to name the model when it lists several or none, or cannot be asked."""
    client = HttpClient(connect_timeout_seconds=timeout_seconds, read_timeout_seconds=timeout_seconds)
    address = (upstream.scheme, upstream.host, upstream.port)
    unasked = f"cannot ask the upstream {upstream.url} which model it serves"
    try:
        response = await client.request("GET", address, upstream.base_path + "/models", _headers(upstream))
        body = await response.read()
    except OSError as error:
        raise ConfigError(f"{unasked} ({error}); start it first, or name the model with model=...") from None
    finally:
        await client.close()
    try:
        listed = json.loads(body)["data"]
        names: list[str] = [entry["id"] for entry in listed if isinstance(entry.get("id"), str)]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(
            f"{unasked}: GET /models answered {response.status} without an OpenAI model list; name "
            "the model with model=... (--upstream-model)"
        ) from None
    if len(names) != 1:
        listing = ", ".join(names[:10]) or "none"
        raise ConfigError(
            f"the upstream {upstream.url} serves {len(names)} models ({listing}); name the one the "
            "agent's calls go to with model=... (--upstream-model)"
        )
    return names[0]
