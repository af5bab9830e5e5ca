"""The run report: metrics.jsonl read back, the curves drawn to a PNG, one self-contained HTML page."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import pytest

from fulgor.errors import ConfigError
from fulgor.training.reports import MetricsLog
from fulgor.training.run_report import read_metrics, text_curve, write_run_report

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_lines(run_dir: Path, lines: list[dict[str, object]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


HISTORY: list[dict[str, object]] = [
    {"step": 0, "model_version": 0, "val_accuracy": 0.125, "val_tool_call_rate": 0.0},
    {"step": 1, "reward_mean": 0.25, "tool_call_rate": 0.2, "loss": 0.01, "drift/merge_breaks": 0},
    {"step": 2, "reward_mean": 0.5, "tool_call_rate": 0.6, "val_accuracy": 0.75, "drift/merge_breaks": 1},
]


def test_report_embeds_the_curves_and_every_step(tmp_path: Path) -> None:
    write_lines(tmp_path, HISTORY)
    page = write_run_report(tmp_path, title="calc <demo>", notes={"warm start accuracy": 0.1})

    assert page == tmp_path / "report.html"
    png = (tmp_path / "curves.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    text = page.read_text()
    [embedded] = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert base64.b64decode(embedded) == png
    assert "calc &lt;demo&gt;" in text  # escaped
    assert "<th>warm start accuracy</th><td>0.1</td>" in text
    assert "<th>validation accuracy, last</th><td>0.75</td>" in text
    assert "merge_breaks=1" in text
    assert text.count("<tr><td>") == 3  # one table row per step


def test_a_resumed_run_keeps_the_last_line_of_each_step(tmp_path: Path) -> None:
    write_lines(tmp_path, [*HISTORY, {"step": 2, "reward_mean": 0.9}])
    assert [m.get("reward_mean") for m in read_metrics(tmp_path)] == [None, 0.25, 0.9]


def test_missing_or_broken_metrics_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run Trainer\.fit"):
        write_run_report(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:2 is not JSON"):
        read_metrics(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_text_curve_shows_validated_and_trained_steps() -> None:
    lines = text_curve(HISTORY, width=4).splitlines()
    assert lines[0].split() == ["step", "reward", "val", "acc", "tools"]
    assert lines[1].split() == ["0", "-", "0.125", "0.000"]  # an eighth of 4 columns rounds to none
    assert lines[3].split() == ["2", "0.500", "0.750", "0.600", "###"]


def test_elapsed_seconds_continue_across_sessions(tmp_path: Path) -> None:
    write_lines(tmp_path, [{"step": 1, "elapsed_seconds": 100.0}, {"step": 2}])
    log = MetricsLog(tmp_path / "metrics.jsonl")
    assert 100.0 <= log.elapsed_seconds() < 110.0
    assert MetricsLog(tmp_path / "new.jsonl").elapsed_seconds() < 10.0


def test_an_edited_file_with_nan_or_null_numbers_still_renders(tmp_path: Path) -> None:
    nan = float("nan")
    history: list[dict[str, object]] = [
        {"step": 1, "reward_mean": 0.5, "val_accuracy": nan, "drift/merge_breaks": None},
        {"step": 2, "reward_mean": nan, "val_accuracy": 0.5, "drift/merge_breaks": 1},
    ]
    lines = text_curve(history, width=4).splitlines()
    assert lines[1].split() == ["1", "0.500", "-", "-"]
    assert lines[2].split() == ["2", "-", "0.500", "-", "##"]

    write_lines(tmp_path, history)  # json.dumps writes NaN, as a hand-edited file may hold
    text = write_run_report(tmp_path).read_text()
    assert "merge_breaks=1" in text
    assert "<th>validation accuracy, last</th><td>0.5</td>" in text


def test_without_matplotlib_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_lines(tmp_path, HISTORY)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a machine without fulgor[report]
    with pytest.raises(ConfigError, match=r"pip install 'fulgor\[report\]'"):
        write_run_report(tmp_path)
    assert not (tmp_path / "report.html").exists()
