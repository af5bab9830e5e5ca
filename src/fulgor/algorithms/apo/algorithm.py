"""APO: improve an agent's prompts with a critic and an editor model, on any model the agent runs.

``APO(prompts={...}, optimizer=LLM(...))`` optimises one or more :class:`~fulgor.PromptTemplate`
resources (each named as the agent's parameter that receives it; jinja and f-string alike) by the
search of :mod:`fulgor.algorithms.apo.search` (``search="beam"``, Agent Lightning's, with its
defaults; or ``"pareto"``, GEPA's). The critic and editor are any OpenAI-compatible endpoint
(``optimizer``; ``critic`` and ``editor`` apart when they differ), their calls recorded in the
run's store; without one, APO only runs the agent with its prompts (``dev``, ``evaluate``). It
publishes resources, never weights: the agent's model is the local engine or an upstream
(``Trainer(upstream=...)``) alike.

Every candidate runs as a resources version of its own, so every rollout records the prompts it ran
with. ``run_dir/apo/`` keeps the history: ``candidates.json`` (each candidate, its parent, the
prompt edited, the critique, its status and why, its scores), ``best/NAME.txt`` (the best prompts
as plain files) with ``best.json``, and ``state.json`` (what a resumed run continues from: the
state after the last step ``metrics.jsonl`` holds). ``dev`` and ``evaluate`` run with the best
prompts found in the run directory.

What it does not know: the services; the Trainer runs them and hands over a
:class:`~fulgor.algorithms.base.RolloutSession`.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from jinja2 import TemplateSyntaxError

from fulgor.algorithms.apo.candidates import Candidate
from fulgor.algorithms.apo.optimizer import OptimizerCalls, Role
from fulgor.algorithms.apo.search import Search, SearchSettings
from fulgor.algorithms.base import RolloutSession
from fulgor.errors import ConfigError
from fulgor.types import LLM, JsonDict, PromptTemplate, Resources, RolloutMode

__all__ = ["APO"]

logger = logging.getLogger(__name__)

SearchMode = Literal["beam", "pareto"]
_STATE_VERSION = 1
# The search's counters that state.json keeps.
_COUNTERS = (
    "rollouts",
    "optimizer_calls",
    "best_rollouts",
    "best_optimizer_calls",
    "train_position",
    "val_position",
    "turn",
)


class APO:
    """Prompt optimisation; see the module docstring. Hyperparameters are keyword-only.

    ``max_steps`` steps (rounds) at most; ``max_rollouts``, ``max_optimizer_calls`` and
    ``max_seconds`` end the search earlier once spent, and ``target_score`` once the best
    candidate's validation score reaches it. Training rollouts (the critic's evidence)
    sample at ``temperature``, validation rollouts at ``val_temperature`` (None sends none: the
    agent's or the server's default); the optimiser answers at ``optimizer_temperature``, each call
    tried ``optimizer_retries`` more times when it fails or takes over ``optimizer_timeout_seconds``.
    """

    name = "apo"
    publishes: Literal["resources"] = "resources"

    def __init__(
        self,
        *,
        prompts: Mapping[str, PromptTemplate | str],
        optimizer: LLM | None = None,
        critic: LLM | None = None,
        editor: LLM | None = None,
        search: SearchMode = "beam",
        beam_width: int = 4,
        branch_factor: int = 4,
        proposals_per_step: int = 4,
        max_steps: int = 3,
        gradient_batch_size: int = 4,
        val_batch_size: int = 16,
        max_rollouts: int | None = None,
        max_optimizer_calls: int | None = None,
        max_seconds: float | None = None,
        target_score: float | None = None,
        temperature: float | None = 1.0,
        val_temperature: float | None = 0.0,
        optimizer_temperature: float | None = 1.0,
        optimizer_retries: int = 2,
        optimizer_timeout_seconds: float = 120.0,
        seed: int = 0,
    ) -> None:
        self.prompts = _prompts(prompts)
        self.critic = _model(critic or optimizer, "critic")
        self.editor = _model(editor or optimizer, "editor")
        _check_settings(
            search,
            {
                "beam_width": beam_width,
                "branch_factor": branch_factor,
                "proposals_per_step": proposals_per_step,
                "max_steps": max_steps,
                "gradient_batch_size": gradient_batch_size,
                "val_batch_size": val_batch_size,
            },
            {"max_rollouts": max_rollouts, "max_optimizer_calls": max_optimizer_calls},
            max_seconds,
        )
        if optimizer_retries < 0 or not optimizer_timeout_seconds > 0:
            raise ConfigError("optimizer_retries must be >= 0 and optimizer_timeout_seconds > 0")
        self.search_mode: SearchMode = search
        self.beam_width, self.branch_factor = beam_width, branch_factor
        self.proposals_per_step, self.max_steps = proposals_per_step, max_steps
        self.gradient_batch_size, self.val_batch_size = gradient_batch_size, val_batch_size
        self.max_rollouts, self.max_optimizer_calls = max_rollouts, max_optimizer_calls
        self.max_seconds, self.target_score = max_seconds, target_score
        self.temperature, self.val_temperature = temperature, val_temperature
        self.optimizer_temperature = optimizer_temperature
        self.optimizer_retries, self.optimizer_timeout_seconds = optimizer_retries, optimizer_timeout_seconds
        self.seed = seed
        self.state: Search | None = None
        self._calls: OptimizerCalls | None = None
        self._run_dir: Path | None = None

    # -- the ResourceAlgorithm protocol -------------------------------------------------------------

    def hyperparameters(self) -> JsonDict:
        return {
            "algorithm": self.name,
            "search": self.search_mode,
            "prompts": sorted(self.prompts),
            "critic_model": self.critic and self.critic.model,
            "editor_model": self.editor and self.editor.model,
            "beam_width": self.beam_width,
            "branch_factor": self.branch_factor,
            "proposals_per_step": self.proposals_per_step,
            "max_steps": self.max_steps,
            "gradient_batch_size": self.gradient_batch_size,
            "val_batch_size": self.val_batch_size,
            "max_rollouts": self.max_rollouts,
            "max_optimizer_calls": self.max_optimizer_calls,
            "max_seconds": self.max_seconds,
            "target_score": self.target_score,
            "temperature": self.temperature,
            "val_temperature": self.val_temperature,
            "optimizer_temperature": self.optimizer_temperature,
            "seed": self.seed,
        }

    def sampling_parameters(self, mode: RolloutMode) -> JsonDict:
        temperature = self.temperature if mode == "train" else self.val_temperature
        return {} if temperature is None else {"temperature": temperature}

    def resources(self, run_dir: Path) -> Resources:
        """The best prompts so far: this search's, else those ``run_dir/apo/best.json`` names, else
        the prompts it starts from."""
        if self.state is not None:
            return dict(self.state.candidates[self.state.best].prompts)
        best = Path(run_dir) / "apo" / "best.json"
        if best.is_file():
            saved = json.loads(best.read_text())["prompts"]
            if set(saved) == set(self.prompts):
                return {name: PromptTemplate(**p) for name, p in saved.items()}
            logger.warning("%s optimised other prompts (%s); using the ones given", best, sorted(saved))
        return dict(self.prompts)

    async def prepare(self, session: RolloutSession) -> None:
        """Continue from ``run_dir/apo/state.json`` when an earlier session got this far, else score
        the starting prompts on the whole validation set; the optimiser's gateways start first."""
        self._run_dir = session.run_dir
        models = self._models()
        self._calls = OptimizerCalls(
            session,
            models,
            self.optimizer_temperature,
            self.optimizer_retries,
            self.optimizer_timeout_seconds,
        )
        await self._calls.start()
        self.state = self._load(session) if session.start_step else None
        if self.state is None:
            self.state = self._fresh()
            await self.state.seed_scores(session)
            seed = self.state.candidates["seed"]
            logger.info(
                "apo: the starting prompts score %.3f on %d validation tasks",
                seed.score() or 0.0,
                len(session.val),
            )

    async def step(self, session: RolloutSession, step: int) -> dict[str, float]:
        assert self.state is not None, "prepare() runs first"
        assert self._calls is not None
        metrics = await self.state.step(session, self._calls, step)
        self._save(step)
        logger.info(
            "apo step %d: best %.3f (%s), %d candidates (%d rejected); %d rollouts, %d optimiser calls",
            step,
            metrics["best_score"],
            self.state.best,
            metrics["candidates"],
            metrics["candidates_rejected"],
            self.state.rollouts,
            self.state.optimizer_calls,
        )
        return metrics

    async def close(self) -> None:
        if self._calls is not None:
            await self._calls.close()

    def finished(self, elapsed_seconds: float) -> bool:
        if self.max_seconds is not None and elapsed_seconds >= self.max_seconds:
            return True
        if self.state is None:
            return False
        best = self.state.candidates[self.state.best].score()
        reached = self.target_score is not None and best is not None and best >= self.target_score
        return reached or self.state.budget_spent

    # -- the search's state and history -------------------------------------------------------------

    def _models(self) -> dict[Role, LLM]:
        if self.critic is None or self.editor is None:
            role = "critic" if self.critic is None else "editor"
            raise ConfigError(
                f"APO needs a model for its {role} to search: pass optimizer=LLM(endpoint="
                "'http://host:port/v1', model='...', api_key=...) (or critic= and editor= apart); "
                "without one it only runs the agent with its prompts (dev, evaluate)"
            )
        return {"critic": self.critic, "editor": self.editor}

    def _settings(self) -> SearchSettings:
        return SearchSettings(
            self.search_mode,
            self.beam_width,
            self.branch_factor,
            self.proposals_per_step,
            self.gradient_batch_size,
            self.val_batch_size,
            self.max_rollouts,
            self.max_optimizer_calls,
            self.sampling_parameters("train"),
            self.sampling_parameters("val"),
            self.seed,
        )

    def _fresh(self) -> Search:
        seed = Candidate(id="seed", prompts=dict(self.prompts), step=0, status="seed")
        return Search(self._settings(), {"seed": seed}, ["seed"], "seed", random.Random(self.seed))

    def _load(self, session: RolloutSession) -> Search:
        path = session.run_dir / "apo" / "state.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"cannot continue the prompt search of {session.run_dir}: {path}: {error}"
            ) from None
        if data.get("step") != session.start_step or data.get("version") != _STATE_VERSION:
            raise ConfigError(
                f"{path} holds the search after step {data.get('step')}, but metrics.jsonl ends at step "
                f"{session.start_step}; continue in a new run_dir"
            )
        candidates = {c["id"]: Candidate.from_json(c) for c in data["candidates"]}
        search = Search(self._settings(), candidates, data["beam"], data["best"], random.Random())
        search.rng.setstate(_rng_state(data["rng"]))
        for key in _COUNTERS:
            setattr(search, key, int(data[key]))
        logger.info(
            "apo: continuing after step %d with %d candidates", session.start_step, len(search.candidates)
        )
        return search

    def _save(self, step: int) -> None:
        """``candidates.json``, ``best/`` and ``state.json``, each replaced whole (never half written)."""
        assert self.state is not None
        assert self._run_dir is not None
        state, directory = self.state, self._run_dir / "apo"
        candidates = [c.to_json() for c in state.candidates.values()]
        best = state.candidates[state.best]
        _write(directory / "candidates.json", json.dumps(candidates, indent=1))
        for name, prompt in best.prompts.items():
            _write(directory / "best" / f"{name}.txt", prompt.template)
        summary = {"id": best.id, "score": best.score(), "step": step, "prompts": best.to_json()["prompts"]}
        _write(directory / "best.json", json.dumps(summary, indent=1))
        counters = {key: getattr(state, key) for key in _COUNTERS}
        data = {
            "version": _STATE_VERSION,
            "step": step,
            "beam": state.beam,
            "best": state.best,
            "rng": state.rng.getstate(),
            "candidates": candidates,
            **counters,
        }
        _write(directory / "state.json", json.dumps(data))


