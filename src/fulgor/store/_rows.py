"""Rows of the SQL backends: the column lists and the codecs between rows and wire models.

JSON payloads (inputs, configs, metadata, stats) are stored as text, exactly as serialised, so a
round trip keeps key order; times are float seconds since the Unix epoch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fulgor.types import Attempt, Rollout, RolloutConfig, Worker

ROLLOUT_COLUMNS = (
    "rollout_id, status, mode, group_id, resources_id, input, config, metadata, "
    "enqueue_time, start_time, end_time, attempt_count"
)
ATTEMPT_COLUMNS = (
    "rollout_id, attempt_id, sequence_id, worker_id, status, start_time, end_time, last_active_time, "
    "error, metadata"
)
WORKER_COLUMNS = "worker_id, first_seen_time, last_heartbeat_time, stats"


def rollout_row(rollout: Rollout) -> tuple[Any, ...]:
    """Values for ``ROLLOUT_COLUMNS``, in order."""
    return (
        rollout.rollout_id,
        rollout.status,
        rollout.mode,
        rollout.group_id,
        rollout.resources_id,
        json.dumps(rollout.input),
        rollout.config.model_dump_json(),
        json.dumps(rollout.metadata),
        rollout.enqueue_time,
        rollout.start_time,
        rollout.end_time,
        rollout.attempt_count,
    )


def rollout_from_row(row: Sequence[Any]) -> Rollout:
    return Rollout(
        rollout_id=row[0],
        status=row[1],
        mode=row[2],
        group_id=row[3],
        resources_id=row[4],
        input=json.loads(row[5]),
        config=RolloutConfig.model_validate_json(row[6]),
        metadata=json.loads(row[7]),
        enqueue_time=row[8],
        start_time=row[9],
        end_time=row[10],
        attempt_count=row[11],
    )


def attempt_row(attempt: Attempt) -> tuple[Any, ...]:
    """Values for ``ATTEMPT_COLUMNS``, in order."""
    return (
        attempt.rollout_id,
        attempt.attempt_id,
        attempt.sequence_id,
        attempt.worker_id,
        attempt.status,
        attempt.start_time,
        attempt.end_time,
        attempt.last_active_time,
        attempt.error,
        json.dumps(attempt.metadata),
    )


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    return Attempt(
        rollout_id=row[0],
        attempt_id=row[1],
        sequence_id=row[2],
        worker_id=row[3],
        status=row[4],
        start_time=row[5],
        end_time=row[6],
        last_active_time=row[7],
        error=row[8],
        metadata=json.loads(row[9]),
    )


def worker_from_row(row: Sequence[Any]) -> Worker:
    return Worker(
        worker_id=row[0], first_seen_time=row[1], last_heartbeat_time=row[2], stats=json.loads(row[3])
    )
