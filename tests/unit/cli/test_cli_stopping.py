"""``fulgor train``'s stop on a signal: SIGINT and SIGTERM each raise KeyboardInterrupt."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fulgor.cli._stopping import interrupts


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_raises_keyboard_interrupt_each_time_and_the_handlers_come_back(sig: int) -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job inherits it
    term = signal.getsignal(signal.SIGTERM)
    try:
        with interrupts():
            for _ in range(2):  # a second Ctrl+C interrupts the orderly stop the first began
                threading.Timer(0.1, os.kill, (os.getpid(), sig)).start()
                with pytest.raises(KeyboardInterrupt):
                    time.sleep(5)  # the handler raises as soon as the signal lands
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is term
    finally:
        signal.signal(signal.SIGINT, previous)


def test_off_the_main_thread_nothing_changes() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def inside() -> None:
        with interrupts():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=inside)
    thread.start()
    thread.join()
    assert seen == [before]
