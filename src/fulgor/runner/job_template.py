"""A rollout attempt's Kubernetes Job, rendered from the user's Jinja template.

:func:`render_job` keeps every field of the template and sets what fulgor governs: the Job's name
(``RUN-ATTEMPT_ID``), the labels ``fulgor.dev/run``, ``fulgor.dev/rollout-id`` and
``fulgor.dev/attempt-id`` (on the Job and its pod; the exact ids are annotations too, since a label
value holds at most 63 characters of a narrow alphabet), ``backoffLimit: 0`` and ``restartPolicy:
Never`` (fulgor's own retries govern, per ``RolloutConfig.max_attempts``), ``activeDeadlineSeconds``
from the rollout's ``timeout_seconds``, and the environment of the agent's container.

What it does not know: the cluster, the store, or what runs in the container.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fulgor.errors import ConfigError

__all__ = ["LABEL_ATTEMPT", "LABEL_ROLLOUT", "LABEL_RUN", "check_run_name", "job_name", "render_job"]

LABEL_RUN = "fulgor.dev/run"
LABEL_ROLLOUT = "fulgor.dev/rollout-id"
LABEL_ATTEMPT = "fulgor.dev/attempt-id"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_RUN_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


def check_run_name(run: str) -> None:
    """ConfigError unless ``run`` can name Jobs and label them (a DNS label of at most 40 characters)."""
    if not _RUN_NAME.fullmatch(run):
        raise ConfigError(
            f"run {run!r} must be 1-40 lower-case letters, digits and '-', starting and ending with a "
            "letter or digit: it names the run's Jobs and labels them (fulgor.dev/run)"
        )


def job_name(run: str, attempt_id: str) -> str:
    """The Job of one attempt: ``RUN-ATTEMPT_ID``, or ``RUN-HASH`` for an id no DNS label can hold."""
    name = f"{run}-{attempt_id}"
    if _DNS_LABEL.fullmatch(name):
        return name
    return f"{run}-{hashlib.sha256(attempt_id.encode()).hexdigest()[:20]}"


def _label_value(value: str) -> str:
    return value if _LABEL_VALUE.fullmatch(value) else hashlib.sha256(value.encode()).hexdigest()[:40]


def render_job(
    template: str,
    *,
    run: str,
    namespace: str,
    rollout_id: str,
    attempt_id: str,
    timeout_seconds: float | None,
    env: Mapping[str, str],
    command: Sequence[str] = (),
    working_dir: str | None = None,
    container: str | None = None,
) -> dict[str, Any]:
    """The Job of one attempt: the Jinja ``template`` rendered (with ``run``, ``namespace``,
    ``job_name``, ``rollout_id``, ``attempt_id``) and read as YAML, with fulgor's fields set (see
    the module docstring). ``env`` goes to the container named ``container`` (else the first),
    replacing variables of the same names; ``command`` and ``working_dir`` fill in what that
    container does not give. ConfigError, naming what to fix, for a template that is no Job."""
    import jinja2
    import yaml

    name = job_name(run, attempt_id)
    values = {
        "run": run,
        "namespace": namespace,
        "job_name": name,
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
    }
    try:
        text = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(values)
        job = yaml.safe_load(text)
    except (jinja2.TemplateError, yaml.YAMLError) as error:
        raise ConfigError(f"the Job template does not render to YAML: {error}") from error
    if not isinstance(job, dict) or job.get("kind", "Job") != "Job":
        raise ConfigError(
            "the Job template must render a batch/v1 Job (kind: Job, spec.template.spec.containers)"
        )
    job.update(apiVersion="batch/v1", kind="Job")
    labels = {
        LABEL_RUN: run,
        LABEL_ROLLOUT: _label_value(rollout_id),
        LABEL_ATTEMPT: _label_value(attempt_id),
    }
    annotations = {LABEL_ROLLOUT: rollout_id, LABEL_ATTEMPT: attempt_id}
    metadata = _mapping(job, "metadata", "metadata")
    metadata.update(name=name, namespace=namespace)
    _mapping(metadata, "labels", "metadata.labels").update(labels)
    _mapping(metadata, "annotations", "metadata.annotations").update(annotations)
    spec = _mapping(job, "spec", "spec")
    spec["backoffLimit"] = 0
    if timeout_seconds is not None:
        spec["activeDeadlineSeconds"] = max(1, math.ceil(timeout_seconds))
    pod_template = _mapping(spec, "template", "spec.template")
    _mapping(
        _mapping(pod_template, "metadata", "spec.template.metadata"),
        "labels",
        "spec.template.metadata.labels",
    ).update(labels)
    pod = _mapping(pod_template, "spec", "spec.template.spec")
    pod["restartPolicy"] = "Never"
    target = _container(pod, container)
    kept = [e for e in target.get("env") or [] if not (isinstance(e, dict) and e.get("name") in env)]
    target["env"] = kept + [{"name": key, "value": value} for key, value in env.items()]
    if not target.get("command") and command:
        target["command"] = list(command)
    if working_dir is not None:
        target.setdefault("workingDir", working_dir)
    return job


def _mapping(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise ConfigError(f"the Job template's {where} must be a mapping, got {type(value).__name__}")
    return value


def _container(pod: dict[str, Any], name: str | None) -> dict[str, Any]:
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise ConfigError(
            "the Job template needs spec.template.spec.containers: a list with the agent's container"
        )
    if name is None:
        first: dict[str, Any] = containers[0]
        return first
    for container in containers:
        if container.get("name") == name:
            found: dict[str, Any] = container
            return found
    raise ConfigError(
        f"the Job template has no container named {name!r}: it has {[c.get('name') for c in containers]}"
    )
