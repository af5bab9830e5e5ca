"""@rollout, Agent, the per-rollout context and the emit helpers, against a real store."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from fractions import Fraction
from typing import Any

import pytest

from fulgor import semconv
from fulgor.adapters import rollout_feedback
from fulgor.agent import (
    Agent,
    AgentError,
    RolloutContext,
    current_context,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    operation,
    rollout,
    use_context,
)
from fulgor.net.http_server import HttpReply, HttpRequest, error_reply, serve_http
from fulgor.store import MemoryStore
from fulgor.store.writer import SpanWriter
from fulgor.types import LLM, AttemptedRollout, PromptTemplate, RolloutRequest, Span

LLM_RESOURCE = LLM(endpoint="http://127.0.0.1:9/v1", model="m")
RESOURCES = {"llm": LLM_RESOURCE, "prompt_template": PromptTemplate(template="Q: {question}")}


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    store = MemoryStore()
    yield store
    await store.close()


@pytest.fixture
async def claimed(store: MemoryStore) -> AttemptedRollout:
    await store.enqueue([RolloutRequest(input={"question": "2+2", "answer": 4})])
    [claimed] = await store.claim("w")
    return claimed


async def run_in_context(store: MemoryStore, claimed: AttemptedRollout, body: Any) -> list[Span]:
    """Run ``body`` (sync callable or coroutine function) inside the rollout's context; return its spans."""
    writer = SpanWriter(store)
    writer.start()
    context = RolloutContext(claimed.rollout_id, claimed.attempt.attempt_id, writer, agent_name="solver")
    with use_context(context):
        if asyncio.iscoroutinefunction(body):
            await body()
        else:
            body()
    await writer.close()
    return await store.query_spans(claimed.rollout_id)


async def test_emit_helpers_record_spans_under_the_rollout(
    store: MemoryStore, claimed: AttemptedRollout
) -> None:
    def body() -> None:
        assert emit_reward(0.5).value == 0.5
        emit_reward({"correct": 1.0, "format": 0.0}, primary="correct")
        emit_message("thinking")
        emit_object({"answer": 4})
        emit_exception(ValueError("bad tool call"))

    spans = await run_in_context(store, claimed, body)
    assert [s.name for s in spans] == [
        semconv.SPAN_REWARD,
        semconv.SPAN_REWARD,
        semconv.SPAN_MESSAGE,
        semconv.SPAN_OBJECT,
        semconv.SPAN_EXCEPTION,
    ]
    assert [s.sequence_id for s in spans] == [1, 2, 3, 4, 5]
    assert {s.attempt_id for s in spans} == {claimed.attempt.attempt_id}
    assert len({s.trace_id for s in spans}) == 1
    assert spans[0].attributes[semconv.ATTR_REWARD_VALUE] == 0.5
    assert spans[1].attributes[semconv.ATTR_REWARD_VALUES] == {"correct": 1.0, "format": 0.0}
    assert spans[1].attributes[semconv.ATTR_REWARD_VALUE] == 1.0
    assert spans[2].attributes[semconv.ATTR_AGENT_NAME] == "solver"
    assert spans[3].attributes[semconv.ATTR_OBJECT_JSON] == '{"answer": 4}'
    assert spans[4].attributes[semconv.ATTR_EXCEPTION_TYPE] == "ValueError"
    assert "bad tool call" in spans[4].attributes[semconv.ATTR_EXCEPTION_STACKTRACE]
    assert spans[4].status.code == "error"
    # The first span moved the attempt (and rollout) from preparing to running.
    assert (await store.get_rollout(claimed.rollout_id)).status == "running"


async def test_a_reward_can_carry_the_tasks_feedback(store: MemoryStore, claimed: AttemptedRollout) -> None:
    def body() -> None:
        assert emit_reward(0.0, feedback="expected Birch").feedback == "expected Birch"
        emit_reward({"correct": 1.0}, feedback="correct: Birch")
        emit_reward(0.5)

    spans = await run_in_context(store, claimed, body)
    assert [s.attributes.get(semconv.ATTR_REWARD_FEEDBACK) for s in spans] == [
        "expected Birch",
        "correct: Birch",
        None,
    ]
    assert rollout_feedback(spans[:2]) == "correct: Birch"
    assert rollout_feedback(spans) is None  # the last reward's


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: emit_reward(1.0, feedback=3), "feedback must be text"),  # type: ignore[arg-type]
        (lambda: emit_reward({"a": 1.0, "b": 0.0}), "primary"),
        (lambda: emit_reward({"a": 1.0}, primary="b"), "not among"),
        (lambda: emit_reward(float("nan")), "finite"),
        (lambda: emit_reward("1"), "number"),  # type: ignore[arg-type]
        (lambda: emit_object({1, 2}), "JSON"),
        (lambda: emit_reward(1.0, primary=5), "primary must be the name"),  # type: ignore[arg-type]
    ],
)
async def test_bad_values_are_refused_and_record_nothing(
    store: MemoryStore, claimed: AttemptedRollout, call: Any, message: str
) -> None:
    def body() -> None:
        with pytest.raises(AgentError, match=message):
            call()

    assert await run_in_context(store, claimed, body) == []


