"""The GRPO algorithm object: validated hyperparameters, the tasks of each step, sampling per mode."""

from __future__ import annotations

import doctest

import pytest

from fulgor.adapters import Trajectory
from fulgor.algorithms.grpo import GRPO, GRPOConfig, algorithm
from fulgor.errors import ConfigError


def test_its_documented_example_runs() -> None:
    result = doctest.testmod(algorithm)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"group_size": 1}, "group_size"),
        ({"batch_tasks": 0}, "batch_tasks"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_trajectory_tokens": 1}, "max_trajectory_tokens"),
        ({"max_seconds": 0.0}, "max_seconds"),
    ],
)
def test_bad_hyperparameters_fail_early_naming_the_field(options: dict[str, float], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        GRPO(**options)  # type: ignore[arg-type]


def test_out_of_time_only_with_a_limit_and_once_it_is_reached() -> None:
    assert not GRPO().out_of_time(1e9)
    assert not GRPO(max_seconds=300).out_of_time(299.9)
    assert GRPO(max_seconds=300).out_of_time(300.0)


def test_each_pass_over_the_training_set_sees_every_task_once_in_a_seeded_order() -> None:
    tasks = list(range(10))
    grpo = GRPO(batch_tasks=5, seed=3)
    first_pass = grpo.step_tasks(tasks, 1) + grpo.step_tasks(tasks, 2)
    second_pass = grpo.step_tasks(tasks, 3) + grpo.step_tasks(tasks, 4)
    assert sorted(first_pass) == tasks
    assert sorted(second_pass) == tasks
    assert first_pass != second_pass  # reshuffled each pass
    assert GRPO(batch_tasks=5, seed=3).step_tasks(tasks, 2) == grpo.step_tasks(tasks, 2)
    assert GRPO(batch_tasks=5, seed=4).step_tasks(tasks, 1) != grpo.step_tasks(tasks, 1)


def test_a_step_may_take_more_tasks_than_the_set_holds() -> None:
    assert sorted(GRPO(batch_tasks=4).step_tasks(["a", "b"], 1)) == ["a", "a", "b", "b"]
    with pytest.raises(ConfigError, match="empty"):
        GRPO().step_tasks([], 1)


def test_validation_samples_greedily_and_training_with_the_temperature() -> None:
    grpo = GRPO(temperature=0.8, top_p=0.9, max_tokens=64)
    assert grpo.sampling_parameters("train") == {"temperature": 0.8, "top_p": 0.9, "max_tokens": 64}
    assert grpo.sampling_parameters("val") == {"temperature": 0.0, "max_tokens": 64}


def test_validation_runs_every_val_every_steps_and_after_the_last() -> None:
    grpo = GRPO(max_steps=7, val_every=3)
    assert [step for step in range(1, 8) if grpo.validates_at(step)] == [3, 6, 7]


def test_kl_needs_a_reference_model() -> None:
    grpo = GRPO(config=GRPOConfig(kl_coef=0.1))
    with pytest.raises(ConfigError, match="reference"):
        grpo.updater(object())


def ran_on(*versions: int | None) -> Trajectory:
    return Trajectory("r", "g", 1.0, [], model_versions=list(versions))


def test_only_async_rollouts_too_far_behind_the_policy_are_stale() -> None:
    batch = [ran_on(5), ran_on(4, 5), ran_on(3), ran_on(5, None)]
    assert GRPO().split_stale(batch, policy_version=5) == (batch, [])  # synchronous: never stale
    fresh, stale = GRPO(async_rollouts=True, max_staleness=1).split_stale(batch, policy_version=5)
    assert (fresh, stale) == (batch[:2], batch[2:])
    fresh, stale = GRPO(async_rollouts=True, max_staleness=0).split_stale(batch, policy_version=5)
    assert (fresh, stale) == (batch[:1], batch[1:])
    with pytest.raises(ConfigError, match="max_staleness must be >= 0"):
        GRPO(async_rollouts=True, max_staleness=-1)
    assert GRPO(async_rollouts=True, max_staleness=2).hyperparameters()["max_staleness"] == 2
    # The dashboard reads these back from run.json to say why a call was or was not trained on.
    settings = GRPO(agent_match="write", max_trajectory_tokens=64).hyperparameters()
    assert (settings["agent_match"], settings["max_trajectory_tokens"]) == ("write", 64)
