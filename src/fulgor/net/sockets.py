"""Listening sockets: binding one with a clear error, its URL, and whether an address is loopback.

Every fulgor server binds its socket itself before serving: a taken port fails at once with a
:class:`~fulgor.errors.PortInUseError` that names the remedy, ``port=0`` picks a free port whose
number is known before the server starts, and the CLIs can print the real URL.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from fulgor.errors import ConfigError, PortInUseError

__all__ = ["bind_socket", "is_loopback", "url_of"]


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one); PortInUseError when it is taken."""
    if not 0 <= port <= 65535:  # bind() raises OverflowError, not OSError, for these
        raise ConfigError(f"port {port} is out of range: use 0 to 65535 (0 picks a free one)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets created as TCP, and without it
    # a response written in two parts (uvicorn writes the head, then the body) waits for the client's
    # delayed ACK, about 40 ms per call.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortInUseError(host, port) from None
        raise ConfigError(
            f"cannot listen on {host}:{port}: {error.strerror}; check --host and --port"
        ) from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket, with the real port."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
