"""An algorithm written outside fulgor, against the ``Algorithm`` protocol alone, trained with.

``BestOfGroup`` imports nothing of fulgor's: it keeps the best rollout of each group and fine-tunes
on the tokens the engine sampled in it with plain torch. The Trainer drives it through the same
services as GRPO (store, gateway, engine, runners, checkpoints, validation, metrics, resume); an
algorithm that publishes nothing runs and measures rollouts only; an object that is no algorithm
is refused before anything starts, naming what it lacks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from safetensors.torch import load_file
from sample_agents.chat_agent import graded_call

from fulgor import Algorithm, Trainer, semconv
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.errors import ConfigError
from fulgor.store import SqliteStore
from fulgor.types import ModelCall
from fulgor.weights.policy import load_training_state

TASKS = [
    {"prompt": "Say a word.", "letter": "e"},
    {"prompt": "Name a colour.", "letter": "a"},
]


class SampledTokenNll:
    """Plain supervised learning on the tokens the engine sampled (loss mask 1), one SGD step."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        self.steps = 0

    def step(self, trajectories: list[Any]) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad()
        losses = []
        for trajectory in trajectories:
            for row in trajectory.rows:
                ids = torch.tensor([row.token_ids])
                logits = self.model(input_ids=ids).logits[0, :-1]
                logprobs = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
                mask = torch.tensor(row.loss_mask[1:], dtype=torch.bool)
                losses.append(-logprobs[mask].mean())
        loss = torch.stack(losses).mean()
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return {"nll": float(loss.detach()), "rows": float(len(losses)), "not logged": 1.0}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


class BestOfGroup:
    """Each step: every task twice; learn from the better rollout of each pair."""

    name = "best-of-group"
    publishes = "weights"
    group_size = 2
    val_before_training = False
    async_rollouts = False
    agent_match = None
    max_trajectory_tokens = None
    lora = None
    needs_reference_model = False
    metric_names = {"nll": "loss", "rows": "rows_trained"}

    def __init__(self, max_steps: int = 2) -> None:
        self.max_steps = max_steps

    def hyperparameters(self) -> dict[str, Any]:
        return {"algorithm": self.name, "max_steps": self.max_steps}

    async def prepare(self, policy: Any | None) -> None:
        self.prepared_with = policy

    def sampling_parameters(self, mode: str) -> dict[str, Any]:
        return {"temperature": 0.0 if mode == "val" else 1.0, "max_tokens": 8}

    def step_tasks(self, dataset: Sequence[Any], step: int) -> list[Any]:
        return list(dataset)

    def select(self, trajectories: list[Any], policy_version: int) -> tuple[list[Any], dict[str, float]]:
        best: dict[Any, Any] = {}
        for trajectory in trajectories:
            kept = best.get(trajectory.group_id)
            if kept is None or trajectory.reward > kept.reward:
                best[trajectory.group_id] = trajectory
        return list(best.values()), {"trajectories_kept": float(len(best))}

    def updater(self, model: Any, reference_model: Any | None = None) -> SampledTokenNll:
        return SampledTokenNll(model)

    def validates_at(self, step: int) -> bool:
        return step == self.max_steps

    def out_of_time(self, elapsed_seconds: float) -> bool:
        return False


class RolloutsOnly(BestOfGroup):
    """Runs and measures rollouts; changes no weights."""

    name = "rollouts-only"
    publishes = "nothing"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("custom") / "tiny", "tiny", seed=0)


def trainer(algorithm: Any, run_dir: Path, model_dir: Path) -> Trainer:
    engine = EngineConfig(model=model_dir, device="cpu", max_model_len=256, seed=0)
    return Trainer(
        algorithm=algorithm, engine=engine, run_dir=run_dir, n_runners=1, max_concurrency=4,
        torch_threads=1, progress=False,
    )  # fmt: skip


