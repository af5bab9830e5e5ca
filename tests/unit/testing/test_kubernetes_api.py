"""The simulated Kubernetes API server speaks the REST protocol the official client expects: Jobs
created, listed by label, read and deleted, errors as Status objects, and each Job run as a local
process whose exit, or deadline, sets the Job's conditions."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("kubernetes", reason="the kubernetes extra is installed by make test")

from kubernetes import client, config

from fulgor.testing.kubernetes_api import SimulatedKubernetesAPI


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SimulatedKubernetesAPI, Any]]:
    with SimulatedKubernetesAPI(token="secret") as api:
        configuration = client.Configuration()
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", namespace="agents")
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        with client.ApiClient(configuration) as api_client:
            yield api, client.BatchV1Api(api_client)


def job(name: str, code: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "unused:1", "command": [sys.executable, "-c", code],
                 "env": [{"name": "GREETING", "value": "hello"}]}  # fmt: skip
    pod = {"restartPolicy": "Never", "containers": [container]}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"template": {"spec": pod}, **spec}}


def wait_for_condition(batch: Any, name: str) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = batch.read_namespaced_job(name, "agents")
        if found.status.conditions:
            return found
        time.sleep(0.05)
    raise AssertionError(f"Job {name} never finished")


def test_a_job_runs_its_command_with_its_env_and_completes(
    served: tuple[SimulatedKubernetesAPI, Any],
) -> None:
    api, batch = served
    created = batch.create_namespaced_job("agents", job("ok", "import os; print(os.environ['GREETING'])"))
    assert created.metadata.uid
    assert created.metadata.namespace == "agents"
    finished = wait_for_condition(batch, "ok")
    [condition] = finished.status.conditions
    assert (condition.type, condition.status) == ("Complete", "True")
    assert finished.status.succeeded == 1
    assert api.output("ok", "agents") == "hello\n"


def test_a_failing_command_and_a_deadline_fail_the_job_with_their_reasons(
    served: tuple[SimulatedKubernetesAPI, Any],
) -> None:
    api, batch = served
    batch.create_namespaced_job("agents", job("exits", "raise SystemExit(3)"))
    batch.create_namespaced_job("agents", job("slow", "import time; time.sleep(60)", activeDeadlineSeconds=1))
    exits, slow = wait_for_condition(batch, "exits"), wait_for_condition(batch, "slow")
    assert [(c.type, c.reason) for c in exits.status.conditions] == [("Failed", "BackoffLimitExceeded")]
    assert [(c.type, c.reason) for c in slow.status.conditions] == [("Failed", "DeadlineExceeded")]
    assert exits.status.failed == 1
    assert api.processes_running() == 0


def test_lists_select_by_label_and_delete_kills_the_process(
    served: tuple[SimulatedKubernetesAPI, Any],
) -> None:
    api, batch = served
    sleep = "import time; time.sleep(60)"
    batch.create_namespaced_job("agents", job("a", sleep, labels={"run": "x", "team": "t"}))
    batch.create_namespaced_job("agents", job("b", sleep, labels={"run": "y"}))
    names = {j.metadata.name for j in batch.list_namespaced_job("agents", label_selector="run=x").items}
    assert names == {"a"}
    assert {j.metadata.name for j in batch.list_namespaced_job("agents", label_selector="run!=x").items} == {
        "b"
    }
    assert {j.metadata.name for j in batch.list_namespaced_job("agents", label_selector="team").items} == {
        "a"
    }
    assert {j.metadata.name for j in batch.list_namespaced_job("agents", label_selector="!team").items} == {
        "b"
    }
    assert batch.list_namespaced_job("default").items == []
    assert api.processes_running() == 2
    batch.delete_namespaced_job("a", "agents", propagation_policy="Background")
    batch.delete_namespaced_job("b", "agents", body=client.V1DeleteOptions(propagation_policy="Foreground"))
    assert api.deletions == [("a", "Background"), ("b", "Foreground")]
    assert api.processes_running() == 0
    assert batch.list_namespaced_job("agents").items == []


NO_CONTAINERS = {"metadata": {"name": "x"}, "spec": {"template": {"spec": {"containers": []}}}}
ELSEWHERE = {**job("n", "pass"), "metadata": {"name": "n", "namespace": "agents"}}


@pytest.mark.parametrize(
    ("call", "status", "reason"),
    [
        (lambda b: b.create_namespaced_job("agents", job("dup", "pass")), 409, "AlreadyExists"),
        (lambda b: b.read_namespaced_job("missing", "agents"), 404, "NotFound"),
        (lambda b: b.delete_namespaced_job("missing", "agents"), 404, "NotFound"),
        (lambda b: b.create_namespaced_job("agents", NO_CONTAINERS), 422, "Invalid"),
        (lambda b: b.create_namespaced_job("agents", job("", "pass")), 422, "Invalid"),
        (lambda b: b.create_namespaced_job("other", ELSEWHERE), 400, "BadRequest"),
    ],
)
def test_errors_are_status_objects_the_client_raises(
    served: tuple[SimulatedKubernetesAPI, Any], call: Any, status: int, reason: str
) -> None:
    _, batch = served
    batch.create_namespaced_job("agents", job("dup", "pass"))
    # Not pytest.raises: its traceback would keep the client's response, and its socket, past the test.
    try:
        call(batch)
    except client.ApiException as error:
        code, body = error.status, json.loads(error.body)
    else:
        pytest.fail("the call did not raise")
    assert code == status
    assert (body["kind"], body["status"], body["reason"], body["code"]) == (
        "Status",
        "Failure",
        reason,
        status,
    )
    assert body["message"]


def test_a_request_without_the_token_is_unauthorized(served: tuple[SimulatedKubernetesAPI, Any]) -> None:
    api, _ = served
    answer = httpx.get(f"{api.url}/apis/batch/v1/namespaces/agents/jobs")
    assert answer.status_code == 401
    assert answer.json()["reason"] == "Unauthorized"


def test_leaving_the_block_kills_every_jobs_process(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with SimulatedKubernetesAPI() as api:
        answer = httpx.post(f"{api.url}/apis/batch/v1/namespaces/default/jobs", json=job("left", code))
        assert answer.status_code == 201
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
