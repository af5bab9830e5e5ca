"""The Ray pool's parts that need no Ray cluster (tests/integration/test_runner_ray.py runs one)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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


def test_a_local_instance_starts_with_its_switches_and_leaves_the_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``ray.init`` is given and runs with (the instance itself: tests/integration/test_loopback.py),
    and the warning when Ray was imported without the loopback switch."""
    ray = pytest.importorskip("ray", reason="the ray extra is installed by make test")
    from ray._private import ray_constants

    from fulgor.runner import ray_pool

    seen: list[tuple[dict[str, Any], dict[str, str | None]]] = []

    def init(**options: Any) -> None:  # records instead of starting Ray
        names = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED")
        seen.append((options, {name: os.environ.get(name) for name in names}))

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    monkeypatch.setenv("RAY_USAGE_STATS_CONFIG_PATH", "/nonexistent/config.json")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # as when imported with the switch
    ray_pool.init_local_ray(2, {"env_vars": {"A": "1"}})
    [(options, environment)] = seen
    assert options["address"] == "local"
    assert options["_node_ip_address"] == "127.0.0.1"
    assert (options["num_cpus"], options["runtime_env"]) == (2, {"env_vars": {"A": "1"}})
    assert environment == {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ  # as it was after
    assert "RAY_USAGE_STATS_ENABLED" not in os.environ
    assert not caplog.records

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")  # the user's choice is kept
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)  # Ray imported without the switch
    ray_pool.init_local_ray(None, {})
    assert seen[1][1]["RAY_USAGE_STATS_ENABLED"] == "1"
    [warning] = caplog.records
    assert "takes this machine's network address" in warning.getMessage()
