"""The Trainer with each rollout attempt as a Kubernetes Job (``Trainer(runners=KubernetesRunners(...))``),
against the simulated Kubernetes API server of ``fulgor.testing`` (no real cluster is at hand): the
official ``kubernetes`` client creates, lists and deletes the Jobs over HTTP, and the simulation
runs each Job's container command as a local process with the Job's environment. A zero-code
program calls the model through the real gateway and posts its reward to the trainer's server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes extra is installed by make test")

from examples.calc.dataset import make_splits
from fulgor import GRPO, KubernetesRunners, RolloutConfig, SubprocessAgent, Trainer, semconv
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.net.sockets import bind_socket
from fulgor.store.sqlite import SqliteStore
from fulgor.testing.kubernetes_api import SimulatedKubernetesAPI
from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply

PROGRAM = """
import json, os, sys, urllib.request
from openai import OpenAI

task = json.loads(os.environ["FULGOR_TASK"])
if task.get("fail_first") and not open(task["seen"]).read():
    open(task["seen"], "a").write(os.environ["FULGOR_ATTEMPT_ID"] + "\\n")
    sys.exit("this attempt fails on purpose")
reply = OpenAI().chat.completions.create(
    model=os.environ["FULGOR_MODEL"], messages=[{"role": "user", "content": task["question"]}]
)
value = 1.0 if reply.choices[0].message.content.strip() == str(task["answer"]) else 0.0
body = json.dumps({"value": value, "feedback": os.environ["AGENT_SETTING"]}).encode()
urllib.request.urlopen(urllib.request.Request(os.environ["FULGOR_REWARD_URL"], data=body))
"""

TEMPLATE = """
apiVersion: batch/v1
kind: Job
metadata:
  labels:
    team: research
spec:
  ttlSecondsAfterFinished: 600
  template:
    metadata:
      labels:
        app: calc-agent
    spec:
      serviceAccountName: fulgor-agent
      containers:
        - name: agent
          image: registry.example.com/calc-agent:1
          env:
            - name: AGENT_SETTING
              value: from-the-template-{{ run }}
