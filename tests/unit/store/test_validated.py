"""Every backend takes its public operations from the one validating layer, and writes only storage."""

from __future__ import annotations

import inspect

import pytest

from fulgor.store.base import Store
from fulgor.store.client import StoreClient
from fulgor.store.memory import MemoryStore
from fulgor.store.postgres import PostgresStore
from fulgor.store.sqlite import SqliteStore
from fulgor.store.validated import ValidatedStore

OPERATIONS = sorted(
    name for name, _ in inspect.getmembers(Store, inspect.iscoroutinefunction) if not name.startswith("_")
)


def test_the_layer_implements_every_operation_of_the_protocol() -> None:
    assert len(OPERATIONS) == 18  # the 17 operations and close
    for name in OPERATIONS:
        protocol = inspect.signature(getattr(Store, name))
        layer = inspect.signature(getattr(ValidatedStore, name))
        assert layer == protocol, name


@pytest.mark.parametrize("backend", [MemoryStore, SqliteStore, PostgresStore, StoreClient])
def test_no_backend_bypasses_the_checks(backend: type[ValidatedStore]) -> None:
    for name in OPERATIONS:
        if name != "close":
            assert getattr(backend, name) is getattr(ValidatedStore, name), f"{backend.__name__}.{name}"
