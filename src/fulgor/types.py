"""Wire models: what crosses a process boundary (HTTP, disk) between fulgor's components.

Every model is a frozen pydantic model, so a backend can hand out the objects it keeps without
copying them; build a changed one with ``model_copy(update=...)``. Times are seconds since the
Unix epoch (float). Statuses are ``Literal`` strings; the state machines that move between them
are documented in :mod:`fulgor.store.base`.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ATTEMPT_LIVE_STATUSES",
    "ATTEMPT_TERMINAL_STATUSES",
    "LLM",
    "ROLLOUT_QUEUED_STATUSES",
    "ROLLOUT_TERMINAL_STATUSES",
    "Attempt",
    "AttemptStatus",
    "AttemptedRollout",
    "ModelCall",
    "PromptTemplate",
    "Resource",
    "Resources",
    "ResourcesVersion",
    "Reward",
    "Rollout",
    "RolloutConfig",
    "RolloutMode",
    "RolloutRequest",
    "RolloutStatus",
    "Span",
    "SpanEvent",
    "SpanStatus",
    "StoreStats",
    "Worker",
    "agent_key",
]

RolloutStatus: TypeAlias = Literal[
    "queuing", "preparing", "running", "succeeded", "failed", "cancelled", "requeuing"
]
AttemptStatus: TypeAlias = Literal["preparing", "running", "succeeded", "failed", "timeout", "unresponsive"]
RolloutMode: TypeAlias = Literal["train", "val", "test"]

ROLLOUT_TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
ROLLOUT_QUEUED_STATUSES: frozenset[str] = frozenset({"queuing", "requeuing"})
ATTEMPT_LIVE_STATUSES: frozenset[str] = frozenset({"preparing", "running"})
ATTEMPT_TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "timeout", "unresponsive"})

JsonDict: TypeAlias = dict[str, Any]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RolloutConfig(_Model):
    """How the store supervises a rollout's attempts."""

    timeout_seconds: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Wall time an attempt may run before the watchdog marks it timeout."
    )
    unresponsive_seconds: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Silence (no span, heartbeat or update) after which an attempt is marked unresponsive.",
    )
    max_attempts: int = Field(
        default=1, ge=1, le=1000, description="Attempts allowed in total, first included."
    )
    retry_on: tuple[Literal["failed", "timeout", "unresponsive"], ...] = Field(
        default=("failed", "timeout", "unresponsive"),
        description="Attempt outcomes that requeue the rollout while attempts remain.",
    )


class RolloutRequest(_Model):
    """What a caller asks the store to run: one task input and how to run it."""

    input: Any = Field(description="The task, as JSON-serialisable data handed to the agent.")
    mode: RolloutMode = Field(default="train", description="Which split the task belongs to.")
    group_id: str | None = Field(
        default=None, max_length=256, description="Rollouts sampled for the same task (a GRPO group)."
    )
    resources_id: str | None = Field(
        default=None,
        max_length=256,
        description="Resources to run with; None means the latest at claim time.",
    )
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: JsonDict = Field(default_factory=dict)


class Rollout(_Model):
    """One task run: queued, claimed by a worker, retried in attempts until it ends."""

    rollout_id: str
    input: Any
    mode: RolloutMode = "train"
    group_id: str | None = None
    resources_id: str | None = Field(
        default=None, description="Resources it runs with; fixed when its first attempt starts."
    )
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: JsonDict = Field(default_factory=dict)
    status: RolloutStatus = "queuing"
    enqueue_time: float = Field(description="When it was created.")
    start_time: float | None = Field(default=None, description="When its first attempt started.")
    end_time: float | None = Field(default=None, description="When it reached a terminal status.")
    attempt_count: int = Field(default=0, ge=0, description="Attempts started so far.")

    @property
    def is_terminal(self) -> bool:
        return self.status in ROLLOUT_TERMINAL_STATUSES


class Attempt(_Model):
    """One try at running a rollout, owned by one worker."""

    rollout_id: str
    attempt_id: str
    sequence_id: int = Field(ge=1, description="1 for the first attempt of its rollout, then 2, 3, ...")
    worker_id: str | None = None
    status: AttemptStatus = "preparing"
    start_time: float
    end_time: float | None = None
    last_active_time: float = Field(description="Last span, heartbeat or update seen for it.")
    error: str | None = Field(default=None, description="Why it failed, when it did.")
    metadata: JsonDict = Field(default_factory=dict)

    @property
    def is_live(self) -> bool:
        return self.status in ATTEMPT_LIVE_STATUSES


class AttemptedRollout(Rollout):
    """A rollout together with the attempt a worker was given for it."""

    attempt: Attempt


class SpanStatus(_Model):
    """OpenTelemetry span status."""

    code: Literal["unset", "ok", "error"] = "unset"
    message: str | None = None


class SpanEvent(_Model):
    """OpenTelemetry span event."""

    name: str
    time: float
    attributes: JsonDict = Field(default_factory=dict)


class Span(_Model):
    """An OpenTelemetry-shaped span attributed to one attempt of one rollout.

    ``sequence_id`` is allocated by the store (strictly increasing within an attempt); leave it
    None when adding. Adding a span whose ``span_id`` the attempt already has returns the stored
    span unchanged, so a retried add never duplicates.
    """

    rollout_id: str = Field(min_length=1)
    attempt_id: str = Field(min_length=1)
    sequence_id: int | None = Field(default=None, description="Allocated by the store.")
    trace_id: str = Field(min_length=1, max_length=64)
    span_id: str = Field(min_length=1, max_length=64)
    parent_id: str | None = Field(default=None, max_length=64)
    name: str = Field(min_length=1, max_length=512)
    start_time: float
    end_time: float | None = None
    attributes: JsonDict = Field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    status: SpanStatus = Field(default_factory=SpanStatus)
    resource: JsonDict = Field(default_factory=dict, description="OpenTelemetry resource attributes.")

    @model_validator(mode="after")
    def _end_after_start(self) -> Span:
        if self.end_time is not None and self.end_time < self.start_time:
            raise ValueError("end_time must not be earlier than start_time")
        return self


