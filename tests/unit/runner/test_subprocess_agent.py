"""Zero-code agents: a bash script with curl and a Python script, run per rollout by the runner."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from tests.process_support import gone_within

from fulgor import semconv
from fulgor.runner import ProgramResult, Runner, RunnerConfig, SubprocessAgent
from fulgor.store import MemoryStore
from fulgor.types import LLM, PromptTemplate, RolloutConfig, RolloutRequest

FAST = RunnerConfig(max_concurrency=2, claim_wait_seconds=0.2, heartbeat_seconds=0.1)


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    store = MemoryStore()
    await store.put_resources({"llm": LLM(endpoint="http://127.0.0.1:9/r/x/y/v1", model="tiny", api_key="k")})
    yield store
    await store.close()


async def run_all(
    store: MemoryStore, agent: SubprocessAgent, inputs: list[object], **config: float
) -> list[str]:
    created = await store.enqueue([RolloutRequest(input=i, config=RolloutConfig(**config)) for i in inputs])
    runner = Runner(agent, store, config=FAST)
    task = asyncio.create_task(runner.run())
    done = await store.wait([r.rollout_id for r in created], timeout_seconds=30)
    runner.stop()
    await task
    assert len(done) == len(created)
    return [r.rollout_id for r in created]


async def rewards(store: MemoryStore, rollout_id: str) -> list[float]:
    spans = await store.query_spans(rollout_id, name=semconv.SPAN_REWARD)
    return [s.attributes[semconv.ATTR_REWARD_VALUE] for s in spans]


async def test_bash_script_with_curl_posts_its_reward(store: MemoryStore, tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text(
        textwrap.dedent(
            """\
            #!/usr/bin/env bash
            set -euo pipefail
            value=0.0
            if [[ "$FULGOR_TASK" == '{"answer": 4}' ]]; then value=1.0; fi
            curl -sf -o /dev/null -H 'Content-Type: application/json' \\
              -d "{\\"value\\": $value}" "$FULGOR_REWARD_URL"
            echo "base=$OPENAI_BASE_URL anthropic=$ANTHROPIC_BASE_URL" \\
              "key=$OPENAI_API_KEY anthropic_key=$ANTHROPIC_API_KEY id=$FULGOR_ROLLOUT_ID"
            """
        )
    )
    script.chmod(0o755)
    right, wrong = await run_all(store, SubprocessAgent([str(script)]), [{"answer": 4}, {"answer": 5}])
    assert await rewards(store, right) == [1.0]
    assert await rewards(store, wrong) == [0.0]
    [message] = await store.query_spans(right, name=semconv.SPAN_MESSAGE)
    assert message.attributes[semconv.ATTR_MESSAGE_BODY].strip() == (
        "base=http://127.0.0.1:9/r/x/y/v1 anthropic=http://127.0.0.1:9/r/x/y key=k anthropic_key=k "
        f"id={right}"
    )
    assert (await store.get_rollout(right)).status == "succeeded"


async def test_python_script_posts_named_rewards_and_bad_posts_get_clear_errors(
    store: MemoryStore, tmp_path: Path
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            """\
            import json, os, urllib.request, urllib.error

            def post(body):
                url = os.environ["FULGOR_REWARD_URL"]
                request = urllib.request.Request(url, data=json.dumps(body).encode())
                try:
                    with urllib.request.urlopen(request) as response:
                        return response.status, json.load(response)
                except urllib.error.HTTPError as error:
                    return error.code, json.load(error)

            bad = post({"reward": 1})
            wrong_primary = post({"values": {"a": 1.0}, "primary": "b"})
            good = post({"values": {"correct": 1.0, "format": 0.5}, "primary": "correct"})
            forged = urllib.request.Request(os.environ["FULGOR_REWARD_URL"] + "x", data=b'{"value": 1}')
            try:
                urllib.request.urlopen(forged)
            except urllib.error.HTTPError as error:
                forged_status = error.code
            print(json.dumps([bad, wrong_primary, good, forged_status]))
            """
        )
    )
    [rollout_id] = await run_all(store, SubprocessAgent([sys.executable, str(script)]), [{}])
    [message] = await store.query_spans(rollout_id, name=semconv.SPAN_MESSAGE)
    bad, wrong_primary, good, forged_status = json.loads(message.attributes[semconv.ATTR_MESSAGE_BODY])
    assert bad[0] == 400
    assert "value" in bad[1]["error"]["message"]
    assert wrong_primary[0] == 400
    assert "not among" in wrong_primary[1]["error"]["message"]
    assert good == [200, {"value": 1.0, "primary": "correct"}]
    assert forged_status == 404
    assert await rewards(store, rollout_id) == [1.0]


async def test_bad_reward_bodies_get_a_400_not_a_dropped_connection(store: MemoryStore) -> None:
    script = textwrap.dedent(
        """\
        import json, os, urllib.request, urllib.error

        def post(data):
            request = urllib.request.Request(os.environ["FULGOR_REWARD_URL"], data=data)
            try:
                with urllib.request.urlopen(request) as response:
                    return response.status, json.load(response)
            except urllib.error.HTTPError as error:
                return error.code, json.load(error)

        print(json.dumps([post(b'{"value": 1.0, "primary": 5}'), post(b'{"value": "\\xff"}')]))
        """
    )
    [rollout_id] = await run_all(store, SubprocessAgent([sys.executable, "-c", script]), [{}])
    [message] = await store.query_spans(rollout_id, name=semconv.SPAN_MESSAGE)
    wrong_primary, not_utf8 = json.loads(message.attributes[semconv.ATTR_MESSAGE_BODY])
    assert wrong_primary[0] == 400
    assert "primary must be the name" in wrong_primary[1]["error"]["message"]
    assert not_utf8[0] == 400
    assert "send JSON like" in not_utf8[1]["error"]["message"]
    assert await rewards(store, rollout_id) == []


async def test_fulgor_emit_reward_in_the_program_posts_to_the_runner(store: MemoryStore) -> None:
    program = [sys.executable, "-c", "import fulgor; fulgor.emit_reward(0.75)"]
    [rollout_id] = await run_all(store, SubprocessAgent(program), [{}])
    [attempt] = await store.list_attempts(rollout_id)
    assert (attempt.status, attempt.error) == ("succeeded", None)
    assert await rewards(store, rollout_id) == [0.75]


async def test_a_task_too_large_for_the_environment_comes_in_a_file(store: MemoryStore) -> None:
    seen: list[tuple[ProgramResult, bool]] = []

    def reward(result: ProgramResult) -> float:
        seen.append((result, os.path.exists(result.stdout.split()[0])))  # the file, once it ended
        return 1.0

    program = [
        sys.executable,
        "-c",
        "import json, os; path = os.environ['FULGOR_TASK_FILE']; "
        "print(path, 'FULGOR_TASK' in os.environ, len(json.load(open(path))['text']))",
    ]
    big, small = {"text": "a" * 200_000}, {"text": "ab"}
    await run_all(store, SubprocessAgent(program, reward_fn=reward), [big, small])
    results = {result.task["text"][:2]: (*result.stdout.split()[1:], left) for result, left in seen}
    assert results["aa"] == ("False", "200000", False)  # not in the environment; file cleaned up
    assert results["ab"] == ("True", "2", False)


async def test_a_slow_reward_function_does_not_block_the_event_loop(store: MemoryStore) -> None:
    # The reward function waits for the event loop to answer: run on the loop, it would wait alone.
    loop = asyncio.get_running_loop()
    started, answered = asyncio.Event(), threading.Event()

    def reward(result: ProgramResult) -> float:
        loop.call_soon_threadsafe(started.set)
        return 1.0 if answered.wait(timeout=5) else 0.0

    async def answer() -> None:
        await started.wait()
        answered.set()

    answering = asyncio.create_task(answer())
    [rollout_id] = await run_all(store, SubprocessAgent(["true"], reward_fn=reward), [{}])
    await answering
    assert await rewards(store, rollout_id) == [1.0]


async def test_reward_function_over_output_and_exit_code(store: MemoryStore) -> None:
    def reward(result: ProgramResult) -> float:
        return 1.0 if result.exit_code == 3 and result.stdout.strip() == str(result.task["n"] * 2) else 0.0

    program = [
        sys.executable,
        "-c",
        "import json,os,sys; print(json.loads(os.environ['FULGOR_TASK'])['n']*2); sys.exit(3)",
    ]
    [rollout_id] = await run_all(store, SubprocessAgent(program, reward_fn=reward), [{"n": 21}])
    assert await rewards(store, rollout_id) == [1.0]
    assert (await store.get_rollout(rollout_id)).status == "succeeded"


async def test_nonzero_exit_without_reward_function_fails_with_stderr(store: MemoryStore) -> None:
    program = [sys.executable, "-c", "import sys; sys.stderr.write('no API key'); sys.exit(2)"]
    [rollout_id] = await run_all(store, SubprocessAgent(program), [{}])
    [attempt] = await store.list_attempts(rollout_id)
    assert attempt.status == "failed"
    assert attempt.error is not None
    assert "exited with code 2: no API key" in attempt.error


async def test_timeout_kills_the_whole_process_group(store: MemoryStore, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = f"sleep 300 & echo $! > {pid_file}; wait"
    started = time.monotonic()
    [rollout_id] = await run_all(store, SubprocessAgent(["bash", "-c", script]), [{}], timeout_seconds=1.0)
    assert time.monotonic() - started < 15
    [attempt] = await store.list_attempts(rollout_id)
    assert attempt.status == "timeout"
    grandchild = int(pid_file.read_text())
    assert gone_within(grandchild, seconds=5)


async def test_a_program_that_exits_ends_its_rollout_despite_a_background_child(
    store: MemoryStore, tmp_path: Path
) -> None:
    # The background child inherits the program's stdout and stderr and would keep them open for
    # its whole life: the rollout must end with the program, not with the child or the timeout.
    pid_file = tmp_path / "grandchild.pid"
    script = (
        f"sleep 300 & echo $! > {pid_file}; "
        """curl -sf -o /dev/null -d '{"value": 1.0}' "$FULGOR_REWARD_URL"; echo posted; echo oops >&2"""
    )
    started = time.monotonic()
    [rollout_id] = await run_all(store, SubprocessAgent(["bash", "-c", script]), [{}], timeout_seconds=20)
    assert time.monotonic() - started < 5
    [attempt] = await store.list_attempts(rollout_id)
    assert (attempt.status, attempt.error) == ("succeeded", None)
    assert await rewards(store, rollout_id) == [1.0]
    [message] = await store.query_spans(rollout_id, name=semconv.SPAN_MESSAGE)
    assert message.attributes[semconv.ATTR_MESSAGE_BODY] == "posted\n"
    assert gone_within(int(pid_file.read_text()), seconds=5)


async def test_only_the_tail_of_a_long_output_is_kept(store: MemoryStore) -> None:
    seen: list[ProgramResult] = []

    def reward(result: ProgramResult) -> float:
        seen.append(result)
        return 1.0

    program = [
        sys.executable,
        "-c",
        "import sys; sys.stdout.write('a' * 100_000 + 'end'); sys.stderr.write('e')",
    ]
    await run_all(store, SubprocessAgent(program, reward_fn=reward), [{}])
    [result] = seen
    assert len(result.stdout) == 64 * 1024
    assert result.stdout.endswith("aend")
    assert result.stderr == "e"


async def test_rollouts_that_start_together_share_one_reward_server(store: MemoryStore) -> None:
    program = ["bash", "-c", 'echo "$FULGOR_REWARD_URL"']
    rollout_ids = await run_all(store, SubprocessAgent(program), [{}, {}])  # both claimed at once
    ports = set()
    for rollout_id in rollout_ids:
        [message] = await store.query_spans(rollout_id, name=semconv.SPAN_MESSAGE)
        ports.add(urlsplit(message.attributes[semconv.ATTR_MESSAGE_BODY].strip()).port)
    for port in ports:  # the last rollout out closed the server
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
    assert len(ports) == 1, f"one reward server per rollout: {ports}"


def test_empty_command_is_refused() -> None:
    from fulgor.agent import AgentError

    with pytest.raises(AgentError, match="needs a command"):
        SubprocessAgent([])
    assert os.path.basename(SubprocessAgent(["python", "x/agent.py"]).name) == "agent.py"


async def test_the_program_gets_the_rollouts_root_on_the_gateway(store: MemoryStore) -> None:
    program = ["bash", "-c", 'echo "$FULGOR_BASE_URL $FULGOR_MODEL"']
    [rollout_id] = await run_all(store, SubprocessAgent(program), [{}])
    [message] = await store.query_spans(rollout_id, name=semconv.SPAN_MESSAGE)
    # The llm resource's endpoint without its /v1: where the rollout's API paths start.
    assert message.attributes[semconv.ATTR_MESSAGE_BODY] == "http://127.0.0.1:9/r/x/y tiny\n"


async def test_the_program_gets_its_attempt_id(store: MemoryStore) -> None:
    [rollout_id] = await run_all(store, SubprocessAgent(["bash", "-c", 'echo "$FULGOR_ATTEMPT_ID"']), [{}])
    [message] = await store.query_spans(rollout_id, name=semconv.SPAN_MESSAGE)
    [attempt] = await store.list_attempts(rollout_id)
    assert message.attributes[semconv.ATTR_MESSAGE_BODY] == f"{attempt.attempt_id}\n"


async def test_the_program_gets_every_resource_and_can_post_feedback(store: MemoryStore) -> None:
    await store.put_resources(
        {
            "llm": LLM(endpoint="http://127.0.0.1:9/r/x/y/v1", model="tiny"),
            "prompt_template": PromptTemplate(template="Solve {question}."),
        }
    )
    program = textwrap.dedent(
        """
        import json, os, fulgor
        prompt = json.loads(os.environ["FULGOR_RESOURCES"])["prompt_template"]["template"]
        fulgor.emit_reward(0.5, feedback="used " + prompt)
        """
    )
    [rollout_id] = await run_all(store, SubprocessAgent([sys.executable, "-c", program]), [{}])
    [reward] = await store.query_spans(rollout_id, name=semconv.SPAN_REWARD)
    assert reward.attributes[semconv.ATTR_REWARD_VALUE] == 0.5
    assert reward.attributes[semconv.ATTR_REWARD_FEEDBACK] == "used Solve {question}."