def test_emit_outside_a_rollout_says_what_to_do() -> None:
    with pytest.raises(AgentError, match="no rollout is running"):
        emit_reward(1.0)


async def test_operations_nest_and_record_inputs_outputs_and_errors(
    store: MemoryStore, claimed: AttemptedRollout
) -> None:
    @operation
    def add(a: int, b: int) -> int:
        emit_message("adding")
        return a + b

    @operation("fetch")
    async def fetch(key: str) -> dict[str, str]:
        return {"key": key}

    async def body() -> None:
        with operation("plan", inputs={"goal": "sum"}) as plan:
            plan.set_output(add(2, 3))
            await fetch("k")
        with pytest.raises(KeyError), operation("fails"):
            raise KeyError("x")

    spans = {
        s.name if s.name != semconv.SPAN_OPERATION else s.attributes[semconv.ATTR_OPERATION_NAME]: s
        for s in await run_in_context(store, claimed, body)
    }
    plan, added, fetched, message = (
        spans["plan"],
        spans[add.__qualname__],
        spans["fetch"],
        spans[semconv.SPAN_MESSAGE],
    )
    assert plan.parent_id is None
    assert added.parent_id == plan.span_id
    assert fetched.parent_id == plan.span_id
    assert message.parent_id == added.span_id
    assert added.attributes[semconv.ATTR_OPERATION_INPUT] == {"a": 2, "b": 3}
    assert added.attributes[semconv.ATTR_OPERATION_OUTPUT] == 5
    assert plan.attributes[semconv.ATTR_OPERATION_OUTPUT] == 5
    assert fetched.attributes[semconv.ATTR_OPERATION_OUTPUT] == {"key": "k"}
    assert spans["fails"].status.code == "error"
    assert plan.end_time is not None
    assert plan.start_time <= added.start_time <= plan.end_time


async def test_threads_and_tasks_started_by_the_agent_stay_attributed(
    store: MemoryStore, claimed: AttemptedRollout
) -> None:
    async def body() -> None:
        async def child(i: int) -> None:
            emit_message(f"task {i}")

        await asyncio.gather(*(child(i) for i in range(3)))
        await asyncio.to_thread(emit_message, "to_thread")
        import contextvars

        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(emit_message, "thread"))
        thread.start()
        thread.join()

    spans = await run_in_context(store, claimed, body)
    assert sorted(s.attributes[semconv.ATTR_MESSAGE_BODY] for s in spans) == [
        "task 0",
        "task 1",
        "task 2",
        "thread",
        "to_thread",
    ]
    assert {s.rollout_id for s in spans} == {claimed.rollout_id}


async def test_a_bare_thread_is_told_how_to_carry_the_rollout(
    store: MemoryStore, claimed: AttemptedRollout
) -> None:
    """Plain threads do not copy contextvars: the error names the remedy, and the remedy works."""
    failures: list[BaseException] = []

    def bare() -> None:
        try:
            emit_message("lost")
        except AgentError as error:
            failures.append(error)

    def carried(context: RolloutContext) -> None:
        with use_context(context):
            emit_message("carried")

    def body() -> None:
        for thread in (
            threading.Thread(target=bare),
            threading.Thread(target=carried, args=(current_context(),)),
        ):
            thread.start()
            thread.join()

    spans = await run_in_context(store, claimed, body)
    [failure] = failures
    assert "copy_context().run" in str(failure)
    assert "use_context" in str(failure)
    assert [s.attributes[semconv.ATTR_MESSAGE_BODY] for s in spans] == ["carried"]


