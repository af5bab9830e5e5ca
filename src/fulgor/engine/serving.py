"""Running an ASGI app with uvicorn on a socket fulgor binds itself.

Binding first gives a clear error naming a port that is taken, lets ``port=0`` pick a free port whose
number is known before the server starts, and lets callers print the real URL.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
import time
from typing import Any

from fulgor.engine.errors import EngineError, PortInUseError

__all__ = ["ServerThread", "bind_socket"]

logger = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets created as TCP, and without it
    # a response written in two parts waits for the client's delayed ACK (about 40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(host, port) from exc
        raise EngineError(f"cannot listen on {host}:{port}: {exc.strerror}; check --host and --port") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """Serves an ASGI app on a background thread; ``start()`` returns once requests are served.

    Pass ``sock`` (from :func:`bind_socket`) to bind before slow setup such as loading a model.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        log_level: str = "warning",
    ) -> None:
        import uvicorn

        self._socket = sock if sock is not None else bind_socket(host, port)
        self.host = host
        self.port = int(self._socket.getsockname()[1])
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="fulgor-http", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _serve(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._socket]))
        except BaseException as exc:  # the server thread's boundary: keep the cause for start() to raise
            self._error = exc
            logger.exception("the HTTP server stopped with an error")

    def start(self, timeout_seconds: float = 60.0) -> str:
        """Start serving; returns the base URL. Raises EngineError when startup fails."""
        self._thread.start()
        deadline = time.monotonic() + timeout_seconds
        # uvicorn offers no startup event to wait on, only the ``started`` flag.
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"the server on {self.url} did not start: {self._error or 'timed out'}")
            time.sleep(0.01)
        return self.url

    def wait(self) -> None:
        """Block until the server stops."""
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def stop(self) -> None:
        """Stop serving and wait for the server thread; the app's lifespan shutdown runs."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()
        self._socket.close()

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
