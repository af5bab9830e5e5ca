"""``python -m fulgor.engine._orphan_guard FD COMMAND...``: run COMMAND, and end it when its supervisor goes.

vLLM runs in a session of its own, so that a terminal's Ctrl+C reaches only its supervisor
(:class:`~fulgor.engine.vllm.VLLMServer`), which stops it in order. Nothing would end it, though,
if the supervisor died without stopping it (SIGKILL, an abort): it would keep its GPU memory and
its port. This guard leads that session and is COMMAND's parent; FD is the read end of a pipe whose
write end only the supervisor holds, which the kernel closes however the supervisor ends. On
end-of-file the guard sends SIGTERM to the session's process group and, if anything is left
:data:`KILL_AFTER_SECONDS` later, SIGKILL.

Signals sent to the group (the supervisor's own stop) reach COMMAND directly; the guard lets them
pass, waits for COMMAND and exits with its status (128 + N for a COMMAND ended by signal N).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

__all__ = ["KILL_AFTER_SECONDS", "command_line", "main"]

KILL_AFTER_SECONDS = 10.0


def command_line(parent_fd: int, command: list[str]) -> list[str]:
    """``command`` run under the guard, which watches ``parent_fd``."""
    return [sys.executable, "-m", __name__, str(parent_fd), *command]


def main(argv: list[str]) -> int:
    parent_fd, command = int(argv[0]), argv[1:]
    # A handler, not SIG_IGN: an ignored disposition would pass on to COMMAND through exec.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _let_pass)
    try:
        child = subprocess.Popen(command)  # the pipe stays here: COMMAND does not inherit it
    except OSError as error:
        print(f"fulgor: cannot run {command[0]!r}: {error}", file=sys.stderr, flush=True)
        return 127
    threading.Thread(target=_end_when_supervisor_gone, args=(parent_fd, child), daemon=True).start()
    code = child.wait()
    return code if code >= 0 else 128 - code


def _let_pass(signum: int, frame: FrameType | None) -> None:
    """The group's signal is COMMAND's to act on; the guard waits for COMMAND to end."""


def _end_when_supervisor_gone(parent_fd: int, child: subprocess.Popen[bytes]) -> None:
    try:
        while os.read(parent_fd, 4096):
            pass
    except OSError:
        pass
    print("fulgor: the vLLM supervisor is gone; stopping vLLM", file=sys.stderr, flush=True)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_SECONDS
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if child.poll() is None:
        os.killpg(0, signal.SIGKILL)  # the guard too


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
