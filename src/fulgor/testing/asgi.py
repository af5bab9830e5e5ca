"""Serve an ASGI app with uvicorn on the running event loop, on loopback and an ephemeral port.

``async with serve_asgi(app) as url:`` starts the server on the caller's loop (so the app can share
in-process objects such as a MemoryStore with the test) and stops it on exit. Blocking clients
(the OpenAI SDK's sync client, curl) must then run in a thread: ``await asyncio.to_thread(...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fulgor.gateway.serving import bind_socket

__all__ = ["serve_asgi"]


@contextlib.asynccontextmanager
async def serve_asgi(app: Any, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run ``app`` until the block exits; yields ``http://HOST:PORT``."""
    import uvicorn

    sock = bind_socket(host, port)
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        bound_port = sock.getsockname()[1]
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
