"""Looking at live processes through /proc, for the tests that check nothing is left behind, and
starting them as a terminal would."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def take_sigint() -> None:
    """A ``preexec_fn`` giving the child SIGINT's default disposition, as a terminal's foreground job
    has: a background job of a non-interactive shell (the way CI often starts a suite) inherits
    SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def live_processes() -> dict[int, tuple[int, int]]:
    """Every live process (zombies left out) as pid: (parent pid, process group), read from /proc."""
    processes: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            processes[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return processes


def process_group(pgid: int) -> set[int]:
    """The live processes of process group ``pgid``."""
    return {pid for pid, (_, group) in live_processes().items() if group == pgid}


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in live_processes().items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is running (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``pid`` to end; True once it has."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def command_line(pid: int) -> str | None:
    """The process's command line, or None once it is gone."""
    try:
        return (Path(f"/proc/{pid}") / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None


def running_in(directory: Path) -> set[int]:
    """Every live process (but this one) whose current directory is ``directory``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) == directory.resolve() and alive(int(entry.name)):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def left_behind(*names: str) -> list[str]:
    """What a test that started processes left running: every live process below this one, and the
    orphans (adopted by init) whose command line holds one of ``names``, such as a tool server that
    outlived the runner that started it; other runs' processes on the machine do not count."""
    found = [f"pid {pid}: {command_line(pid)}" for pid in sorted(descendants(os.getpid()))]
    for pid, (parent, _) in live_processes().items():
        command = command_line(pid) if parent == 1 else None
        if command is not None and any(name in command for name in names):
            found.append(f"orphan {pid}: {command}")
    return found
