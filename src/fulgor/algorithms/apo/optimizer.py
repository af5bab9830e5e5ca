"""The optimiser's calls (critic and editor), recorded in the run's store like every model call.

:class:`OptimizerCalls` sends each critic or editor request (to any OpenAI-compatible server: a
hosted API with its key, a vLLM server, fulgor's engine; asked for no token ids) through a
recording gateway the session serves in front of that model, as a rollout of its own
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
import json
import logging
from dataclasses import dataclass, field
from typing import Literal

from fulgor.algorithms.base import RecordingGateway, RolloutSession
from fulgor.net.http_client import HttpClient, split_url
from fulgor.types import LLM, JsonDict, RolloutConfig, RolloutRequest

__all__ = ["OptimizerCalls", "Role"]

logger = logging.getLogger(__name__)

Role = Literal["critic", "editor"]
_WORKER_ID = "apo-optimizer"
_BACKOFF_SECONDS = 0.5


@dataclass
class OptimizerCalls:
    """Critic and editor calls through recording gateways; see the module docstring."""

    session: RolloutSession
    models: dict[Role, LLM]
    temperature: float | None = 1.0
    retries: int = 2
    timeout_seconds: float = 120.0
    calls: int = 0
    failures: int = 0
    down: bool = False
    _gateways: dict[Role, RecordingGateway] = field(default_factory=dict)
    _resources: dict[Role, str] = field(default_factory=dict)
    _client: HttpClient | None = None

    async def start(self) -> None:
        """The gateways and resources of each role (once); ``close`` ends the HTTP client."""
        self._client = HttpClient(read_timeout_seconds=self.timeout_seconds)
        for role, llm in self.models.items():
            self._gateways[role] = await self.session.gateway_to(llm, timeout_seconds=self.timeout_seconds)
            self._resources[role] = (await self.session.store.put_resources({"llm": llm})).resources_id

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

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
        assert self._client is not None, "start() runs first"
        gateway = self._gateways[role]
        request = RolloutRequest(
            input={"role": role, "messages": messages},
            mode="train",
            resources_id=self._resources[role],
            metadata=metadata,
            # One attempt: a failed try ends its rollout (a retry is a new one), never requeued.
            config=RolloutConfig(timeout_seconds=self.timeout_seconds * 2, max_attempts=1),
        )
        store = self.session.store
        started = await store.start_rollout(request, _WORKER_ID)
        rollout_id, attempt_id = started.rollout_id, started.attempt.attempt_id
        body: JsonDict = {"model": self.models[role].model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        text, error = await self._post(gateway.base_url(rollout_id, attempt_id), gateway.api_key, body)
        await gateway.settle(rollout_id)
        if error is None:
            await store.update_attempt(rollout_id, attempt_id, status="succeeded")
        else:
            await store.update_attempt(rollout_id, attempt_id, status="failed", error=error)
        return text, error

    async def _post(self, base_url: str, api_key: str, body: JsonDict) -> tuple[str, str | None]:
        assert self._client is not None
        origin, path = split_url(base_url)
        headers = f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
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
