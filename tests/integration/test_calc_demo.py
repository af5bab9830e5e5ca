"""The calc demo's pipeline: model, warm start, GRPO through the whole system, test, report.

The quick test runs every stage with a few steps (it checks the plumbing, not the learning); the
slow one runs the demo as ``make demo`` does and checks that the model learned to use the tool.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("openai")

from examples.calc.train import main, run_demo
from examples.calc.warm_start import WarmStartConfig
from fulgor.adapters import DriftReport, model_calls
from fulgor.dashboard import Dashboard, RolloutQuery, SqliteReader
from fulgor.dashboard.app import DashboardApp
from fulgor.net.asgi import ServerThread
from fulgor.training.run_report import read_metrics

PROBLEMS = (*DriftReport.LOSSES, "merge_breaks")
# Tokens lost or not the engine's (DriftReport.LOSSES) are never acceptable. A merge break trains
# the sampled ids exactly, in a new row: it happens when the model samples a tokenisation of its
# text that re-encoding does not give back, which a model sampling at temperature 1 may do.
LOST = DriftReport.LOSSES


def test_every_stage_runs_and_leaves_its_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "calc"
    result = run_demo(
        run_dir,
        max_steps=1,
        warm=WarmStartConfig(steps=2, batch_size=4),
        test_before=True,
        progress=False,
        sizes=(16, 4, 4),
    )
    for path in ("base/config.json", "warm/config.json", "grpo/checkpoints/step-1/config.json"):
        assert (run_dir / path).is_file(), path
    assert [m["step"] for m in read_metrics(run_dir / "grpo")] == [0, 1]
    [step] = [m for m in result.history if m["step"] == 1]
    assert step["rollouts"] == 64
    assert step["rollouts_failed"] == 0
    assert all(step[f"drift/{name}"] == 0 for name in PROBLEMS)
    for evaluation in (result.test_before, result.test_after):
        assert set(evaluation) == {
            "val_accuracy",
            "val_tool_call_rate",
            "val_tool_calls",
            "val_rollouts_failed",
        }
        assert evaluation["val_rollouts_failed"] == 0
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["test_after"] == result.test_after
    check_dashboard(run_dir / "grpo")


def check_dashboard(grpo_dir: Path) -> None:
    """The dashboard over the demo's real run: the run's algorithm, its steps, and a trained call's
    tokens with their text from the run's own tokenizer, the ids as the store holds them."""
    info = json.loads((grpo_dir / "run.json").read_text())
    assert info["algorithm"] == "grpo"
    assert Path(info["model"]).is_dir()

    async def first_train_rollout() -> tuple[str, list[int]]:
        reader = SqliteReader(grpo_dir / "store.sqlite")
        try:
            page = await reader.rollouts(
                RolloutQuery(mode="train", status=("succeeded",), sort="oldest", limit=1)
            )
            rollout_id = page.rows[0].rollout.rollout_id
            spans = await reader.query_spans(rollout_id)
        finally:
            await reader.close()
        (_, call), *_ = model_calls(spans)
        return rollout_id, [*(call.prompt_token_ids or []), *(call.response_token_ids or [])]

    rollout_id, ids = asyncio.run(first_train_rollout())
    server = ServerThread(
        DashboardApp(Dashboard(SqliteReader(grpo_dir / "store.sqlite"), run_dirs=[grpo_dir]))
    )
    url = server.start()
    try:
        runs = httpx.get(url).text
        assert "grpo" in runs
        assert "training reward" in runs
        page = httpx.get(f"{url}/rollouts/{rollout_id}").text
    finally:
        server.stop()
    assert "Token text from" in page  # the run's tokenizer was found
    section = page.split('id="call-0"', 1)[1].split("</section>", 1)[0]
    assert [int(i) for i in re.findall(r'data-id="(\d+)"', section)] == ids
    assert "trained; starts row 1" in section


@pytest.mark.slow(minutes=9)
def test_make_demo_runs_every_stage_on_the_real_system_and_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo as ``make demo`` runs it (seed 0), held to what the README says it does: from almost
    no held-out problem right to about 90%. Seed 0 measured 85.9%, 87.5% and 88.3% on the test
    split in three runs (the number of steps that fit into 285 s varies, and sampling with it); a
    run under 80% has lost something. ``benchmarks/learning.py`` measures seeds 0-2 against the
    acceptance."""
    run_dir = tmp_path / "calc"
    assert main(["--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    history = read_metrics(run_dir / "grpo")
    assert [m["step"] for m in history] == list(range(len(history)))
    # 150 steps, or fewer when the 285 s ran out first (then the last step validated).
    assert history[-1]["step"] == 150 or history[-1]["elapsed_seconds"] >= 285
    assert "val_accuracy" in history[-1]
    assert history[0]["val_accuracy"] < 0.1  # the warm start answers without the tool, so guesses
    for metrics in history[1:]:
        assert metrics["rollouts_failed"] == 0, metrics
        assert all(metrics[f"drift/{name}"] == 0 for name in LOST), metrics
    result = json.loads((run_dir / "result.json").read_text())
    assert set(result["test_after"]) == {
        "val_accuracy",
        "val_tool_call_rate",
        "val_tool_calls",
        "val_rollouts_failed",
    }
    assert result["test_after"]["val_rollouts_failed"] == 0
    assert result["test_after"]["val_tool_call_rate"] >= 0.9  # from none after the warm start
    assert result["test_after"]["val_accuracy"] >= 0.8
    for name in ("report.html", "curves.png"):
        assert (run_dir / "grpo" / name).is_file()
    assert str(run_dir / "grpo" / "report.html") in out
    assert "held-out test accuracy" in out
    assert out.rstrip().endswith(f".venv/bin/fulgor dashboard {run_dir / 'grpo'}")
