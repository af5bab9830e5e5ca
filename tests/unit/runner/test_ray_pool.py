"""The Ray pool's parts that need no Ray cluster (tests/integration/test_runner_ray.py runs one)."""

from __future__ import annotations

import pytest

from fulgor.errors import ConfigError
from fulgor.runner.pool import PoolConfig
from fulgor.runner.ray_pool import RayRunnerPool

AGENT = "tests.integration.sample_agents.slow_agent:sleeper"


def test_worker_ids_are_unique_across_pools() -> None:
    config = PoolConfig(n_runners=3)
    first = RayRunnerPool(AGENT, "sqlite:///unused.sqlite", config)
    second = RayRunnerPool(AGENT, "sqlite:///unused.sqlite", config)
    ids = first.worker_ids + second.worker_ids
    assert len(set(ids)) == 6, f"worker ids collide across pools: {ids}"
    assert all(worker_id.startswith("ray-") for worker_id in ids)


def test_an_in_memory_store_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"sqlite:///.*fulgor serve"):
        RayRunnerPool(AGENT, "memory://")