def test_an_algorithm_written_against_the_protocol_alone_trains(tmp_path: Path, model_dir: Path) -> None:
    assert isinstance(BestOfGroup(), Algorithm)
    run_dir = tmp_path / "run"
    algorithm = BestOfGroup()
    history = trainer(algorithm, run_dir, model_dir).fit(graded_call, TASKS, TASKS)
    assert algorithm.prepared_with.tokenizer is not None  # the trainer's copy of the model

    assert [line["step"] for line in history] == [1, 2]
    assert [line["model_version"] for line in history] == [1, 2]
    for line in history:
        assert line["rollouts"] == 4
        assert line["trajectories_kept"] == 2.0  # one per group
        assert line["rows_trained"] == 2.0
        assert isinstance(line["loss"], float)
        assert "not logged" not in line
        assert "nll" not in line
    assert "val_accuracy" in history[1]
    assert "val_accuracy" not in history[0]
    # The weights changed, and step 2's rollouts ran on those step 1 published.
    base = load_file(str(model_dir / "model.safetensors"))
    trained = load_file(str(run_dir / "checkpoints" / "step-2" / "model.safetensors"))
    assert any(not torch.equal(base[name], trained[name]) for name in base)
    assert load_training_state(run_dir / "checkpoints" / "step-2")["updater"] == {"steps": 2}
    versions = _call_versions_by_step(run_dir)
    assert versions == {1: {0}, 2: {1}}

    # A resumed run hands the updater its state back.
    again = trainer(BestOfGroup(max_steps=3), run_dir, model_dir).fit(graded_call, TASKS, TASKS)
    assert [line["step"] for line in again] == [3]
    assert load_training_state(run_dir / "checkpoints" / "step-3")["updater"] == {"steps": 3}
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_an_algorithm_that_publishes_nothing_runs_and_measures_rollouts(
    tmp_path: Path, model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    algorithm = RolloutsOnly()
    history = trainer(algorithm, run_dir, model_dir).fit(graded_call, TASKS, TASKS)
    assert algorithm.prepared_with is None  # no copy of the model to train
    assert [line["step"] for line in history] == [1, 2]
    assert [line["model_version"] for line in history] == [0, 0]
    assert all("loss" not in line and line["rollouts"] == 4 for line in history)
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    assert _call_versions_by_step(run_dir) == {1: {0}, 2: {0}}


def test_an_algorithm_that_publishes_nothing_runs_on_an_upstream_fulgor_does_not_own(
    tmp_path: Path, model_dir: Path
) -> None:
    """The upstream is an OpenAI-compatible server with token ids (fulgor's engine, served apart as
    a vLLM server would be): the trainer starts no engine, finds the model it serves, records every
    call with the server's ids."""
    from fulgor.engine.app import create_app
    from fulgor.engine.local import LocalEngine
    from fulgor.net.asgi import ServerThread

    served = LocalEngine.from_config(
        EngineConfig(model=model_dir, served_model_name="elsewhere", device="cpu", max_model_len=256, seed=0)
    )
    run_dir = tmp_path / "run"
    try:
        with ServerThread(create_app(served)) as server:
            trainer = Trainer(
                algorithm=RolloutsOnly(), upstream=f"{server.url}/v1", run_dir=run_dir, n_runners=1,
                max_concurrency=4, progress=False,
            )  # fmt: skip
            history = trainer.fit(graded_call, TASKS, TASKS)
            measured = trainer.evaluate(graded_call, TASKS)
    finally:
        served.close()
    assert [line["step"] for line in history] == [1, 2]
    assert all(line["model_version"] is None and line["rollouts"] == 4 for line in history)
    assert all(line["drift/calls_missing_ids"] == 0 and line["drift/calls_trained"] == 4 for line in history)
    assert measured["val_rollouts_failed"] == 0
    calls = _calls(run_dir)
    assert len(calls) == 4 + 4 + 2 + 2  # two steps, validation after the last, evaluate
    assert {call.response["model"] for call in calls} == {"elsewhere"}
    assert all(call.prompt_token_ids and call.response_token_ids for call in calls)
    assert not (run_dir / "checkpoints").exists()


def test_what_is_no_algorithm_is_refused_naming_what_it_lacks(tmp_path: Path, model_dir: Path) -> None:
    class Halfway:
        name = "halfway"
        max_steps = 1

    with pytest.raises(ConfigError, match=r"lacks agent_match, async_rollouts, group_size, .*updater"):
        trainer(Halfway(), tmp_path / "run", model_dir)

    class Publishing(BestOfGroup):
        publishes = "prompts"

    with pytest.raises(ConfigError, match="publishes is 'prompts'; it must be one of weights, nothing"):
        trainer(Publishing(), tmp_path / "run", model_dir)


def _call_versions_by_step(run_dir: Path) -> dict[int, set[int | None]]:
    """Per training step, the model versions its rollouts' calls ran on."""

    async def read() -> dict[int, set[int | None]]:
        store = SqliteStore(run_dir / "store.sqlite")
        try:
            versions: dict[int, set[int | None]] = {}
            for rollout in await store.query_rollouts(mode="train"):
                spans = await store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL)
                step = versions.setdefault(rollout.metadata["step"], set())
                calls = [ModelCall.model_validate(s.attributes[semconv.ATTR_MODEL_CALL]) for s in spans]
                step.update(call.model_version for call in calls)
            return versions
        finally:
            await store.close()

    return asyncio.run(read())


def _calls(run_dir: Path) -> list[ModelCall]:
    async def read() -> list[ModelCall]:
        store = SqliteStore(run_dir / "store.sqlite")
        try:
            return [
                ModelCall.model_validate(span.attributes[semconv.ATTR_MODEL_CALL])
                for rollout in await store.query_rollouts()
                for span in await store.query_spans(rollout.rollout_id, name=semconv.SPAN_MODEL_CALL)
            ]
        finally:
            await store.close()

    return asyncio.run(read())
