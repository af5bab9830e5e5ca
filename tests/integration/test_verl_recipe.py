"""The CPU half of docs/scale-out.md's verl recipe, end to end: ``fulgor serve --upstream`` records an
agent's rollouts run by ``fulgor runner``, ``python -m fulgor.training.verl_export`` writes them as
verl's DataProto, and verl's own GRPO estimator runs on what it reads back.

The upstream is fulgor.testing's scripted OpenAI-compatible server, which answers with token ids and
logprobs as vLLM does: the vLLM server and verl's trainer are the GPU half, not run here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fulgor import LLM, RolloutRequest
from fulgor.store.client import StoreClient
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply

pytest.importorskip(
    "verl", reason="the verl bridge needs verl: pip install --no-deps -r requirements-verl.txt"
)
ROOT = Path(__file__).resolve().parents[2]
# Two groups (tasks) of two rollouts; the reply "ab" has the letter of the first of each only.
TASKS = [("g1", "a"), ("g1", "z"), ("g2", "b"), ("g2", "y")]


def start(command: list[str]) -> subprocess.Popen[str]:
    paths = [str(ROOT / "tests" / "integration"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.Popen(
        [sys.executable, "-m", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


async def record(url: str) -> list[str]:
    store = StoreClient(url)
    try:
        await store.put_resources({"llm": LLM(endpoint="http://unused/v1", model="scripted-model")})
        requests = [
            RolloutRequest(input={"prompt": f"say {letter}", "letter": letter}, group_id=group)
            for group, letter in TASKS
        ]
        ids = [rollout.rollout_id for rollout in await store.enqueue(requests)]
        runner = start(
            ["fulgor.cli.main", "runner", "--agent", "sample_agents.chat_agent:one_call",
             "--store", url, "--gateway-url", url, "--max-concurrency", "2", "--heartbeat-seconds", "1"]
        )  # fmt: skip
        try:
            done = await store.wait(ids, timeout_seconds=60)
        finally:
            stop(runner)
        assert [rollout.status for rollout in done] == ["succeeded"] * len(TASKS), runner.stderr.read()
        return ids
    finally:
        await store.close()


async def read_in_process(path: Path, rollout_ids: list[str]) -> list[str]:
    from fulgor.algorithms.verl import to_data_proto
    from fulgor.store import SqliteStore
    from fulgor.training.verl_export import read_trajectories

    store = SqliteStore(path)
    try:
        trajectories, _, _ = await read_trajectories(store, rollout_ids=rollout_ids)
    finally:
        await store.close()
    return sorted(to_data_proto(trajectories).non_tensor_batch["rollout_id"])


def test_rollouts_recorded_through_serve_export_as_verl_data_its_grpo_reads(tmp_path: Path) -> None:
    from verl import DataProto

    from fulgor.algorithms.verl import compute_advantages

    with ScriptedOpenAIServer(default_reply=ScriptedReply(text="ab")) as upstream:
        serve = start(
            ["fulgor.cli.main", "serve", "--port", "0", "--upstream", upstream.url,
             "--store", f"sqlite:///{tmp_path}/store.sqlite"]
        )  # fmt: skip
        try:
            assert serve.stdout is not None
            ids = asyncio.run(record(serve.stdout.readline().strip()))
        finally:
            stop(serve)
    out = tmp_path / "verl" / "batch.dataproto"
    export = subprocess.run(
        [sys.executable, "-m", "fulgor.training.verl_export", str(tmp_path / "store.sqlite"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert export.returncode == 0, export.stderr
    assert "wrote 4 samples of 4 rollouts in 2 groups" in export.stdout

    data = DataProto.load_from_disk(str(out))
    by_rollout = {rollout_id: b for b, rollout_id in enumerate(data.non_tensor_batch["rollout_id"])}
    assert sorted(by_rollout) == sorted(ids)
    samples = {tuple(sample.prompt_token_ids): sample for sample in upstream.samples}
    for b in range(len(data)):
        mask = data.batch["response_mask"][b].bool()
        prompt = data.batch["prompts"][b][
            data.batch["attention_mask"][b, : data.batch["prompts"].shape[1]].bool()
        ]
        sample = samples[tuple(prompt.tolist())]  # the call the engine answered, token for token
        assert data.batch["responses"][b][mask].tolist() == sample.token_ids
        assert data.batch["rollout_log_probs"][b][mask].tolist() == pytest.approx(sample.logprobs)
    rewards = data.batch["token_level_rewards"].sum(-1)
    assert [float(rewards[by_rollout[i]]) for i in ids] == [1.0, 0.0, 1.0, 0.0]
    assert [data.non_tensor_batch["uid"][by_rollout[i]] for i in ids] == ["g1", "g1", "g2", "g2"]

    in_process = asyncio.run(read_in_process(tmp_path / "store.sqlite", ids[:2]))
    assert in_process == sorted(ids[:2])  # one step's rollouts, read without a file

    advantages = compute_advantages(data, "verl:grpo")
    per_sample = (advantages * data.batch["response_mask"]).sum(-1) / data.batch["response_mask"].sum(-1)
    assert [round(float(per_sample[by_rollout[i]]), 3) for i in ids] == [0.707, -0.707, 0.707, -0.707]
