"""Listening sockets: a taken port names the remedy, port 0 picks one, loopback is recognised."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from fulgor.errors import ConfigError, PortInUseError
from fulgor.net.sockets import bind_socket, is_loopback, url_of


def test_port_zero_binds_a_free_port_and_the_url_names_it() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert port > 0
        assert url_of(sock) == f"http://127.0.0.1:{port}"
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_a_taken_port_is_a_port_in_use_error_with_the_remedy() -> None:
    taken = bind_socket("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(PortInUseError) as raised:
            bind_socket("127.0.0.1", port)
        assert isinstance(raised.value, ConfigError)
        assert raised.value.code == "port_in_use"
        assert (raised.value.host, raised.value.port) == ("127.0.0.1", port)
        assert f"port {port} on 127.0.0.1" in raised.value.message
        assert "--port 0" in raised.value.message
        assert "lsof" in raised.value.message
    finally:
        taken.close()


def test_an_address_that_cannot_be_bound_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # An address of no interface of this machine: the kernel's answer, without binding beyond loopback.
    def refuse(sock: socket.socket, address: object) -> None:
        raise OSError(errno.EADDRNOTAVAIL, os.strerror(errno.EADDRNOTAVAIL))

    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(
        ConfigError, match=r"cannot listen on 192\.0\.2\.1:0: Cannot assign requested address"
    ):
        bind_socket("192.0.2.1", 0)


def test_ipv6_urls_are_bracketed() -> None:
    try:
        sock = bind_socket("::1", 0)
    except ConfigError:
        pytest.skip("no IPv6 loopback here")
    try:
        assert url_of(sock) == f"http://[::1]:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_a_port_out_of_range_is_a_config_error(port: int) -> None:
    # bind() itself raises OverflowError, which callers catching OSError or ConfigError would miss.
    with pytest.raises(ConfigError, match="0 to 65535"):
        bind_socket("127.0.0.1", port)
