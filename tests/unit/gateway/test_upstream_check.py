"""Upstreams are checked when the gateway starts: a root URL without /v1 is used under /v1, a URL
that is no OpenAI base URL is refused with what to pass, one not up yet is kept."""

from __future__ import annotations

import pytest

from fulgor.errors import ConfigError
from fulgor.gateway import Upstream
from fulgor.gateway.upstreams import check_upstreams
from fulgor.net.sockets import bind_socket
from fulgor.testing import ScriptedOpenAIServer


async def test_an_upstream_given_without_v1_is_used_under_it() -> None:
    async with ScriptedOpenAIServer() as server:
        url = server.url
        [checked] = await check_upstreams([Upstream(url.removesuffix("/v1"), api_key="k")])
        [as_given] = await check_upstreams([Upstream(url)])
    assert (checked.url, checked.base_path, checked.api_key) == (url, "/v1", "k")
    assert as_given.url == url


async def test_a_url_that_is_no_openai_base_url_is_refused_with_what_to_pass() -> None:
    async with ScriptedOpenAIServer() as server:
        with pytest.raises(ConfigError) as raised:
            await check_upstreams([Upstream(server.url.removesuffix("/v1") + "/api")])
    assert "answers 404 to GET /models" in raised.value.message
    assert "ending in /v1" in raised.value.message


async def test_an_upstream_not_up_yet_is_kept_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with bind_socket("127.0.0.1", 0) as sock:  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        [checked] = await check_upstreams([Upstream(url)], timeout_seconds=1)
    assert checked.url == url
    assert "cannot be reached yet" in caplog.text