"""


@pytest.fixture
def program(tmp_path: Path) -> SubprocessAgent:
    path = tmp_path / "agent.py"
    path.write_text(PROGRAM)
    return SubprocessAgent([sys.executable, str(path)], name="calc-program")


def kubernetes_runners(api: SimulatedKubernetesAPI, tmp_path: Path, **options: Any) -> KubernetesRunners:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    options = {"poll_seconds": 0.2, **options}
    return KubernetesRunners(template=TEMPLATE, run="calc", kubeconfig=str(kubeconfig), **options)


async def attempts_of(path: Path) -> list[list[tuple[str, str | None]]]:
    store = SqliteStore(path)
    try:
        found = []
        for rollout in await store.query_rollouts():
            attempts = await store.list_attempts(rollout.rollout_id)
            found.append([(attempt.status, attempt.error) for attempt in attempts])
        return found
    finally:
        await store.close()


async def rewards_of(path: Path) -> list[float]:
    store = SqliteStore(path)
    try:
        found = []
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id, name=semconv.SPAN_REWARD)
            found += [span.attributes[semconv.ATTR_REWARD_VALUE] for span in spans]
        return found
    finally:
        await store.close()


def test_dev_runs_each_rollout_as_a_job_through_the_gateway(tmp_path: Path, program: SubprocessAgent) -> None:
    tasks = [{"question": "2+2", "answer": 4}, {"question": "2+3", "answer": 5}]
    with (
        SimulatedKubernetesAPI(token="cluster-token") as api,
        ScriptedOpenAIServer(default_reply=ScriptedReply(text="4")) as upstream,
    ):
        trainer = Trainer(
            algorithm=GRPO(),
            upstream=upstream.url,
            model="scripted",
            run_dir=tmp_path / "run",
            runners=kubernetes_runners(api, tmp_path),
            rollout_config=RolloutConfig(timeout_seconds=60, max_attempts=1),
            progress=False,
        )
        report = trainer.dev(program, tasks)
        created, deletions = api.created, api.deletions
        left, running = api.jobs(), api.processes_running()
    assert [(r.status, r.reward, r.model_calls) for r in report.rollouts] == [
        ("succeeded", 1.0, 1),
        ("succeeded", 0.0, 1),
    ]
    assert len(upstream.samples) == 2
    assert len(created) == 2
    assert not left
    assert running == 0
    assert sorted(name for name, _ in deletions) == sorted(job["metadata"]["name"] for job in created)
    assert {policy for _, policy in deletions} == {"Background"}
    job = created[0]
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 60
    assert job["spec"]["ttlSecondsAfterFinished"] == 600  # the template's own fields are kept
    labels = job["metadata"]["labels"]
    assert labels["team"] == "research"
    assert labels["fulgor.dev/run"] == "calc"
    assert labels["fulgor.dev/rollout-id"] == env["FULGOR_ROLLOUT_ID"]
    assert labels["fulgor.dev/attempt-id"] == env["FULGOR_ATTEMPT_ID"]
    assert job["metadata"]["name"] == f"calc-{env['FULGOR_ATTEMPT_ID']}"
    assert env["OPENAI_API_KEY"].startswith("fulgor-attempt-")
    assert f"/r/{env['FULGOR_ROLLOUT_ID']}/{env['FULGOR_ATTEMPT_ID']}/v1" in env["OPENAI_BASE_URL"]
    assert "FULGOR_TOKEN" not in env
    assert container["command"] == program.command
    assert env["AGENT_SETTING"] == "from-the-template-calc"


def test_a_failed_job_fails_its_attempt_and_the_retry_succeeds(
    tmp_path: Path, program: SubprocessAgent
) -> None:
    seen = tmp_path / "seen"
    seen.write_text("")
    task = {"question": "2+2", "answer": 4, "fail_first": True, "seen": str(seen)}
    with bind_socket("127.0.0.1", 0) as probe:  # a free port, for a URL known before the session
        port = probe.getsockname()[1]
    server_url = f"http://localhost:{port}"  # not the address it listens on: the URL the pods are given
    with (
        SimulatedKubernetesAPI() as api,
        ScriptedOpenAIServer(default_reply=ScriptedReply(text="4")) as upstream,
    ):
        trainer = Trainer(
            algorithm=GRPO(),
            upstream=upstream.url,
            model="scripted",
            run_dir=tmp_path / "run",
            runners=kubernetes_runners(api, tmp_path, listen_port=port, server_url=server_url),
            rollout_config=RolloutConfig(timeout_seconds=60, max_attempts=2, retry_on=("failed",)),
            progress=False,
        )
        report = trainer.dev(program, [task])
        created = api.created
        assert not api.jobs()
        assert api.processes_running() == 0
    assert [(r.status, r.reward) for r in report.rollouts] == [("succeeded", 1.0)]
    [[(first, error), (second, _)]] = asyncio.run(attempts_of(tmp_path / "run" / "store.sqlite"))
    assert (first, second) == ("failed", "succeeded")
    assert error is not None
    assert "Job calc-at-" in error
    assert "BackoffLimitExceeded" in error
    for job in created:
        env = {
            item["name"]: item["value"] for item in job["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["OPENAI_BASE_URL"].startswith(f"{server_url}/r/")
        assert env["FULGOR_REWARD_URL"].startswith(f"{server_url}/v1/rewards/")


GRPO_PROGRAM = """
import json, os
import fulgor
from openai import OpenAI

task = json.loads(os.environ["FULGOR_TASK"])
reply = OpenAI().chat.completions.create(
    model=os.environ["FULGOR_MODEL"], messages=[{"role": "user", "content": task["question"]}], max_tokens=8
)
fulgor.emit_reward(float(len(reply.choices[0].message.content or "") % 2))  # posts to FULGOR_REWARD_URL
"""


def test_grpo_trains_a_step_on_rollouts_run_as_jobs(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(GRPO_PROGRAM)
    program = SubprocessAgent([sys.executable, str(tmp_path / "agent.py")], name="calc-program")
    model = init_model(tmp_path / "tiny", "tiny", seed=0)
    splits = make_splits(seed=0, sizes=(8, 4, 4))
    with SimulatedKubernetesAPI() as api:
        trainer = Trainer(
            algorithm=GRPO(group_size=2, batch_tasks=2, max_steps=1, max_tokens=8, val_every=1),
            engine=EngineConfig(model=model, device="cpu"),
            run_dir=tmp_path / "run",
            runners=kubernetes_runners(api, tmp_path),
            progress=False,
        )
        history = trainer.fit(program, splits["train"], splits["val"][:2])
        created, left, running = api.created, api.jobs(), api.processes_running()
    rewards = asyncio.run(rewards_of(tmp_path / "run" / "store.sqlite"))
    assert [m["step"] for m in history] == [0, 1]
    assert (history[1]["rollouts"], history[1]["rollouts_failed"]) == (4, 0)
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "config.json").is_file()
    assert len(created) == 8  # 2 tasks x 2, and 2 validation rollouts before the step and after it
    assert len(rewards) == 8  # each program's own reward, posted by fulgor.emit_reward
    assert not left
    assert running == 0
