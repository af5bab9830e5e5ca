"""``fulgor store``: inspect a store file from the command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fulgor.cli.main import main
from fulgor.store import SqliteStore
from fulgor.types import RolloutRequest, Span


def _fill(path: Path) -> str:
    async def fill() -> str:
        store = SqliteStore(path)
        await store.enqueue([RolloutRequest(input=i, group_id="g") for i in range(3)])
        [claimed] = await store.claim("w")
        span = Span(
            rollout_id=claimed.rollout_id,
            attempt_id=claimed.attempt.attempt_id,
            trace_id="t",
            span_id="s1",
            name="fulgor.message",
            start_time=0.0,
        )
        await store.add_spans([span])
        await store.close()
        return claimed.rollout_id

    return asyncio.run(fill())


def test_stats_rollouts_and_spans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    rollout_id = _fill(tmp_path / "store.sqlite")

    assert main(["store", "stats", "--store", url]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["rollouts"] == {"queuing": 2, "running": 1}
    assert stats["spans"] == 1

    assert main(["store", "rollouts", "--store", url, "--status", "queuing"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["input"] for line in lines] == [1, 2]

    assert main(["store", "spans", rollout_id, "--store", url]) == 0
    [span] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert span["sequence_id"] == 1


def test_errors_are_clear_and_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "stats", "--store", f"sqlite:///{tmp_path}/none.sqlite"]) == 2
    assert "no store at" in capsys.readouterr().err
    _fill(tmp_path / "s.sqlite")
    assert main(["store", "spans", "ro-missing", "--store", f"sqlite:///{tmp_path}/s.sqlite"]) == 1
    assert "not found" in capsys.readouterr().err
