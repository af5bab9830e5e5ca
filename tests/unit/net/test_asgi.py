"""Serving an ASGI app: on the running loop, on a thread (start/stop, the shutdown hook), start failures."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import httpx
import pytest

from fulgor.errors import ConfigError
from fulgor.net.asgi import ServerThread, serve_asgi, serve_forever
from fulgor.net.sockets import bind_socket, url_of


class App:
    """A tiny ASGI app that answers ``ok`` and records its lifespan events."""

    def __init__(self, *, fail_startup: bool = False) -> None:
        self.events: list[str] = []
        self.fail_startup = fail_startup

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    if self.fail_startup:
                        await send({"type": "lifespan.startup.failed", "message": "no"})
                        return
                    self.events.append("startup")
                    await send({"type": "lifespan.startup.complete"})
                else:
                    self.events.append("shutdown")
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"ok"})


def port_is_free(port: int) -> bool:
    with contextlib.closing(socket.socket()) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_serve_asgi_serves_on_the_running_loop_and_runs_the_lifespan() -> None:
    app = App()
    async with serve_asgi(app) as url, httpx.AsyncClient() as http:
        assert (await http.get(f"{url}/")).text == "ok"
        assert app.events == ["startup"]
    assert app.events == ["startup", "shutdown"]
    assert port_is_free(int(url.rsplit(":", 1)[1]))


async def test_serve_asgi_raises_when_the_app_does_not_start() -> None:
    with pytest.raises(ConfigError, match="did not start"):
        async with serve_asgi(App(fail_startup=True)):
            pass


def test_server_thread_serves_until_stopped_and_frees_the_port() -> None:
    app = App()
    shutdowns: list[str] = []
    server = ServerThread(app, on_shutdown=lambda: shutdowns.append("begun"))
    url = server.start()
    assert url == server.url
    assert httpx.get(f"{url}/").text == "ok"
    server.stop()
    assert shutdowns == ["begun"]
    assert app.events == ["startup", "shutdown"]
    assert port_is_free(int(url.rsplit(":", 1)[1]))


def test_server_thread_on_a_socket_bound_first() -> None:
    sock = bind_socket("127.0.0.1", 0)
    with ServerThread(App(), sock=sock) as server:
        assert server.url.endswith(f":{sock.getsockname()[1]}")
        assert httpx.get(server.url).status_code == 200


def test_server_thread_start_fails_clearly() -> None:
    server = ServerThread(App(fail_startup=True))
    with pytest.raises(ConfigError, match="did not start"):
        server.start(timeout_seconds=10)


async def test_astop_stops_from_a_running_loop() -> None:
    server = ServerThread(App())
    url = await asyncio.to_thread(server.start)
    await server.astop()
    assert port_is_free(int(url.rsplit(":", 1)[1]))


def test_serve_forever_raises_when_the_apps_startup_fails() -> None:
    """uvicorn returns without serving when the lifespan's startup fails: that is no clean exit."""
    sock = bind_socket("127.0.0.1", 0)
    url = url_of(sock)
    with pytest.raises(ConfigError, match=f"the server on {url} did not start"):
        serve_forever(App(fail_startup=True), sock)
