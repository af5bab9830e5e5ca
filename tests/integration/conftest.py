"""Fixtures the gateway tests share: a scripted OpenAI upstream and a gateway in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from gateway_support import GatewayEnv, gateway_env

from fulgor.testing import ScriptedOpenAIServer


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedOpenAIServer]:
    async with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture
async def env(upstream: ScriptedOpenAIServer) -> AsyncIterator[GatewayEnv]:
    async with gateway_env([upstream.url]) as env:
        yield env
