"""The Trainer: wires store, gateway, engine, runners and an algorithm, and runs training as named steps.

``fit`` starts the services, publishes the LLM resource, then per step: ``collect_rollouts``
(``group_size`` rollouts per task, one group per task; with ``async_rollouts``, the next step's
rollouts run while this step trains), ``build_trajectories`` (spans to token rows with a drift
report), ``update_policy`` (one update of the algorithm's on the trainer's own copy of the model),
``publish_weights`` (checkpoint, gateway pause and drain, engine swap, gateway resume, a new
resources version), ``validate`` (every ``val_every`` steps, greedy), ``log_metrics`` (one JSON
line in ``run_dir/metrics.jsonl``) and ``prune_checkpoints`` (deleting the checkpoints no longer
kept). ``dev`` runs an agent through the same services without training, to check rewards and
traces first. On an ``upstream`` (an OpenAI-compatible server the trainer does not own) it runs
what changes no weights: ``dev``, ``evaluate``, and ``fit`` with an algorithm that publishes
nothing.

What it does not know: how an agent talks to its model (the gateway URL is all it gets), or which
algorithm it runs: it asks an :class:`~fulgor.algorithms.base.Algorithm` (GRPO and SFT are two)
which tasks to run, which trajectories to learn from, how to update the weights and when to stop.
An algorithm that publishes resources (APO: prompts) runs its own search through a
:class:`~fulgor.training.session.TrainerSession` instead, one ``step`` at a time (``_search``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, get_args

from fulgor.agent.base import Runnable
from fulgor.algorithms.base import Algorithm, Publishes, ResourceAlgorithm, Updater, missing_members
from fulgor.engine.chat_format import read_chat_template
from fulgor.errors import ConfigError
from fulgor.runner.worker import RunnerConfig
from fulgor.store.base import Store
from fulgor.training import distributed
from fulgor.training.checkpoints import (
    checkpoint_accuracies,
    drop_old_training_state,
    latest_checkpoint,
    prune_checkpoints,
    set_torch_threads,
)
from fulgor.training.collector import Collector
from fulgor.training.distributed import Ranks
from fulgor.training.engines import check_engine_updates, engine_for
from fulgor.training.reports import (
    DevReport,
    MetricsLog,
    PhaseTimer,
    ProgressBar,
    RolloutReport,
    drift_total,
)
from fulgor.training.rollouts import (
    RolloutOutcome,
    agent_match_problem,
    groups_without_signal,
    read_outcome,
    run_rollouts,
    validation_metrics,
)
from fulgor.training.run_report import read_metrics, write_run_info
from fulgor.training.runners import KubernetesRunners, RayRunners, check_runners
from fulgor.training.services import Services, open_run_store, start_services, trainer_upstream
from fulgor.training.session import TrainerSession, agent_prompt_problem
from fulgor.training.tracking import start_tracking
from fulgor.types import LLM, JsonDict, Rollout, RolloutConfig, RolloutMode, RolloutRequest
from fulgor.weights.loading import checkpoint_kind
from fulgor.weights.lora import adapter_set
from fulgor.weights.policy import Policy, load_policy, load_training_state

if TYPE_CHECKING:
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.vllm import VLLMConfig
    from fulgor.gateway import Upstream
    from fulgor.training.tracking import Tracker
    from fulgor.weights.lora import LoraConfig

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ResourceIds:
    """The resources versions rollouts run with: sampling for training, greedy for validation."""

    train: str
    val: str


class Trainer:
    """Trains an agent's model with an algorithm, on services it starts and stops itself.

    ``engine`` is the local engine's config (the model directory to start from, device, context
    length); the trainer loads the engine and a trainable copy of the same weights. Given a
    :class:`~fulgor.engine.vllm.VLLMConfig` instead, vLLM serves the model: the trainer starts and
    supervises it (or uses the running server its ``url`` names) and publishes each update's
    weights to it without a restart (full weights reloaded in place, a LoRA adapter loaded under a
    new name). ``run_dir``
    holds ``store.sqlite`` (unless ``store`` is given), ``checkpoints/step-N``, ``metrics.jsonl``
    and ``logs/runners.log``; the trainer closes ``store.sqlite`` when ``fit``, ``dev`` or
    ``evaluate`` returns, and leaves a ``store`` passed in open, for the caller to use and close.
    With ``resume``, ``fit`` on a run directory that has checkpoints continues from the newest one
    (without, it refuses to); ``dev`` and ``evaluate`` always use the newest weights. Training keeps
    the newest ``keep_checkpoints`` checkpoints and the one with the best validation accuracy (the
    earliest of equals), and deletes the others as it goes, earlier sessions' too; a run without
    validation keeps the newest only, and ``keep_checkpoints=0`` keeps every one. ``n_runners``
    runners run up to ``max_concurrency`` rollouts each: in processes when they can import the
    agent, else on the trainer's own event loop; with ``runners=RayRunners(...)``, as Ray actors
    (:class:`~fulgor.training.runners.RayRunners`: a Ray instance on this machine, or a cluster
    it joins, whose actors reach the session at its ``server_url``); with
    ``runners=KubernetesRunners(...)``, each attempt of a ``SubprocessAgent`` as a Kubernetes Job
    (:class:`~fulgor.training.runners.KubernetesRunners`: at most ``n_runners`` x
    ``max_concurrency`` Jobs at once). ``runner_python`` runs the runner processes on another
    Python: an agent's own virtual environment, with fulgor's core installed, checked to load the
    agent before any rollout runs. ``rollout_config`` sets each rollout's timeout and retries;
    ``torch_threads`` the trainer's torch threads (default: every usable core). ``trackers``
    (:mod:`fulgor.training.tracking`) receive every step's metrics too; ``progress`` shows a progress
    bar with the latest reward and validation accuracy on stderr.

    Instead of ``engine``, ``upstream`` names an OpenAI-compatible server the trainer does not own
    (``http://host:port/v1``: a vLLM server, a hosted API; or a :class:`~fulgor.gateway.Upstream`,
    which can also stop asking it for token ids), with ``api_key`` sent to it and ``model`` the
    model it serves the agent's calls with (by default the one model its ``/models`` lists). Every
    call still goes through the gateway and is recorded, with token ids where the server returns
    them (vLLM does). Nothing there changes weights: ``fit`` refuses an algorithm that publishes
    weights before anything starts.
    """

    def __init__(
        self,
        *,
        algorithm: Algorithm | ResourceAlgorithm,
        engine: EngineConfig | VLLMConfig | None = None,
        upstream: str | Upstream | None = None,
        api_key: str | None = None,
        model: str | None = None,
        run_dir: str | Path = "runs/default",
        store: Store | None = None,
        n_runners: int = 2,
        runners: RayRunners | KubernetesRunners | None = None,
        runner_python: str | Path | None = None,
        max_concurrency: int = 8,
        rollout_config: RolloutConfig | None = None,
        torch_threads: int | None = None,
        resume: bool = True,
        keep_checkpoints: int = 2,
        trackers: Sequence[Tracker] = (),
        progress: bool = True,
    ) -> None:
        if n_runners < 1 or max_concurrency < 1:
            raise ConfigError(
                f"n_runners and max_concurrency must be >= 1, got {n_runners}, {max_concurrency}"
            )
        if keep_checkpoints < 0:
            raise ConfigError(
                f"keep_checkpoints must be 0 (keep every checkpoint) or more, got {keep_checkpoints}"
            )
        _check_algorithm(algorithm)
        check_engine_updates(algorithm, engine)
        self.algorithm = algorithm
        self.engine = engine
        self.upstream = trainer_upstream(engine, upstream, api_key, model)
        self.model = model
        self.run_dir = Path(run_dir)
        self.store = store
        self.n_runners = n_runners
        self.runners = runners
        self.runner_python = check_runners(runners, runner_python)
        # A short claim long-poll: stopping a runner waits for its claim in flight to return.
        self.runner_config = RunnerConfig(
            max_concurrency=max_concurrency, claim_wait_seconds=1.0, shutdown_grace_seconds=5.0
        )
        self.rollout_config = rollout_config or RolloutConfig(
            timeout_seconds=600, unresponsive_seconds=120, max_attempts=2
        )
        self.torch_threads = torch_threads
        self.resume = resume
        self.keep_checkpoints = keep_checkpoints
        self.trackers = tuple(trackers)
        self.progress = progress

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def _algorithm(self) -> Algorithm:
        """The algorithm as a step algorithm (what publishes weights or nothing); the training loop
        of a :class:`ResourceAlgorithm` is ``_search``."""
        return cast(Algorithm, self.algorithm)

    @property
    def _adapters(self) -> dict[str, LoraConfig]:
        """The algorithm's LoRA adapters, one per agent, by name (an optional member of the
        protocol: ``GRPO(adapters=...)`` has it)."""
        return dict(getattr(self.algorithm, "adapters", None) or {})

    def _search_algorithm(self) -> ResourceAlgorithm | None:
        algorithm = self.algorithm
        return cast(ResourceAlgorithm, algorithm) if algorithm.publishes == "resources" else None

    # -- public entry points ------------------------------------------------------------------------

    def fit(
        self, agent: Runnable, train_dataset: Sequence[Any], val_dataset: Sequence[Any] = ()
    ) -> list[dict[str, Any]]:
        """Train for ``algorithm.max_steps`` steps (fewer when ``algorithm.max_seconds`` runs out);
        returns the metrics of each step run."""
        if not train_dataset:
            raise ConfigError("the training dataset is empty; pass at least one task")
        if self.upstream is not None and self._algorithm.publishes == "weights":
            kind = type(self.algorithm).__name__
            raise ConfigError(
                f"{kind} changes the model's weights, and the upstream {self.upstream.url} is a server "
                "fulgor does not own, whose weights it cannot change; train on a local model with "
                "Trainer(engine=EngineConfig(model=DIR)), or use dev/evaluate (or an algorithm that "
                "publishes nothing) with the upstream"
            )
        if (world := distributed.world_from_env()) is not None:  # one of torchrun's ranks
            fit = functools.partial(self._fit, agent, list(train_dataset), list(val_dataset))
            run = functools.partial(distributed.fit_on_ranks, world, self.algorithm, self.engine)
            return run(self.torch_threads, lambda ranks: _run_blocking(fit(ranks)))
        search = self._search_algorithm()
        if search is None:
            return _run_blocking(self._fit(agent, list(train_dataset), list(val_dataset)))
        problem = agent_prompt_problem(agent, search.resources(self.run_dir))
        if problem is not None:
            raise ConfigError(problem)
        if not val_dataset:
            raise ConfigError(
                f"{type(search).__name__} scores its candidates on the validation dataset; pass "
                "val_dataset (tasks apart from the training ones)"
            )
        return _run_blocking(self._search(search, agent, list(train_dataset), list(val_dataset)))

    def dev(self, agent: Runnable, dataset: Sequence[Any]) -> DevReport:
        """Run ``agent`` once on each task through the whole system, without training.

        Returns each rollout's status, reward, number of model calls and drift counts; print it
        to see them as a table.
        """
        if not dataset:
            raise ConfigError("the dev dataset is empty; pass at least one task")
        distributed.refuse_ranks("Trainer.dev")
        return _run_blocking(self._dev(agent, list(dataset)))

    def evaluate(self, agent: Runnable, dataset: Sequence[Any]) -> dict[str, float]:
        """Run ``agent`` once on each task, greedy, with the newest weights (no training).

        Returns the metrics :meth:`validate` measures (``val_accuracy``, ``val_tool_call_rate``,
        ``val_tool_calls``, ``val_rollouts_failed``, a reward's named values), for a held-out set
        the run never validated on.
        """
        if not dataset:
            raise ConfigError("the evaluation dataset is empty; pass at least one task")
        distributed.refuse_ranks("Trainer.evaluate")
        return _run_blocking(self._evaluate(agent, list(dataset)))

    # -- the training loop --------------------------------------------------------------------------

    async def _fit(
        self, agent: Runnable, train: list[Any], val: list[Any], ranks: Ranks | None = None
    ) -> list[dict[str, Any]]:
        start_step, model_dir = self._starting_point(training=True)
        log = MetricsLog(self.run_dir / "metrics.jsonl")
        if start_step >= self._algorithm.max_steps:
            logger.info("%s already holds all %d steps; nothing to train", self.run_dir, start_step)
            return log.history
        if self._algorithm.out_of_time(log.elapsed_seconds()):
            seconds = log.elapsed_seconds()
            logger.info("%s already used its time budget (%.0fs); nothing to train", self.run_dir, seconds)
            return log.history
        self._write_run_info(self._algorithm.name, self._algorithm.hyperparameters())
        with (
            start_tracking(self.trackers, self.run_dir, self._algorithm.hyperparameters()) as track,
            ProgressBar(start_step, self._algorithm.max_steps, enabled=self.progress) as progress,
        ):
            async with (
                self.start_services(agent, model_dir, start_step) as services,
                Collector(functools.partial(self.collect_rollouts, services, train)) as collector,
            ):
                trainable = None
                if self._algorithm.publishes == "weights":
                    assert model_dir is not None  # a local engine: fit refuses weights on an upstream
                    trainable = await asyncio.to_thread(self._trainable, model_dir, start_step, ranks)
                await self._algorithm.prepare(None if trainable is None else trainable[0])
                resources = await self.put_resources(services)
                if val and start_step == 0 and self._algorithm.val_before_training:
                    before = await self.validate(services, val, resources)
                    log.write({"step": 0, "model_version": services.model_version, **before})
                    track(log.history[-1])
                    progress.update(log.history[-1])
                for step in range(start_step + 1, self._algorithm.max_steps + 1):
                    rollouts, timer = await collector.take(step, resources)  # collected ahead, or now
                    with timer("build_trajectories"):
                        outcomes = await self.build_trajectories(services, rollouts)
                    if step == start_step + 1:  # before any update: a wrong pattern would train nothing
                        problem = agent_match_problem(self._algorithm.agent_match, outcomes)
                        if problem is not None:
                            raise ConfigError(problem)
                    last = step == self._algorithm.max_steps or self._algorithm.out_of_time(
                        log.elapsed_seconds()
                    )
                    if self._algorithm.async_rollouts and not last:
                        collector.start(step + 1, resources)  # runs while this step trains
                    update: dict[str, float] = {}
                    if trainable is not None:
                        policy, updater = trainable
                        with timer("update_policy"):
                            version = services.model_version or 0
                            update = await self.update_policy(updater, outcomes, version)
                        with timer("publish_weights"):
                            resources = await self.publish_weights(services, policy, updater, step)
                    out_of_time = self._algorithm.out_of_time(log.elapsed_seconds())
                    validation: dict[str, float] = {}
                    if val and (self._algorithm.validates_at(step) or out_of_time):
                        with timer("validate"):
                            validation = await self.validate(services, val, resources)
                    self.log_metrics(log, step, services, outcomes, update, validation, timer)
                    await self.prune_checkpoints(step)
                    track(log.history[-1])
                    progress.update(log.history[-1])
                    if out_of_time:
                        logger.info("step %d: the run's time budget is used up; stopping", step)
                        break
        return log.history

    async def _search(
        self, search: ResourceAlgorithm, agent: Runnable, train: list[Any], val: list[Any]
    ) -> list[dict[str, Any]]:
        """The loop of an algorithm that publishes resources: ``step`` after ``step`` on the services,
        each step's metrics logged; a resumed run continues after the last step logged."""
        start_step = self._steps_logged()
        log = MetricsLog(self.run_dir / "metrics.jsonl")
        if start_step >= search.max_steps or search.finished(log.elapsed_seconds()):
            logger.info(
                "%s already holds %d steps of %s; nothing to do", self.run_dir, start_step, search.name
            )
            return log.history
        _, model_dir = self._starting_point(training=False)
        self._write_run_info(search.name, search.hyperparameters())
        with (
            start_tracking(self.trackers, self.run_dir, search.hyperparameters()) as track,
            ProgressBar(start_step, search.max_steps, enabled=self.progress) as progress,
        ):
            async with (
                self.start_services(agent, model_dir, 0) as services,
                contextlib.AsyncExitStack() as stack,  # what the session starts for the algorithm
            ):
                session = TrainerSession(
                    services, self.build_trajectories, self.rollout_config, self.run_dir, train, val,
                    start_step, stack,
                )  # fmt: skip
                try:
                    await search.prepare(session)
                    for step in range(start_step + 1, search.max_steps + 1):
                        before = session.rollouts_run
                        metrics = await search.step(session, step)
                        log.write(
                            {
                                "step": step,
                                "model_version": services.model_version,
                                "rollouts": session.rollouts_run - before,
                                **metrics,
                                "elapsed_seconds": round(log.elapsed_seconds(), 3),
                            }
                        )
                        track(log.history[-1])
                        progress.update(log.history[-1])
                        if search.finished(log.elapsed_seconds()):
                            logger.info("step %d: %s reached its target or budget", step, search.name)
                            break
                finally:
                    await search.close()
        return log.history

    def _steps_logged(self) -> int:
        """The last step ``metrics.jsonl`` holds (0 when none); a ConfigError when there is one and
        ``resume`` is off."""
        if not (self.run_dir / "metrics.jsonl").is_file():
            return 0
        steps = [int(m["step"]) for m in read_metrics(self.run_dir) if isinstance(m.get("step"), int)]
        last = max(steps, default=0)
        if last and not self.resume:
            raise ConfigError(
                f"{self.run_dir} already holds steps up to {last}; pick a new run_dir or pass "
                "resume=True to continue that run"
            )
        return last

    async def _dev(self, agent: Runnable, dataset: list[Any]) -> DevReport:
        start_step, model_dir = self._starting_point(training=False)
        async with self.start_services(agent, model_dir, start_step) as services:
            resources = await self.put_resources(services)
            requests = [self._request(task, "test", resources.train) for task in dataset]
            rollouts = await run_rollouts(services.store, requests, services.runners)
            outcomes = await self.build_trajectories(services, rollouts)
        report = DevReport([RolloutReport.from_outcome(outcome) for outcome in outcomes])
        logger.info("dev run on %d tasks: %s", len(dataset), report.summary())
        return report

    async def _evaluate(self, agent: Runnable, dataset: list[Any]) -> dict[str, float]:
        start_step, model_dir = self._starting_point(training=False)
        async with self.start_services(agent, model_dir, start_step) as services:
            resources = await self.put_resources(services)
            return await self.validate(services, dataset, resources)

    # -- the named steps ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def start_services(
        self, agent: Runnable, model_dir: Path | None, model_version: int
    ) -> AsyncIterator[Services]:
        """Engine (on ``model_dir``) or the upstream, store server + gateway and runners; all
        stopped on leaving."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        adapters: dict[str, Path] = {}
        target: EngineConfig | VLLMConfig | Upstream
        if self.upstream is not None:
            target = self.upstream
        else:
            assert self.engine is not None
            assert model_dir is not None
            threads = await asyncio.to_thread(set_torch_threads, self.torch_threads)
            logger.info("torch uses %d threads in the trainer", threads)
            saved = adapter_set(model_dir)
            if saved is not None:  # the base serves agents without an adapter, each adapter its own
                model_dir, adapters = saved.base, saved.adapters
            else:  # fresh adapters change nothing yet: each serves the weights it starts from
                adapters = {name: model_dir for name in self._adapters}
            target = replace(
                self.engine,
                model=model_dir,
                served_model_name=self.engine.model_name,
                model_version=model_version,
            )
        engine = engine_for(
            target,
            model_name=self.model,
            adapters=adapters,
            lora=getattr(self.algorithm, "lora", None) is not None,  # each update publishes an adapter
            log_dir=self.run_dir / "logs",
        )
        store = self.store if self.store is not None else await open_run_store(self.run_dir)
        runner_log = self.run_dir / "logs" / "runners.log"
        async with start_services(
            store,
            engine,
            agent,
            self.n_runners,
            self.runner_config,
            runner_log,
            owns_store=self.store is None,
            runners_backend=self.runners,
            runner_python=self.runner_python,
        ) as services:
            yield services

    async def put_resources(self, services: Services) -> ResourceIds:
        """Publish the ``llm`` resource (gateway, model name, sampling) for validation, then training;
        with an algorithm that publishes resources, the resources it found best beside it.

        Training's goes last so that it is the latest version, the one rollouts without a
        ``resources_id`` run with.
        """
        ids: dict[RolloutMode, str] = {}
        search = self._search_algorithm()
        extra = {} if search is None else search.resources(self.run_dir)
        for mode in ("val", "train"):
            llm = LLM(
                endpoint=f"{services.server_url}/v1",
                model=services.model_name,
                sampling_parameters=self.algorithm.sampling_parameters(mode),
                agent_models=services.agent_models,
            )
            version = await services.store.put_resources({"llm": llm, **extra})
            ids[mode] = version.resources_id
        return ResourceIds(train=ids["train"], val=ids["val"])

    async def collect_rollouts(
        self, services: Services, train: list[Any], step: int, resources: ResourceIds
    ) -> list[Rollout]:
        """Run ``group_size`` rollouts of each of the step's tasks (one group per task) to the end."""
        requests = []
        for task in self._algorithm.step_tasks(train, step):
            group_id = f"step-{step}-{uuid.uuid4().hex[:12]}"
            request = self._request(task, "train", resources.train, group_id=group_id, step=step)
            requests += [request] * self._algorithm.group_size
        return await run_rollouts(services.store, requests, services.runners)

    async def build_trajectories(self, services: Services, rollouts: list[Rollout]) -> list[RolloutOutcome]:
        """Each rollout's reward, model calls, trajectory (succeeded ones only) and drift report.

        The gateway records calls off the response path: first wait until every call of these
        rollouts is stored (other rollouts may be running meanwhile).
        """
        await services.settle_calls([rollout.rollout_id for rollout in rollouts])
        steps = self._search_algorithm() is None  # an algorithm of resources reads every call whole
        agent_match = self._algorithm.agent_match if steps else None
        max_tokens = self._algorithm.max_trajectory_tokens if steps else None
        return [
            await read_outcome(
                services.store,
                rollout,
                agent_match=agent_match,
                max_tokens=max_tokens,
                spans_lost=services.gateway.spans_lost(rollout.rollout_id),
            )
            for rollout in rollouts
        ]

    async def update_policy(
        self, updater: Updater, outcomes: list[RolloutOutcome], policy_version: int
    ) -> dict[str, float]:
        """One update of the algorithm's on the trajectories it selects (in a thread: the server
        keeps serving meanwhile); its metrics under the algorithm's ``metric_names``, and the
        counts its selection returned.

        ``policy_version`` is the version of the weights being updated (GRPO with async rollouts
        drops trajectories too many versions behind it, counted as ``rollouts_stale``).
        """
        trajectories = [o.trajectory for o in outcomes if o.trajectory is not None]
        trajectories, counts = self._algorithm.select(trajectories, policy_version)
        if not trajectories:
            logger.warning("no trajectory of this step was selected to learn from; no update")
            return {**counts, "update_skipped": 1.0}
        metrics = await asyncio.to_thread(updater.step, trajectories)
        names = self._algorithm.metric_names
        return {**{name: metrics[key] for key, name in names.items() if key in metrics}, **counts}

    async def publish_weights(
        self, services: Services, policy: Policy, updater: Updater, step: int
    ) -> ResourceIds:
        """Save ``checkpoints/step-N`` (weights and the updater's state), swap it into the engine
        between calls, publish new resources."""

        def save() -> Path:
            return policy.save(self.checkpoints_dir, step, {"updater": updater.state_dict()})

        checkpoint = await asyncio.to_thread(save)
        # Async: rollouts of the next step are running; they wait for the swap instead of retrying.
        version = await services.swap_weights(str(checkpoint), pause=not self._algorithm.async_rollouts)
        logger.info("step %d: the engine serves %s as model version %d", step, checkpoint, version)
        return await self.put_resources(services)

    async def validate(self, services: Services, val: list[Any], resources: ResourceIds) -> dict[str, float]:
        """Each validation task once, greedy.

        Returns ``val_accuracy`` (the mean reward; no reward counts 0), ``val_tool_call_rate``
        (the share of rollouts whose model asked for a tool at least once), ``val_tool_calls``
        (the tools asked for per rollout), ``val_rollouts_failed`` (how many rollouts did not
        succeed: they count in the accuracy as 0, and ``run_dir/logs/runners.log`` says why), and
        ``val_NAME`` for each named value of the rewards other than the primary one (a reward
        ``{"reward": r, "f1": f}`` gives ``val_f1``, the mean over rollouts that have it).
        """
        requests = [self._request(task, "val", resources.val) for task in val]
        rollouts = await run_rollouts(services.store, requests, services.runners)
        outcomes = await self.build_trajectories(services, rollouts)
        return validation_metrics(outcomes)

    async def prune_checkpoints(self, step: int) -> None:
        """Delete the checkpoints that are neither among the newest ``keep_checkpoints`` nor the best
        validated one (by every validation in ``metrics.jsonl``, earlier sessions' too), and the
        optimiser state of every one but the newest.

        Runs after ``log_metrics``, so step N's own accuracy counts. A checkpoint that cannot be
        deleted is logged and training goes on; unreadable metrics leave every checkpoint in place.
        """
        dropped = await asyncio.to_thread(drop_old_training_state, self.checkpoints_dir)
        if dropped:
            logger.info("step %d: optimiser state removed from the checkpoints of steps %s", step, dropped)
        if self.keep_checkpoints == 0:
            return
        try:
            accuracies = checkpoint_accuracies(read_metrics(self.run_dir))
            removed = await asyncio.to_thread(
                prune_checkpoints, self.checkpoints_dir, self.keep_checkpoints, accuracies
            )
        except (ConfigError, OSError) as error:
            logger.warning("step %d: checkpoints left in place, not pruned: %s", step, error)
            return
        if removed:
            logger.info("step %d: deleted the checkpoints of steps %s", step, removed)

    def log_metrics(
        self,
        log: MetricsLog,
        step: int,
        services: Services,
        outcomes: list[RolloutOutcome],
        update: dict[str, float],
        validation: dict[str, float],
        timer: PhaseTimer,
    ) -> None:
        """Append the step's metrics to ``metrics.jsonl`` and log a one-line summary."""
        rewards = [o.reward for o in outcomes if o.reward is not None]
        collect_seconds = timer.seconds.get("collect_rollouts", 0.0)
        metrics: dict[str, Any] = {
            "step": step,
            "model_version": services.model_version,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "rollouts": len(outcomes),
            "rollouts_failed": sum(1 for o in outcomes if o.rollout.status != "succeeded"),
            "groups_without_signal": groups_without_signal(outcomes),
            "tool_call_rate": sum(1 for o in outcomes if o.tool_calls) / max(len(outcomes), 1),
            "tokens_per_second": sum(o.sampled_tokens for o in outcomes) / max(collect_seconds, 1e-9),
        }
        metrics.update(validation)
        metrics["elapsed_seconds"] = round(log.elapsed_seconds(), 3)
        metrics.update(update)
        metrics.update({k: int(v) for k, v in drift_total(outcomes).as_metrics().items()})
        metrics.update({f"seconds/{phase}": round(s, 4) for phase, s in timer.seconds.items()})
        log.write(metrics)
        logger.info(
            "step %d: reward %s, val %s, loss %s, %.1fs",
            step,
            _fmt(metrics["reward_mean"]),
            _fmt(validation.get("val_accuracy")),
            _fmt(metrics.get("loss")),
            sum(timer.seconds.values()),
        )

    # -- helpers ------------------------------------------------------------------------------------

    def _starting_point(self, *, training: bool) -> tuple[int, Path | None]:
        """The step to continue after and the weights to start from (the newest checkpoint, or the
        base; None on an upstream, whose weights are its own).

        Only ``training`` continues the run, so only then must ``resume`` allow it and the
        checkpoint's kind match the algorithm's; the engine serves either kind.
        """
        if self.engine is None:
            return 0, None
        latest = latest_checkpoint(self.checkpoints_dir)
        if latest is None:
            return 0, Path(self.engine.model)
        if not training:
            logger.info("using the weights of %s (step %d)", latest[1], latest[0])
            return latest
        if not self.resume:
            raise ConfigError(
                f"{self.run_dir} already holds checkpoints up to step {latest[0]}; pick a new run_dir "
                "or pass resume=True to continue that run"
            )
        kind = type(self.algorithm).__name__
        saved = adapter_set(latest[1])
        if (saved is not None) != bool(self._adapters):
            held = "one LoRA adapter per agent" if saved is not None else "no adapter per agent"
            fix = f"{kind}(adapters={{...}}) naming them" if saved is not None else f"{kind}(adapters=None)"
            raise ConfigError(
                f"{latest[1]} holds {held}, but this {kind} "
                f"{'trains none' if saved is not None else 'trains one per agent'}; continue that run "
                f"with {fix} or pick a new run_dir"
            )
        adapter = saved is None and checkpoint_kind(latest[1]) == "lora"
        if saved is None and adapter != (self._algorithm.lora is not None):
            fix = f"{kind}(lora=LoraConfig(...))" if adapter else f"{kind}(lora=None)"
            raise ConfigError(
                f"{latest[1]} holds {'a LoRA adapter' if adapter else 'full weights'}, but this {kind} "
                f"{'trains all weights' if adapter else 'trains a LoRA adapter'}; continue that run with "
                f"{fix} or pick a new run_dir"
            )
        logger.info("resuming from %s (step %d)", latest[1], latest[0])
        return latest

    def _trainable(self, model_dir: Path, step: int, ranks: Ranks | None = None) -> tuple[Policy, Updater]:
        """The trainer's copy of the weights and the algorithm's updater (with a frozen copy of the
        starting weights when it asks for one); from a checkpoint (``step`` > 0), the updater
        continues with the state saved with it. With ``ranks``, every rank's shard of them."""
        assert self.engine is not None
        if ranks is not None:
            return distributed.sharded_trainable(
                self._algorithm, model_dir, Path(self.engine.model), step, ranks
            )
        policy = load_policy(model_dir, self.engine.device, self._algorithm.lora, self._adapters)
        if self.engine.chat_template:  # the checkpoints, and SFT's rows, carry the template served
            policy.tokenizer.chat_template = read_chat_template(self.engine.chat_template)
        reference = None
        if self._algorithm.needs_reference_model:
            reference = load_policy(Path(self.engine.model), self.engine.device).model.eval()
            reference.requires_grad_(False)
        updater = self._algorithm.updater(policy.model, reference)
        if step > 0:
            state = load_training_state(model_dir)
            if state is None:
                logger.warning("%s holds no training state: the optimiser starts afresh", model_dir)
            elif "optimizer_shards" in state["updater"]:  # saved by several ranks
                distributed.resume_unsharded(updater, policy.model, model_dir, state["updater"])
            else:
                updater.load_state_dict(state["updater"])
        return policy, updater

    def _write_run_info(self, algorithm: str, hyperparameters: JsonDict) -> None:
        model = None if self.engine is None else str(Path(self.engine.model).resolve())
        write_run_info(self.run_dir, algorithm=algorithm, hyperparameters=hyperparameters, model=model)

    def _request(
        self, task: Any, mode: RolloutMode, resources_id: str, *, group_id: str | None = None, step: int = 0
    ) -> RolloutRequest:
        return RolloutRequest(
            input=task,
            mode=mode,
            group_id=group_id,
            resources_id=resources_id,
            config=self.rollout_config,
            metadata={"step": step} if step else {},
        )


