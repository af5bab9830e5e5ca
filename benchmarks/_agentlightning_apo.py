"""The Agent Lightning side of ``benchmarks/apo.py``: Agent Lightning 0.3.0's APO on the rooms task.

This file is two things:

* The room agent as Agent Lightning runs it (:func:`room_agent`, plain ``openai`` SDK): the same
  conversation as ``examples/rooms/agent.py``, from the example's fulgor-free parts (this side's
  environment has no fulgor): the user message from the prompt template, ``converse`` of
  ``examples/rooms/tools.py`` (the ``list_rooms`` tool, at most ``MAX_TURNS`` model calls) and the
  grade of ``examples/rooms/rules.py``.
  ``benchmarks/apo.py`` imports this module to check that both agents send the same requests.
* A script, run with the python of ``.bench/agentlightning-0.3.0`` (never fulgor's) and the
  repository root on ``PYTHONPATH``, that runs ``agentlightning.algorithm.apo.APO`` with its
  defaults through ``agentlightning.Trainer`` (its default client-server strategy: an HTTP store
  server and runner processes) and prints one JSON object on stdout::

      {"agentlightning": "0.3.0", "seed_score": 0.07, "best_score": 0.9, "rounds": [..],
       "improvements": [..], "rollouts_total": 1224, "optimizer_calls_total": 96, ...}

What is counted, by wrapping Agent Lightning's own methods in a subclass (nothing of it is
changed): rollouts as each call of ``evaluate_prompt_on_batch`` enqueues them (one per task of its
batch: the seed's validation, each parent's gradient batch, every beam member and candidate on
the round's validation batch, the beam leader on the whole validation set); optimiser calls as
the calls of its ``AsyncOpenAI`` client's ``chat.completions.create`` (a critique and an edit per
candidate). ``improvements`` holds the seed's score and then, at each time ``_update_best_prompt``
raises the best full-validation score, that score with the rollouts and optimiser calls used so
far, like fulgor's ``best_rollouts`` and ``best_optimizer_calls``.

Agent Lightning is imported only inside :func:`main`, so importing this module costs nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from typing import Any

from examples.rooms.dataset import make_splits
from examples.rooms.rules import grade
from examples.rooms.tools import converse, prompt_fields

MODEL_URL_ENV = "APO_BENCH_MODEL_URL"
MODEL_NAME_ENV = "APO_BENCH_MODEL"
# The agent's sampling, as fulgor's APO sends it by default: train rollouts at 1, validation greedy.
TEMPERATURE = {"train": 1.0, "val": 0.0}


def first_messages(task: dict[str, Any], template: str) -> list[dict[str, Any]]:
    """The conversation the model first sees: the meeting, in the prompt template (no system message)."""
    return [{"role": "user", "content": template.format(**prompt_fields(task))}]


async def room_agent(task: dict[str, Any], prompt_template: Any, rollout: Any) -> float:
    """One booking, as an Agent Lightning rollout function (``agentlightning.rollout`` wraps it in
    :func:`main`): the reward is its return value."""
    import os

    from openai import AsyncOpenAI

    mode = rollout.mode if rollout.mode in TEMPERATURE else "train"
    messages = first_messages(task, prompt_template.template)
    async with AsyncOpenAI(base_url=os.environ[MODEL_URL_ENV], api_key="bench", max_retries=2) as client:
        final = await converse(
            client, os.environ[MODEL_NAME_ENV], messages, str(task["id"]), temperature=TEMPERATURE[mode]
        )
    reward, _feedback = grade(final, task)
    return float(reward)


# -- the search, measured -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _measured_apo(apo_class: type, started: float) -> type:
    """A subclass of Agent Lightning's APO that records what it uses (see the module docstring)."""

    class MeasuredAPO(apo_class):  # type: ignore[misc]
        rollouts = 0
        optimizer_calls = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.rounds: list[dict[str, Any]] = []
            self.improvements: list[dict[str, Any]] = []
            self.seed_score: float | None = None
            self._round_started = started
            create = self.async_openai_client.chat.completions.create

            async def counted(*call_args: Any, **call_kwargs: Any) -> Any:
                self.optimizer_calls += 1
                return await create(*call_args, **call_kwargs)

            self.async_openai_client.chat.completions.create = counted

        def _now(self) -> dict[str, Any]:
            return {
                "rollouts": self.rollouts,
                "optimizer_calls": self.optimizer_calls,
                "seconds": time.perf_counter() - started,
            }

        async def evaluate_prompt_on_batch(
            self, prompt: Any, resource_name: str, dataset: Any, mode: Any, **kwargs: Any
        ) -> Any:
            self.rollouts += len(dataset)
            return await super().evaluate_prompt_on_batch(prompt, resource_name, dataset, mode, **kwargs)

        def _sample_parent_prompts(self, beam: Any, round_num: int) -> Any:
            if round_num == 0:  # the seed's validation (run_initial_validation) is behind
                score = self._history_best_score
                self.seed_score = None if score == float("-inf") else float(score)
                self.improvements.append({"round": 0, "score": self.seed_score, **self._now()})
            self._round_started = time.perf_counter()
            return super()._sample_parent_prompts(beam, round_num)

        async def _update_best_prompt(
            self, beam: Any, resource_name: str, val_dataset: Any, round_num: int
        ) -> None:
            before = self._history_best_score
            await super()._update_best_prompt(beam, resource_name, val_dataset, round_num)
            best = float(self._history_best_score)
            self.rounds.append(
                {
                    "round": round_num + 1,
                    "best_score": best,
                    "round_seconds": time.perf_counter() - self._round_started,
                    **self._now(),
                }
            )
            if best > before:
                self.improvements.append({"round": round_num + 1, "score": best, **self._now()})

    return MeasuredAPO


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="a JSON file: seed_prompt, model_url, model, ...")
    args = parser.parse_args(argv)
    with open(args.spec) as file:
        spec: dict[str, Any] = json.load(file)

    import logging
    import os
    from importlib.metadata import version

    import agentlightning as agl
    from agentlightning.adapter import TraceToMessages
    from agentlightning.algorithm.apo import APO
    from openai import AsyncOpenAI

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    os.environ[MODEL_URL_ENV] = spec["model_url"]
    os.environ[MODEL_NAME_ENV] = spec["model"]
    random.seed(spec["seed"])  # Agent Lightning's APO draws from the random module
    train, val = make_splits(spec["dataset_seed"])

    started = time.perf_counter()
    optimizer = AsyncOpenAI(base_url=spec["optimizer_url"], api_key="bench")
    algorithm = _measured_apo(APO, started)(
        optimizer, gradient_model=spec["optimizer_model"], apply_edit_model=spec["optimizer_model"]
    )
    trainer = agl.Trainer(
        algorithm=algorithm,
        n_runners=spec["n_runners"],
        port=_free_port(),
        initial_resources={
            "prompt_template": agl.PromptTemplate(template=spec["seed_prompt"], engine="f-string")
        },
        adapter=TraceToMessages(),  # what its APO reads the rollouts with
    )
    trainer.fit(agl.rollout(room_agent), train_dataset=train, val_dataset=val)
    elapsed = time.perf_counter() - started

    settings = {
        key: getattr(algorithm, key)
        for key in ("beam_width", "branch_factor", "beam_rounds", "gradient_batch_size", "val_batch_size")
    }
    result = {
        "agentlightning": version("agentlightning"),
        "python": sys.version.split()[0],
        "settings": settings,
        "n_runners": spec["n_runners"],
        "seed_score": algorithm.seed_score,
        "best_score": float(algorithm._history_best_score),
        "best_prompt": algorithm.get_best_prompt().template,
        "rounds": algorithm.rounds,
        "improvements": algorithm.improvements,
        "rollouts_total": algorithm.rollouts,
        "optimizer_calls_total": algorithm.optimizer_calls,
        "elapsed_seconds": elapsed,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
