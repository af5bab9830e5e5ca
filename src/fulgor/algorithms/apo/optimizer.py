"""The optimiser's calls (critic and editor), recorded in the run's store like every model call.

:class:`OptimizerCalls` serves a gateway of the run's store on loopback for each distinct endpoint
(any OpenAI-compatible server: a hosted API with its key, a vLLM server, fulgor's engine; asked
for no token ids) and sends each critic or editor request there as a rollout of its own
(``metadata["apo"]`` names the role, the step and the candidate), so that its request and answer
are spans like the agent's calls, shown by every view of the store. A call that fails (an error
status, a refused connection) or takes longer than ``timeout_seconds`` is retried ``retries``
times, each try a rollout marked failed with the reason; a call that fails every try answers None
and is counted in ``failures``, and the caller goes on without it. After such a failure the
endpoint counts as down: further calls answer None at once, without trying, until ``reset``
(the search calls it at each step's start), so that a step ends with the candidates it has.

What it does not know: what is asked, or what the answers are for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fulgor.credentials import new_operator_key
from fulgor.errors import ConfigError
from fulgor.net.http_client import HttpClient, split_url
from fulgor.runner.worker import gateway_base_url
from fulgor.store.base import Store
from fulgor.types import LLM, JsonDict, RolloutConfig, RolloutRequest

__all__ = ["OptimizerCalls", "Role"]

logger = logging.getLogger(__name__)

Role = Literal["critic", "editor"]
_WORKER_ID = "apo-optimizer"
_BACKOFF_SECONDS = 0.5


@dataclass
class OptimizerCalls:
    """Critic and editor calls through recording gateways; see the module docstring."""

    store: Store
    models: dict[Role, LLM]
    temperature: float | None = 1.0
    retries: int = 2
    timeout_seconds: float = 120.0
    calls: int = 0
    failures: int = 0
    down: bool = False
    _gateways: dict[Role, tuple[Any, str]] = field(default_factory=dict)
    _resources: dict[Role, str] = field(default_factory=dict)
    _client: HttpClient | None = None
    _key: str = field(default_factory=new_operator_key)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[OptimizerCalls]:
        """Serve one gateway per distinct endpoint while the block runs; stopped on leaving."""
        from fulgor.gateway import GatewayConfig, Upstream, create_gateway_app
        from fulgor.net.asgi import serve_asgi

        async with contextlib.AsyncExitStack() as stack:
            self._client = HttpClient(read_timeout_seconds=self.timeout_seconds)
            stack.push_async_callback(self._client.close)
            served: dict[tuple[str, str | None], tuple[Any, str]] = {}
            for role, llm in self.models.items():
                where = (llm.endpoint, llm.api_key)
                if where not in served:
                    upstream = Upstream(llm.endpoint, api_key=llm.api_key, request_token_ids=False)
                    # Retries are this class's (each try a rollout of its own), not the gateway's.
                    config = GatewayConfig(
                        api_key=self._key, max_retries=0, read_timeout_seconds=self.timeout_seconds
                    )
                    gateway = create_gateway_app(self.store, [upstream], config)
                    served[where] = (gateway, await stack.enter_async_context(serve_asgi(gateway)))
                self._gateways[role] = served[where]
                self._resources[role] = (await self.store.put_resources({"llm": llm})).resources_id
            yield self

    async def ask(
        self, role: Role, messages: list[dict[str, str]], metadata: JsonDict
    ) -> tuple[str | None, int]:
        """The text the ``role`` model answers to ``messages`` (None when every try failed), and
        how many tries it took."""
        if self.down:
            return None, 0
        for attempt in range(1, self.retries + 2):
            self.calls += 1
            text, error = await self._try(role, messages, {**metadata, "apo": role, "try": attempt})
            if error is None:
                return text, attempt
            logger.warning("%s call failed (try %d of %d): %s", role, attempt, self.retries + 1, error)
            if attempt <= self.retries:
                await asyncio.sleep(_BACKOFF_SECONDS * attempt)
        self.failures += 1
        self.down = True
        return None, self.retries + 1

    def reset(self) -> None:
        """Try the endpoints again (after a call failed every try)."""
        self.down = False

    async def _try(
        self, role: Role, messages: list[dict[str, str]], metadata: JsonDict
    ) -> tuple[str, str | None]:
        if self._client is None:
            raise ConfigError("OptimizerCalls.ask runs inside `async with calls.serving()`")
        gateway, url = self._gateways[role]
        request = RolloutRequest(
            input={"role": role, "messages": messages},
            mode="train",
            resources_id=self._resources[role],
            metadata=metadata,
            # One attempt: a failed try ends its rollout (a retry is a new one), never requeued.
            config=RolloutConfig(timeout_seconds=self.timeout_seconds * 2, max_attempts=1),
        )
        started = await self.store.start_rollout(request, _WORKER_ID)
        rollout_id, attempt_id = started.rollout_id, started.attempt.attempt_id
        body: JsonDict = {"model": self.models[role].model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        text, error = await self._post(gateway_base_url(url, rollout_id, attempt_id), body)
        await gateway.settle([rollout_id], self.timeout_seconds)
        if error is None:
            await self.store.update_attempt(rollout_id, attempt_id, status="succeeded")
        else:
            await self.store.update_attempt(rollout_id, attempt_id, status="failed", error=error)
        return text, error

    async def _post(self, base_url: str, body: JsonDict) -> tuple[str, str | None]:
        assert self._client is not None
        origin, path = split_url(base_url)
        headers = f"Authorization: Bearer {self._key}\r\nContent-Type: application/json\r\n"
        try:
            async with asyncio.timeout(self.timeout_seconds):
                response = await self._client.request(
                    "POST", origin, path + "/chat/completions", headers, json.dumps(body).encode()
                )
                raw = await response.read()
        except (OSError, TimeoutError) as error:
            return "", f"no answer within {self.timeout_seconds:g}s ({error or type(error).__name__})"
        try:
            answer = json.loads(raw)
        except ValueError:
            return "", f"HTTP {response.status}, not JSON: {raw[:200]!r}"
        if response.status != 200:
            message = answer.get("error", {}).get("message") if isinstance(answer, dict) else None
            return "", f"HTTP {response.status}: {message or raw[:200]!r}"
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return "", "the answer holds no choices[0].message.content"
        if not isinstance(content, str) or not content.strip():
            return "", "the answer's message has no text"
        return content, None