async def test_outside_a_rollout_emit_reward_posts_to_the_reward_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a program a SubprocessAgent runs there is no rollout in the process, only the URL."""
    bodies: list[bytes] = []

    async def handle(request: HttpRequest) -> HttpReply:
        bodies.append(request.body)
        if len(bodies) == 1:
            return HttpReply(body=b"{}")
        return error_reply(400, "validation_error", "this rollout already ended")

    server = await serve_http(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("FULGOR_REWARD_URL", f"http://127.0.0.1:{port}/reward/t")
    # A proxy in the environment (nothing listens there) must not be used for the runner's endpoint.
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    try:
        reward = await asyncio.to_thread(emit_reward, {"correct": 1.0, "format": 0.5}, primary="correct")
        assert reward.value == 1.0
        with pytest.raises(AgentError, match=r"HTTP 400.*already ended"):
            await asyncio.to_thread(emit_reward, 1.0)
    finally:
        server.close()
        await server.wait_closed()
    assert json.loads(bodies[0]) == {"values": {"correct": 1.0, "format": 0.5}, "primary": "correct"}
    with pytest.raises(AgentError, match="could not post the reward") as failed:
        await asyncio.to_thread(emit_reward, 1.0)  # nobody listens on the port any more
    assert "/reward/t" not in str(failed.value)  # the URL holds the rollout's token


async def test_rollout_functions_and_agents_get_arguments_by_name(
    store: MemoryStore, claimed: AttemptedRollout
) -> None:
    seen: dict[str, Any] = {}

    @rollout
    def sync_agent(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> float:
        seen["sync"] = (task["question"], llm.model, prompt_template.format(question=task["question"]))
        return 1.0

    @rollout(name="async-solver")
    async def async_agent(task: dict[str, Any], rollout: Any) -> None:
        seen["async"] = rollout.rollout_id
        emit_reward(0.25)

    class ClassAgent(Agent):
        def rollout(self, task: dict[str, Any], resources: dict[str, Any]) -> float:
            seen["class"] = sorted(resources)
            return 0.0

    assert sync_agent.name == "sync_agent"
    assert async_agent.name == "async-solver"
    assert ClassAgent().name == "ClassAgent"
    results: list[float | None] = []

    async def body() -> None:
        for agent in (sync_agent, async_agent, ClassAgent()):
            results.append(await agent.run(claimed.input, RESOURCES, claimed))

    spans = await run_in_context(store, claimed, body)
    assert results == [1.0, None, 0.0]
    assert seen == {
        "sync": ("2+2", "m", "Q: 2+2"),
        "async": claimed.rollout_id,
        "class": ["llm", "prompt_template"],
    }
    assert [s.attributes[semconv.ATTR_REWARD_VALUE] for s in spans] == [1.0, 0.25, 0.0]
    # Calling the decorated function directly still calls the function.
    assert sync_agent({"question": "q"}, LLM_RESOURCE, RESOURCES["prompt_template"]) == 1.0


async def test_missing_argument_and_bad_return_are_clear(
    store: MemoryStore, claimed: AttemptedRollout
) -> None:
    @rollout
    def needs_db(task: Any, database: Any) -> float:
        return 1.0

    @rollout
    def returns_text(task: Any) -> str:
        return "correct"

    async def body() -> None:
        with pytest.raises(AgentError, match="'database' has no value"):
            await needs_db.run(claimed.input, RESOURCES, claimed)
        with pytest.raises(AgentError, match="returned str"):
            await returns_text.run(claimed.input, RESOURCES, claimed)

    assert await run_in_context(store, claimed, body) == []


def test_agent_subclass_without_rollout_is_refused() -> None:
    with pytest.raises(TypeError, match="must define rollout"):

        class Empty(Agent):
            pass


async def test_rewards_may_be_any_real_number_type(store: MemoryStore, claimed: AttemptedRollout) -> None:
    """numpy.float32, a Fraction: reward checks return such numbers, and they are numbers."""
    numpy = pytest.importorskip("numpy")

    @rollout
    def scored(task: Any) -> Any:
        return numpy.float32(0.5)

    async def body() -> None:
        emit_reward({"exact": Fraction(1, 4), "format": numpy.float32(1.0)}, primary="exact")
        await scored.run(claimed.input, RESOURCES, claimed)

    spans = await run_in_context(store, claimed, body)
    assert spans[0].attributes[semconv.ATTR_REWARD_VALUES] == {"exact": 0.25, "format": 1.0}
    assert spans[1].attributes[semconv.ATTR_REWARD_VALUE] == 0.5
