"""Fixtures every test folder may ask for by name."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from tests import loopback_guard
from tests.offline import closed_proxies


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: test processes share the machine, and oversubscribed torch threads thrash."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def ray_offline() -> Iterator[None]:
    """For a module whose tests start Ray (``pytestmark = pytest.mark.usefixtures("ray_offline")``):
    closed HTTP proxies in the environment Ray's processes inherit, which stop the cloud-metadata
    probe its dashboard makes at every start, a probe no switch of Ray's turns off (tests/offline.py)."""
    with closed_proxies():
        yield


def pytest_configure(config: pytest.Config) -> None:
    """Every test stays on loopback (``tests/loopback_guard.py``), set before any test module is
    imported, so that the libraries they import and the processes they start see it too."""
    loopback_guard.install(config)


DEADLINE_ENV = "FULGOR_TEST_DEADLINE"
"""Unix time by which a run of the slow tier must end (``.ci/run`` sets it from CI's time limit)."""

_UNKNOWN_SLOW_MINUTES = 30  # pytest's per-test timeout in the slow tier


def _slow_minutes(item: pytest.Item) -> float:
    marker = item.get_closest_marker("slow")
    return 0 if marker is None else marker.kwargs.get("minutes", _UNKNOWN_SLOW_MINUTES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under a deadline, the shortest tests first, so that as many as fit run."""
    if os.environ.get(DEADLINE_ENV) is not None:
        items.sort(key=_slow_minutes)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under a deadline, a slow test starts only when the minutes it declares
    (``@pytest.mark.slow(minutes=N)``, measured on 2 cores) still fit before it; else it is skipped,
    and the skip says why, so that a run cut short is never mistaken for a complete one."""
    deadline = os.environ.get(DEADLINE_ENV)
    minutes = _slow_minutes(item)
    if deadline is None or not minutes:
        return
    left_minutes = (float(deadline) - time.time()) / 60
    if minutes > left_minutes:
        pytest.skip(
            f"NOT RUN: needs about {minutes} minutes, {left_minutes:.0f} left before {DEADLINE_ENV}; "
            f"run it with: .venv/bin/pytest -q -m slow {item.nodeid}"
        )
