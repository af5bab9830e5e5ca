"""Fixtures every test folder may ask for by name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: test processes share the machine, and oversubscribed torch threads thrash."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
