"""Shared fixtures for the engine's unit tests: one tiny model built per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: test processes share the machine, and oversubscribed torch threads thrash."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fulgor.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> Any:
    from fulgor.engine.loading import load_model

    return load_model(tiny_model_dir, device="cpu")
