"""Keeps every test on loopback: the offline environment for the session and every process it
starts, and a guard that fails a test whose process reaches beyond loopback.

The tests, their servers and everything they start may send traffic only to loopback (127.0.0.0/8
and ::1), and look up no name in DNS. Two parts keep it so:

- The switches of ``tests/offline.py``, set for the whole test session before any test module is
  imported, so that every process a test starts inherits them: each library's documented switch
  against phoning home (and, for the tests that start Ray, the ``ray_offline`` fixture's closed
  proxies, which stop the probe Ray has no switch for).
- :class:`LoopbackGuard`, a Python audit hook in the test process (``socket.connect``,
  ``socket.bind``, ``socket.sendto``, ``socket.sendmsg``, ``socket.getaddrinfo`` and the other
  look-ups): a call that would leave loopback, bind beyond it (every address included) or look up a
  name is refused with an ``OSError`` and fails the test that made it, naming the address, even
  where the code that made the call swallowed the error.

The hook sees the socket calls Python code makes in the test process only: processes the tests
start, and native code in the test process (Ray's core worker, gloo), are outside its reach;
``tests/integration/test_loopback.py`` records every connect, bind and send of ``fulgor train
--runners ray`` and Chromium with strace in a network namespace of their own, and ``.ci/run`` runs
the suites in such a namespace. A call is charged to the test that was running when it was made,
and one made by a fixture shared across tests (a module's, the session's) as it is torn down to the
next test that finishes.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tests.offline import LOOPBACK_NAMES, go_offline


def beyond_loopback(host: str | bytes | None) -> bool:
    """Whether reaching ``host`` (an address or a name) leaves loopback or asks DNS. The empty host
    and the wildcard addresses mean every address, and are beyond it too."""
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if host is None or host.lower() in LOOPBACK_NAMES:  # None: a passive look-up, no name
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0].strip("[]"))
    except ValueError:
        return True  # a name: looked up in DNS
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_loopback


_INET = (socket.AF_INET, socket.AF_INET6)
# gethostbyname_ex raises socket.gethostbyname's event too.
_LOOKUPS = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr")


def _reach(event: str, args: tuple[Any, ...]) -> str | None:
    """What a socket audit event reaches beyond loopback, as words; None when it stays on loopback."""
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
        sock, address = args[0], args[1]
        if sock.family not in _INET or not isinstance(address, tuple):
            return None
        if not beyond_loopback(address[0]):
            return None
        host = address[0] or "every address"
        verb = event.removeprefix("socket.")
        return f"{verb} {'on' if verb == 'bind' else 'to'} {host} port {address[1]}"
    if event in _LOOKUPS:
        if beyond_loopback(args[0]):
            return f"{event.removeprefix('socket.')} of {args[0]!r}"
        return None
    if event == "socket.getnameinfo" and isinstance(args[0], tuple) and beyond_loopback(args[0][0]):
        return f"getnameinfo of {args[0][0]}"
    return None


class LoopbackGuard:
    """A pytest plugin: the audit hook, and the checks that turn what it saw into failures."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not event.startswith("socket."):
            return
        reach = _reach(event, args)
        if reach is None:
            return
        with self._lock:
            self._seen.append(f"{reach} (thread {threading.current_thread().name})")
        raise OSError(errno.ENETUNREACH, f"the tests stay on loopback: {reach} refused")

    def take(self) -> list[str]:
        with self._lock:
            seen, self._seen = self._seen, []
        return seen

    @pytest.fixture(autouse=True)
    def _stays_on_loopback(self, request: pytest.FixtureRequest) -> Iterator[None]:
        """Fails the test (at teardown, so that its own fixtures' teardown counts too) when its
        process reached beyond loopback, even where the call's error was caught."""
        yield
        seen = self.take()
        if seen:
            pytest.fail(f"{request.node.nodeid} reached beyond loopback: " + "; ".join(seen), pytrace=False)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        seen = self.take()
        if seen:
            raise pytest.UsageError("collecting the tests reached beyond loopback: " + "; ".join(seen))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        seen = self.take()
        if seen:
            print("\nafter the last test, the session reached beyond loopback: " + "; ".join(seen))
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def install(config: pytest.Config) -> None:
    """Set the offline environment and register the guard (once per process: audit hooks stay)."""
    go_offline()
    guard = LoopbackGuard()
    sys.addaudithook(guard.audit)
    config.pluginmanager.register(guard, "loopback-guard")
