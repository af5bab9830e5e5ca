"""Rendering a rollout attempt's Job from the user's template: the template's fields kept, fulgor's set."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("yaml", reason="the kubernetes extra (which brings PyYAML) is installed by make test")

from fulgor import ConfigError
from fulgor.runner.job_template import LABEL_ATTEMPT, LABEL_ROLLOUT, LABEL_RUN, render_job

TEMPLATE = """
metadata:
  labels: {team: research}
  annotations: {owner: "{{ run }}"}
spec:
  backoffLimit: 6
  ttlSecondsAfterFinished: 60
  template:
    spec:
      restartPolicy: OnFailure
      nodeSelector: {pool: cpu}
      containers:
        - name: sidecar
          image: proxy:1
        - name: agent
          image: agent:1
          env:
            - {name: OPENAI_BASE_URL, value: stale}
            - {name: KEEP, value: kept}
"""


def render(**options: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "run": "exp1",
        "namespace": "agents",
        "rollout_id": "ro-1",
        "attempt_id": "at-2",
        "timeout_seconds": 90.5,
        "env": {"OPENAI_BASE_URL": "http://trainer/r/ro-1/at-2/v1"},
        "command": ["python", "agent.py"],
        "container": "agent",
    }
    return render_job(TEMPLATE, **{**arguments, **options})


def test_a_rendered_job_keeps_the_template_and_sets_what_fulgor_governs() -> None:
    job = render()
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert job["metadata"]["name"] == "exp1-at-2"
    assert job["metadata"]["namespace"] == "agents"
    labels = {LABEL_RUN: "exp1", LABEL_ROLLOUT: "ro-1", LABEL_ATTEMPT: "at-2"}
    assert job["metadata"]["labels"] == {"team": "research", **labels}
    assert job["metadata"]["annotations"] == {"owner": "exp1", LABEL_ROLLOUT: "ro-1", LABEL_ATTEMPT: "at-2"}
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (
        0,
        91,
        60,
    )
    assert spec["template"]["metadata"]["labels"] == labels
    pod = spec["template"]["spec"]
    assert (pod["restartPolicy"], pod["nodeSelector"]) == ("Never", {"pool": "cpu"})
    sidecar, agent = pod["containers"]
    assert "env" not in sidecar
    assert "command" not in sidecar
    assert agent["env"] == [
        {"name": "KEEP", "value": "kept"},
        {"name": "OPENAI_BASE_URL", "value": "http://trainer/r/ro-1/at-2/v1"},
    ]
    assert agent["command"] == ["python", "agent.py"]


def test_the_templates_command_wins_and_no_timeout_keeps_its_deadline() -> None:
    template = TEMPLATE.replace("image: agent:1", "image: agent:1\n          command: [agent]").replace(
        "ttlSecondsAfterFinished: 60", "activeDeadlineSeconds: 30"
    )
    job = render_job(
        template, run="r", namespace="n", rollout_id="ro-1", attempt_id="at-1", timeout_seconds=None,
        env={}, command=["python", "agent.py"], container="agent",
    )  # fmt: skip
    assert job["spec"]["template"]["spec"]["containers"][1]["command"] == ["agent"]
    assert job["spec"]["activeDeadlineSeconds"] == 30


def test_ids_no_label_can_hold_are_hashed_in_labels_and_kept_in_annotations() -> None:
    attempt_id = "AT/" + "x" * 80
    job = render(attempt_id=attempt_id)
    assert job["metadata"]["annotations"][LABEL_ATTEMPT] == attempt_id
    assert len(job["metadata"]["labels"][LABEL_ATTEMPT]) == 40
    assert len(job["metadata"]["name"]) <= 63


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("kind: Deployment\nspec: {}", "must render a batch/v1 Job"),
        ("spec: {template: {spec: {containers: []}}}", "needs spec.template.spec.containers"),
        ("spec: [1]", "spec must be a mapping"),
        ("spec: {{ missing }}", "does not render"),
        ("spec: {template: {spec: {containers: [{name: a}]}}}", "no container named 'agent'"),
    ],
)
def test_a_template_that_is_no_job_is_refused_with_what_to_fix(template: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_job(
            template, run="r", namespace="n", rollout_id="ro-1", attempt_id="at-1", timeout_seconds=None,
            env={}, container="agent" if "name: a" in template else None,
        )  # fmt: skip
