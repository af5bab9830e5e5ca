"""The Ray pool's parts that need no Ray cluster (tests/integration/test_runner_ray.py runs one)."""

from __future__ import annotations

import json
from pathlib import Path

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


@pytest.mark.parametrize(
    ("variable", "config", "chosen"),
    [
        (None, None, False),  # Ray's default (on): not the user's choice, so a local instance turns it off
        ("1", None, True),
        ("0", None, True),
        (None, {"usage_stats": True}, True),  # ray enable-usage-stats
        (None, {"usage_stats": False}, True),
        (None, {"other": 1}, False),
    ],
)
def test_usage_stats_are_the_users_choice_only_when_they_made_one(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str | None,
    config: dict[str, object] | None,
    chosen: bool,
) -> None:
    from fulgor.runner.ray_pool import _usage_stats_chosen

    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    if variable is not None:
        monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", variable)
    config_path = tmp_path / "config.json"
    monkeypatch.setenv("RAY_USAGE_STATS_CONFIG_PATH", str(config_path))
    if config is not None:
        config_path.write_text(json.dumps(config))
    assert _usage_stats_chosen() is chosen
