"""Fixtures that run every store test against every backend in ``storetools.BACKENDS``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from storetools import BACKENDS, Clock, FakeClock, MakeStore

from fulgor.store.base import Store


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_store(backend: str, tmp_path: Path) -> AsyncIterator[MakeStore]:
    """Open stores of the backend under test (all on one directory); closes them all at the end."""
    opened: list[Store] = []

    async def make(clock: Clock = time.time) -> Store:
        store = await BACKENDS[backend](tmp_path, clock)
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        await store.close()


@pytest.fixture
async def store(make_store: MakeStore, clock: FakeClock) -> Store:
    """A fresh store of the backend under test, on the fake ``clock``."""
    return await make_store(clock)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of the postgres backend carry the ``postgres`` marker: ``-m "not postgres"`` leaves them out."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "postgres":
            item.add_marker(pytest.mark.postgres)
