"""Shared fixtures for the engine's unit tests: one tiny model built per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _single_torch_thread(one_torch_thread: None) -> None:
    """Every engine unit test runs with one torch thread (see tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fulgor.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> Any:
    from fulgor.weights.loading import load_model

    return load_model(tiny_model_dir, device="cpu")