def _check_algorithm(algorithm: Any) -> None:
    """An algorithm the Trainer can drive, or a ConfigError naming what it lacks."""
    names = missing_members(algorithm)
    if names:
        raise ConfigError(
            f"{algorithm!r} is not an algorithm the Trainer can drive: it lacks {', '.join(names)} "
            "(see fulgor.algorithms.Algorithm; fulgor.algorithms.GRPO is one)"
        )
    if algorithm.publishes not in get_args(Publishes):
        raise ConfigError(
            f"{type(algorithm).__name__}.publishes is {algorithm.publishes!r}; it must be one of "
            f"{', '.join(get_args(Publishes))}"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _run_blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on an event loop in a thread of its own and wait for it.

    The servers then run off the main thread, where uvicorn leaves signals alone: Ctrl+C reaches
    this thread as KeyboardInterrupt, which cancels ``work`` so that every service stops in order.
    It also works when the caller's thread already runs an event loop (a notebook).
    """
    started = threading.Event()
    # Waited on instead of thread.join(): on Python 3.11 a KeyboardInterrupt that lands inside
    # join() can mark the thread as stopped while it runs (CPython issue #90882), and the next
    # join() would return at once, before the services had stopped.
    finished = threading.Event()
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[T]]] = []
    outcome: list[T] = []
    failure: list[BaseException] = []

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        running.append((asyncio.get_running_loop(), task))
        started.set()
        return await work

    def target() -> None:
        try:
            outcome.append(asyncio.run(main()))
        except BaseException as error:  # handed back to the caller's thread below
            failure.append(error)
        finally:
            started.set()
            finished.set()

    thread = threading.Thread(target=target, name="fulgor-trainer")
    thread.start()
    interrupted = False
    while not finished.is_set():
        try:
            finished.wait()
        except KeyboardInterrupt:
            # Each Ctrl+C cancels the work once more: the first stops everything in order (the
            # runners drain their rollouts), the next reaches the drain and stops the runners at once.
            if interrupted:
                logger.warning("interrupted again: stopping the runners at once")
            else:
                logger.warning("interrupted: stopping runners, server and engine")
            interrupted = True
            started.wait()
            for loop, task in running:
                with contextlib.suppress(RuntimeError):  # the loop already finished
                    loop.call_soon_threadsafe(task.cancel)
    thread.join()
    if interrupted:
        raise KeyboardInterrupt
    if failure:
        raise failure[0]
    return outcome[0]
