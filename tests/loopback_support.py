"""Commands run in a network namespace of their own with every connect, bind and send recorded, and
the endpoints beyond loopback read back from the record, each with the process that reached it.

``.ci/loopback-only --trace FILE COMMAND`` makes the namespace (loopback, plus 10.255.0.1 and
fd00:255::1 on the loopback device with default routes through it, so that nothing can leave) and
runs the command under strace. :func:`endpoints_beyond_loopback` reads that record: a connect, bind or send to
an address outside 127.0.0.0/8 and ::1 (the wildcard addresses included), or anything sent to port
53 (a DNS query, wherever the resolver is). The one exception is named in :data:`ROUTE_CHECKS`: a
datagram socket connected (nothing sent) to learn a route, which no switch of its program turns
off. ``python -m tests.loopback_support FILE`` prints them and exits 1 when there are any.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK_ONLY = ROOT / ".ci" / "loopback-only"
_CANNOT = 3  # .ci/loopback-only's exit status when it cannot make the namespace

_LINE = re.compile(r"^(?P<pid>\d+)(?:<(?P<comm>[^>]*)>)? (?P<call>\w+)\((?P<args>.*)$")
_INET = re.compile(
    r'sa_family=AF_INET, sin_port=htons\((?P<port>\d+)\), sin_addr=inet_addr\("(?P<host>[^"]+)"\)'
)
_INET6 = re.compile(
    r'sa_family=AF_INET6, sin6_port=htons\((?P<port>\d+)\),.*?inet_pton\(AF_INET6, "(?P<host>[^"]+)"'
)
_EXECVE = re.compile(r'^"(?P<path>[^"]*)", \[(?P<argv>[^\]]*)\]')
_PROTOCOL = re.compile(r"^\d+<(?P<protocol>TCP|UDP|TCPv6|UDPv6|UDPLITE|UDPLITEv6):")
_ADDRESSED = ("connect", "bind", "sendto", "sendmsg", "sendmmsg")
DNS_PORT = 53
ROUTE_CHECKS = {
    ("2001:4860:4860::8888", 443): "Chromium's IPv6 reachability check, at every start of its network "
    "service whatever its switches say",
}
"""Datagram sockets connected beyond loopback only to ask the kernel which route it would take:
nothing is sent (a datagram sent there with send, sendto or sendmsg is still found; write is not
recorded: the namespace keeps it in)."""


@dataclass(frozen=True)
class Endpoint:
    """One call that reached beyond loopback: the process, the call and where it went."""

    pid: int
    process: str
    call: str
    host: str
    port: int

    def __str__(self) -> str:
        what = "a DNS query to" if self.port == DNS_PORT and self.call != "bind" else f"{self.call}"
        return f"{self.process} (pid {self.pid}): {what} {self.host} port {self.port}"


def _outside(host: str) -> bool:
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_loopback


# The peer of a connected socket, as -yy shows it on its file descriptor: <UDP:[A:P->B:Q]>.
_PEER = re.compile(r"^\d+<[A-Za-z0-9]+:\[[^>]*->\[?(?P<host>[0-9A-Fa-f:.]+?)\]?:(?P<port>\d+)\]>")


def _addresses(call: str, args: str) -> list[tuple[str, int]]:
    """The addresses a call names: its socket addresses, and for a send on a connected socket (no
    address of its own) the socket's peer."""
    found = [(m["host"], int(m["port"])) for m in _INET.finditer(args)]
    found += [(m["host"], int(m["port"])) for m in _INET6.finditer(args)]
    peer = _PEER.match(args)
    if call.startswith("send") and peer is not None and not found:
        found.append((peer["host"], int(peer["port"])))
    return found


def _program(args: str) -> str | None:
    """An execve line's program, short: its arguments but the ``--flags``, paths as their last part."""
    match = _EXECVE.match(args)
    if match is None:
        return None
    argv = re.findall(r'"((?:[^"\\]|\\.)*)"', match["argv"])
    words = [arg.rsplit("/", 1)[-1] if "/" in arg and not arg.startswith("-") else arg for arg in argv]
    shown = [word if len(word) <= 40 else word[:37] + "..." for word in words if not word.startswith("--")]
    return " ".join(shown[:4]) or match["path"]


def endpoints_beyond_loopback(trace: str) -> list[Endpoint]:
    """Every connect, bind and send of a strace record (``-f -Y``) that left loopback or asked DNS,
    each named by the program its process ran (from its last execve) or else its name."""
    programs: dict[int, str] = {}
    found: list[Endpoint] = []
    for line in trace.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        pid, call, args = int(match["pid"]), match["call"], match["args"]
        if call == "execve" and "= -1" not in args:
            programs[pid] = _program(args) or programs.get(pid, "")
            continue
        if call not in _ADDRESSED:
            continue
        protocol = _PROTOCOL.match(args)
        datagram = protocol is not None and protocol["protocol"].startswith("UDP")
        for host, port in _addresses(call, args):
            dns = port == DNS_PORT and call != "bind"
            route_check = call == "connect" and datagram and (host, port) in ROUTE_CHECKS
            if (dns or _outside(host)) and not route_check:
                process = programs.get(pid) or match["comm"] or "?"
                found.append(Endpoint(pid, process, call, host, port))
    return found


def namespace_unavailable() -> str | None:
    """Why a traced loopback-only namespace cannot be made here, or None when it can."""
    command = [str(LOOPBACK_ONLY), "--trace", "/dev/null", "true"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return None
    return done.stderr.strip() or f"{LOOPBACK_ONLY} exited {done.returncode}"


def run_traced(
    command: Sequence[str], trace: Path, timeout_seconds: float, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """``command`` in a loopback-only namespace, every connect, bind and send recorded in ``trace``."""
    done = subprocess.run(
        [str(LOOPBACK_ONLY), "--trace", str(trace), *command],
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        **kwargs,  # type: ignore[call-overload]
    )
    if done.returncode == _CANNOT and not trace.exists():
        raise RuntimeError(f"no loopback-only namespace: {done.stderr.strip()}")
    return done


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.loopback_support STRACE_FILE", file=sys.stderr)
        return 2
    found = endpoints_beyond_loopback(Path(argv[0]).read_text(errors="replace"))
    for endpoint in found:
        print(endpoint)
    print(f"{len(found)} connect(s), bind(s) or send(s) beyond loopback", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
