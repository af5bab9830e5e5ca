"""The guards that keep the tests on loopback: the audit hook of ``tests/loopback_guard.py`` fails a
test that reaches beyond loopback (even when the test swallows the error), and the strace reader of
``tests/loopback_support.py`` finds every connect, bind and DNS send beyond it, naming the process."""

from __future__ import annotations

import ast
import os
import socket
from unittest import mock
from urllib.parse import urlsplit

import pytest
from tests.loopback_guard import beyond_loopback
from tests.loopback_support import ROOT, endpoints_beyond_loopback
from tests.offline import OFFLINE_ENVIRONMENT, closed_proxies, offline_part

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("host", "beyond"),
    [
        ("127.0.0.1", False),
        ("127.0.0.2", False),
        ("::1", False),
        ("[::1]", False),
        ("::ffff:127.0.0.1", False),
        ("localhost", False),
        (None, False),
        ("", True),  # every address
        ("0.0.0.0", True),
        ("::", True),
        ("10.255.0.1", True),
        ("169.254.169.254", True),
        ("metadata.google.internal", True),  # a name: a DNS look-up
    ],
)
def test_what_is_beyond_loopback(host: str | None, beyond: bool) -> None:
    assert beyond_loopback(host) is beyond


def test_the_session_runs_offline() -> None:
    for name, value in OFFLINE_ENVIRONMENT.items():
        assert os.environ[name] == value
    # A program started with a few variables of its own keeps the switches.
    assert offline_part({"PATH": "/bin", **os.environ}) == OFFLINE_ENVIRONMENT


def test_closed_proxies_refuse_on_this_machine_and_leave_the_environment_as_it_was() -> None:
    mine = {"PATH": os.environ.get("PATH", ""), "https_proxy": "http://proxy.example:3128"}
    with mock.patch.dict(os.environ, mine, clear=True):
        with closed_proxies():
            proxy = urlsplit(os.environ["http_proxy"])
            assert (proxy.hostname, os.environ["https_proxy"]) == ("127.0.0.1", os.environ["http_proxy"])
            assert "127.0.0.1" in os.environ["no_proxy"].split(",")
            with pytest.raises(ConnectionRefusedError), socket.socket() as sock:
                sock.connect((proxy.hostname, proxy.port))
        assert os.environ["https_proxy"] == "http://proxy.example:3128"
        assert "http_proxy" not in os.environ


# Each swallows the error the guard raises: they would pass, were it not for the guard.
INNER_TESTS = """
import contextlib
import socket

def test_swallows_a_connect_beyond_loopback():
    with socket.socket() as sock, contextlib.suppress(OSError):
        sock.connect(("192.0.2.1", 9))

def test_binds_every_address():
    with socket.socket() as sock, contextlib.suppress(OSError):
        sock.bind(("0.0.0.0", 0))

def test_looks_up_a_name():
    with contextlib.suppress(OSError):
        socket.getaddrinfo("example.com", 443)

def test_stays_on_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()
"""


def test_a_test_that_reaches_beyond_loopback_fails_naming_the_address(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The inner session imports the guard from the checkout.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest(
        "from tests import loopback_guard\n\n"
        "def pytest_configure(config):\n"
        "    loopback_guard.install(config)\n"
    )
    pytester.makepyfile(test_inner=INNER_TESTS)
    # A process of its own: the audit hook, once installed, stays for the life of the process.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--rootdir={pytester.path}")
    result.assert_outcomes(passed=4, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*test_swallows_a_connect_beyond_loopback reached beyond loopback: connect to 192.0.2.1 port 9*",
            "*test_binds_every_address reached beyond loopback: bind on 0.0.0.0 port 0*",
            "*test_looks_up_a_name reached beyond loopback: getaddrinfo of 'example.com'*",
        ]
    )


TRACE = """\
100<bash> execve("/usr/bin/python3", ["python3", "/opt/app/serve.py", "--quiet"], 0x0 /* 9 vars */) = 0
100<python3> connect(3<TCP:[1]>, {sa_family=AF_INET, sin_port=htons(8000), sin_addr=inet_addr("127.0.0.1")}, 16) = 0
100<python3> bind(4<TCP:[2]>, {sa_family=AF_INET6, sin6_port=htons(0), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::", &sin6_addr), sin6_scope_id=0}, 28) = 0
100<python3> connect(5<TCP:[3]>, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("169.254.169.254")}, 16) = -1 ECONNREFUSED (Connection refused)
100<python3> connect(6<UDP:[4]>, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("127.0.0.53")}, 16) = 0
100<python3> sendmmsg(6<UDP:[127.0.0.1:5->127.0.0.53:53]>, [{msg_hdr={msg_name=NULL, msg_namelen=0}}], 1, 0) = 1
101<Chrome_ChildIOT> connect(7<UDPv6:[5]>, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2001:4860:4860::8888", &sin6_addr), sin6_scope_id=0}, 28) = 0
102<worker> connect(8<UDP:[6]>, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("8.8.8.8")}, 16) = 0
102<worker> sendto(8<UDP:[10.255.0.1:7->8.8.8.8:80]>, "x", 1, 0, NULL, 0) = 1
103<Chrome_ChildIOT> connect(9<TCPv6:[8]>, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2001:4860:4860::8888", &sin6_addr), sin6_scope_id=0}, 28) = 0
"""  # noqa: E501 (strace's lines as it writes them)


def test_the_strace_reader_finds_each_endpoint_beyond_loopback_and_its_process() -> None:
    assert [str(endpoint) for endpoint in endpoints_beyond_loopback(TRACE)] == [
        "python3 serve.py (pid 100): bind :: port 0",
        "python3 serve.py (pid 100): connect 169.254.169.254 port 80",
        "python3 serve.py (pid 100): a DNS query to 127.0.0.53 port 53",  # a resolver on loopback too
        "python3 serve.py (pid 100): a DNS query to 127.0.0.53 port 53",
        # Chromium's route check (a datagram socket connected, nothing sent) is the one exception.
        "worker (pid 102): connect 8.8.8.8 port 80",
        "worker (pid 102): sendto 8.8.8.8 port 80",  # sent on the connected socket
        "Chrome_ChildIOT (pid 103): connect 2001:4860:4860::8888 port 443",  # TCP: not a route check
    ]


def test_every_benchmark_goes_offline_first() -> None:
    scripts = sorted((ROOT / "benchmarks").glob("[!_]*.py"))
    assert len(scripts) > 10
    for script in scripts:
        tree = ast.parse(script.read_text())
        [main] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
        assert ast.unparse(main.body[0]) == "go_offline()", script.name
