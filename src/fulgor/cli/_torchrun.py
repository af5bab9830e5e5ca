"""``python -m fulgor.cli._torchrun FD ARGS...``: torchrun (``torch.distributed.run``) with ARGS, for
``fulgor train --nproc N``, stopped when the command that started it goes.

The launcher starts this process in a session of its own and keeps the write end of a pipe whose
read end is FD; the kernel closes the write end however the launcher ends (SIGKILL included). On
end-of-file this process sends itself SIGTERM, which torchrun's own handler turns into stopping its
ranks (SIGTERM, then SIGKILL after its shutdown timeout). Signals the launcher forwards (its Ctrl+C)
reach torchrun the same way. Either ends this process with 128 + the signal's number, without
torchrun's traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["command_line", "main"]


def command_line(parent_fd: int, torchrun_args: list[str]) -> list[str]:
    """torchrun with ``torchrun_args``, watching ``parent_fd``."""
    return [sys.executable, "-m", __name__, str(parent_fd), *torchrun_args]


def main(argv: list[str]) -> int:
    parent_fd, torchrun_args = int(argv[0]), argv[1:]
    threading.Thread(target=_stop_when_launcher_gone, args=(parent_fd,), daemon=True).start()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(torchrun_args)
    except SignalException as stopped:  # the ranks were stopped; each said what it had to
        return 128 + int(stopped.sigval)
    return 0


def _stop_when_launcher_gone(parent_fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(parent_fd, 4096):
            pass
    print("fulgor: the fulgor train --nproc command is gone; stopping its ranks", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
