"""Listening sockets for the gateway's server (``fulgor gateway``, tests, benchmarks)."""

from __future__ import annotations

import socket

__all__ = ["bind_socket"]


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (``port=0`` picks a free one).

    It is made with ``IPPROTO_TCP``, not 0: asyncio sets TCP_NODELAY only on sockets that say they
    are TCP, and without it a response written in two parts (uvicorn writes the head, then the
    body) waits for the client's delayed ACK, about 40 ms per call.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