def _prompts(prompts: Mapping[str, PromptTemplate | str]) -> dict[str, PromptTemplate]:
    if not isinstance(prompts, Mapping) or not prompts:
        raise ConfigError(
            "APO needs prompts={NAME: PromptTemplate(...)}, named as the agent's parameters that take them"
        )
    found: dict[str, PromptTemplate] = {}
    for name, prompt in prompts.items():
        if name == "llm" or not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(
                f"prompt name {name!r} must be a Python identifier other than 'llm' (a parameter name)"
            )
        if isinstance(prompt, str):
            prompt = PromptTemplate(template=prompt)
        if not isinstance(prompt, PromptTemplate) or not prompt.template.strip():
            raise ConfigError(f"prompts[{name!r}] must be a PromptTemplate (or its text) that is not empty")
        try:
            prompt.placeholders  # noqa: B018 - parses the template
        except (ValueError, TemplateSyntaxError) as error:  # string.Formatter's, jinja2's
            raise ConfigError(f"prompts[{name!r}] is not a valid {prompt.engine} template: {error}") from None
        found[name] = prompt
    return found


def _check_settings(
    search: str, counts: Mapping[str, int], limits: Mapping[str, int | None], max_seconds: float | None
) -> None:
    if search not in ("beam", "pareto"):
        raise ConfigError(f"search must be 'beam' or 'pareto', got {search!r}")
    for key, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be a whole number >= 1, got {value!r}")
    for key, limit in limits.items():
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"{key} must be a whole number >= 1 or None, got {limit!r}")
    if max_seconds is not None and not max_seconds > 0:
        raise ConfigError(f"max_seconds must be > 0 or None, got {max_seconds!r}")


def _model(llm: LLM | None, role: str) -> LLM | None:
    if llm is None:
        return None
    if not isinstance(llm, LLM):
        raise ConfigError(f"the {role} must be an LLM(endpoint=..., model=...), got {type(llm).__name__}")
    return llm


def _rng_state(value: Any) -> tuple[Any, ...]:
    """``random.getstate()`` back from JSON (its tuples became lists)."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