class LLM(_Model):
    """An OpenAI-compatible model endpoint the agent should call."""

    kind: Literal["llm"] = "llm"
    endpoint: str = Field(description="Base URL, e.g. http://127.0.0.1:8000/v1.")
    model: str
    api_key: str | None = None
    sampling_parameters: JsonDict = Field(default_factory=dict, description="temperature, top_p, ...")
    agent_models: dict[str, str] = Field(
        default_factory=dict,
        description="The model that serves each agent of a multi-agent system, by the start of its "
        "name ({'write': 'base-write'} serves write_query's calls with base-write; the longest "
        "matching start wins): a gateway sends a call there when the call names its agent.",
    )

    def model_for(self, agent: str | None) -> str:
        """The model that serves ``agent``'s calls: its own in ``agent_models``, else ``model``."""
        key = None if agent is None else agent_key(self.agent_models, agent)
        return self.model if key is None else self.agent_models[key]


def agent_key(keys: Iterable[str], agent: str) -> str | None:
    """The longest of ``keys`` that ``agent`` starts with (None when it starts with none): how a
    multi-agent system's agents are given their own model or adapter.

    >>> agent_key(["write", "rewrite"], "rewrite_query"), agent_key(["write"], "check_query")
    ('rewrite', None)
    """
    matching = [key for key in keys if agent.startswith(key)]
    return max(matching, key=len) if matching else None


class PromptTemplate(_Model):
    """A prompt with placeholders, rendered with jinja2 or ``str.format`` (f-string) syntax."""

    kind: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["jinja", "f-string"] = "f-string"

    @property
    def placeholders(self) -> set[str]:
        """The variable names the template uses."""
        if self.engine == "f-string":
            return {name for _, name, _, _ in string.Formatter().parse(self.template) if name}
        import jinja2
        from jinja2 import meta

        return set(meta.find_undeclared_variables(jinja2.Environment().parse(self.template)))

    def format(self, **values: Any) -> str:
        """Render the template; a missing placeholder raises ``KeyError`` naming it."""
        if self.engine == "f-string":
            return self.template.format(**values)
        import jinja2

        env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
        try:
            return env.from_string(self.template).render(**values)
        except jinja2.UndefinedError as error:
            raise KeyError(str(error)) from error


Resource: TypeAlias = Annotated[LLM | PromptTemplate, Field(discriminator="kind")]
Resources: TypeAlias = dict[str, Resource]


class ResourcesVersion(_Model):
    """A named set of resources (LLM endpoint, prompts) with a store-assigned version number."""

    resources_id: str
    version: int = Field(ge=1, description="Increases with every put; the highest is the latest.")
    resources: dict[str, Resource]
    create_time: float


class ModelCall(_Model):
    """One model call as the gateway saw it: the heart of training data.

    Token ids are the engine's own, never re-tokenised text. A call whose upstream returned no ids
    has ``token_ids_missing`` set: it is kept for display and never becomes training data.
    """

    request: JsonDict = Field(description="Messages or prompt, tools and sampling parameters as sent.")
    response: JsonDict = Field(default_factory=dict, description="Text, tool calls, finish reason, usage.")
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    token_ids_missing: bool = False
    engine_replica: str | None = None
    model_version: int | None = Field(default=None, ge=0, description="The weights version that served it.")
    latency_seconds: float | None = Field(default=None, ge=0)
    agent_name: str | None = None
    requested_model: str | None = Field(
        default=None, description="The model the agent's code asked for, when the gateway served another."
    )
    error: str | None = None

    @model_validator(mode="after")
    def _ids_consistent(self) -> ModelCall:
        has_ids = self.prompt_token_ids is not None and self.response_token_ids is not None
        if not has_ids and not self.token_ids_missing and self.error is None:
            raise ValueError("prompt_token_ids and response_token_ids are required unless token_ids_missing")
        if (
            self.response_logprobs is not None
            and self.response_token_ids is not None
            and len(self.response_logprobs) != len(self.response_token_ids)
        ):
            raise ValueError("response_logprobs must have one entry per response token id")
        return self


class Reward(_Model):
    """A reward: one primary value, optionally with other named values beside it."""

    value: float = Field(description="The primary value, the one training optimises.")
    primary: str = Field(default="reward", description="Name of the primary value.")
    values: dict[str, float] = Field(default_factory=dict, description="All named values, primary included.")
    feedback: str | None = Field(default=None, description="The task's own words on the rollout.")

    @model_validator(mode="after")
    def _primary_matches(self) -> Reward:
        if self.values and self.values.get(self.primary) != self.value:
            raise ValueError(f"values[{self.primary!r}] must equal value when values are given")
        return self


class Worker(_Model):
    """A runner process as known from its heartbeats."""

    worker_id: str
    first_seen_time: float
    last_heartbeat_time: float
    stats: JsonDict = Field(default_factory=dict)


class StoreStats(_Model):
    """Counts over the whole store."""

    rollouts: dict[str, int] = Field(description="Rollout count per status.")
    attempts: dict[str, int] = Field(description="Attempt count per status.")
    spans: int
    workers: int
    resources_versions: int
