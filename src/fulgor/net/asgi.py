"""Running an ASGI app with uvicorn on a socket that :func:`~fulgor.net.sockets.bind_socket` bound.

Three ways, one server setup (lifespan on, no logging configuration of its own, a hook run as soon
as shutdown begins): :func:`serve_asgi` on the caller's running event loop, :class:`ServerThread` on
a thread and event loop of its own, :func:`serve_forever` in the foreground until SIGINT or SIGTERM.
It knows nothing of the apps it serves. Requires the ``server`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fulgor.errors import ConfigError
from fulgor.net.sockets import bind_socket, url_of

__all__ = ["ServerThread", "serve_asgi", "serve_forever"]

logger = logging.getLogger(__name__)

ShutdownHook = Callable[[], None]


def _server(app: Any, *, access_log: bool, on_shutdown: ShutdownHook | None) -> Any:
    """A uvicorn server for ``app`` that calls ``on_shutdown`` as soon as shutdown begins."""
    try:
        import uvicorn
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"serving needs uvicorn ({error}): pip install 'fulgor[server]'") from error

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # uvicorn takes a SIGINT that arrives while ``should_exit`` is already set as a second
            # Ctrl+C and skips the app's lifespan shutdown: run the hook without setting it first.
            if not self.should_exit and on_shutdown is not None:
                on_shutdown()
            super().handle_exit(sig, frame)

        def begin_shutdown(self) -> None:
            if on_shutdown is not None:
                on_shutdown()
            self.should_exit = True

    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=access_log,
        lifespan="on",
        timeout_keep_alive=75,
        timeout_graceful_shutdown=5,
    )
    return Server(config)


@contextlib.asynccontextmanager
async def serve_asgi(
    app: Any,
    sock: socket.socket | None = None,
    *,
    access_log: bool = False,
    on_shutdown: ShutdownHook | None = None,
) -> AsyncIterator[str]:
    """Serve ``app`` on the running event loop until the block exits; yields ``http://HOST:PORT``.

    Without ``sock``, a free port on 127.0.0.1. Sharing the caller's loop lets the app share
    in-process objects (a MemoryStore) with the caller; blocking clients must then run in a thread.
    The socket is closed on exit.
    """
    sock = sock if sock is not None else bind_socket("127.0.0.1", 0)
    server = _server(app, access_log=access_log, on_shutdown=on_shutdown)
    task = asyncio.get_running_loop().create_task(_serve(server, sock))
    try:
        # uvicorn offers no startup event to wait on, only the ``started`` flag.
        while not server.started:
            if task.done():
                task.result()
                raise ConfigError(f"the server on {url_of(sock)} did not start; see the log for why")
            await asyncio.sleep(0.002)
        yield url_of(sock)
    finally:
        server.begin_shutdown()
        await asyncio.wait([task])
        sock.close()
    task.result()  # a failure while serving surfaces here


async def _serve(server: Any, sock: socket.socket) -> None:
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exited:  # uvicorn exits the process when the app's startup fails
        raise ConfigError(
            f"the server on {url_of(sock)} did not start (exit status {exited.code}); see the log for why"
        ) from None


class ServerThread:
    """Serves an ASGI app on its own thread and event loop, e.g. inside a trainer, a CLI or a test.

    ``start()`` returns the URL once requests are served; ``stop()`` shuts down (``on_shutdown``
    first, then the app's lifespan shutdown) and releases the port. Pass ``sock`` (from
    :func:`~fulgor.net.sockets.bind_socket`) to bind before slow setup such as loading a model.
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        sock: socket.socket | None = None,
        access_log: bool = False,
        on_shutdown: ShutdownHook | None = None,
    ) -> None:
        self.app = app
        self._sock = sock if sock is not None else bind_socket(host, port)
        self.url = url_of(self._sock)
        self._options: dict[str, Any] = {"access_log": access_log, "on_shutdown": on_shutdown}
        self._thread = threading.Thread(target=self._run, name="fulgor-server", daemon=True)
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # the server thread's boundary: keep the cause for start() to raise
            self._error = error
            logger.exception("the server on %s stopped with an error", self.url)
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        async with serve_asgi(self.app, self._sock, **self._options):
            self._started.set()
            await self._stopping.wait()

    def start(self, timeout_seconds: float = 60.0) -> str:
        """Start serving; returns the base URL. Raises ConfigError when the server does not start."""
        self._thread.start()
        if not self._started.wait(timeout_seconds) or self._error is not None:
            self.stop()
            raise ConfigError(
                f"the server on {self.url} did not start: {self._error or 'timed out'}; see the log for why"
            )
        return self.url

    @property
    def running(self) -> bool:
        """Whether the server thread runs (started, and not stopped or ended by an error)."""
        return self._thread.is_alive()

    def wait(self) -> None:
        """Block until the server stops."""
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def stop(self) -> None:
        """Stop serving and wait for the server thread; the port is released."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._sock.close()

    async def astop(self) -> None:
        """:meth:`stop` without blocking the caller's event loop."""
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_forever(
    app: Any, sock: socket.socket, *, access_log: bool = False, on_shutdown: ShutdownHook | None = None
) -> None:
    """Serve in the foreground until SIGINT or SIGTERM, then shut down cleanly and close ``sock``.

    Raises ConfigError when the app's startup fails (uvicorn logs why and would exit the process).
    """
    server = _server(app, access_log=access_log, on_shutdown=on_shutdown)
    url = url_of(sock)
    # uvicorn re-raises the signal after a graceful shutdown; quiet handlers make that a normal return.
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    except SystemExit as exited:  # uvicorn exits the process when the app's startup fails
        raise ConfigError(
            f"the server on {url} did not start (exit status {exited.code}); the log above says why"
        ) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


def _ignore(sig: int, frame: Any) -> None:
    logger.debug("signal %s after shutdown ignored", sig)
