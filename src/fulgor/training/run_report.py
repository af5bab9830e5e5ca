"""A training run, shown: the curves as a PNG, and one self-contained ``report.html``.

``write_run_report(run_dir)`` reads ``metrics.jsonl`` (one JSON object per step, as the trainer
writes it) and writes ``curves.png`` (training reward, validation accuracy and tool-call rates by
step) and ``report.html`` (a summary, the curves, every step's metrics, and notes the caller adds,
such as the model's accuracy before training; a prompt search's candidates and their diffs, from
``apo/candidates.json``). ``text_curve`` renders the same curves for a
terminal. The PNG needs matplotlib (``pip install 'fulgor[report]'``); the HTML embeds it, so the
report is one file to open or send.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from fulgor.errors import ConfigError

__all__ = [
    "RUN_INFO_FILE",
    "read_metrics",
    "read_run_info",
    "text_curve",
    "write_run_info",
    "write_run_report",
]

# The columns of the step table, in order, when a run has them.
_COLUMNS = (
    "step",
    "reward_mean",
    "val_accuracy",
    "best_score",
    "candidates",
    "candidates_rejected",
    "rollouts",
    "rollouts_total",
    "optimizer_calls_total",
    "tool_call_rate",
    "val_tool_call_rate",
    "val_tool_calls",
    "loss",
    "kl",
    "entropy",
    "clip_fraction",
    "groups_without_signal",
    "rollouts_failed",
    "val_rollouts_failed",
    "tokens_per_second",
    "elapsed_seconds",
)
_CURVES = (
    ("reward_mean", "training reward"),
    ("val_accuracy", "validation accuracy"),
    ("best_score", "best prompts' validation score"),
    ("tool_call_rate", "tool-call rate (training)"),
    ("val_tool_call_rate", "tool-call rate (validation)"),
)


RUN_INFO_FILE = "run.json"


def write_run_info(
    run_dir: str | Path, *, algorithm: str, hyperparameters: Mapping[str, Any], model: str | None
) -> None:
    """Write ``run_dir/run.json``: the algorithm, its hyperparameters and the model the run starts
    from (what the dashboard shows of a run, and where it finds the tokenizer for the token view)."""
    info = {"algorithm": algorithm, "hyperparameters": dict(hyperparameters), "model": model}
    path = Path(run_dir) / RUN_INFO_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(info, indent=2, default=str) + "\n")
    partial.replace(path)


def read_run_info(run_dir: str | Path) -> dict[str, Any]:
    """``run_dir/run.json`` as written by :func:`write_run_info`; empty when there is none or it
    does not read (a run written by an older version)."""
    try:
        info = json.loads((Path(run_dir) / RUN_INFO_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every step's metrics from ``run_dir/metrics.jsonl``, in order (a step written twice by a
    resumed run keeps its last line)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; run Trainer.fit with run_dir={str(run_dir)!r} first")
    by_step: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            metrics = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number} is not JSON ({error}); was the file edited?") from error
        by_step[int(metrics.get("step", number))] = metrics
    return [by_step[step] for step in sorted(by_step)]


def write_run_report(
    run_dir: str | Path, *, title: str | None = None, notes: Mapping[str, Any] | None = None
) -> Path:
    """Write ``curves.png`` and ``report.html`` into ``run_dir``; returns the HTML's path."""
    run_dir = Path(run_dir)
    history = read_metrics(run_dir)
    png = run_dir / "curves.png"
    _plot(history, png, title or run_dir.name)
    page = run_dir / "report.html"
    extra = ""
    candidates = run_dir / "apo" / "candidates.json"
    if candidates.is_file():
        from fulgor.algorithms.apo.report import candidates_html

        extra = candidates_html(json.loads(candidates.read_text()))
    page.write_text(_html(history, png, title or f"fulgor run {run_dir.name}", dict(notes or {}), extra))
    return page


def text_curve(history: Sequence[Mapping[str, Any]], width: int = 40) -> str:
    """The curves as text: one line per step that has them, with a bar for the validation accuracy.

    >>> print(text_curve([{"step": 0, "val_accuracy": 0.25}, {"step": 5, "reward_mean": 0.5,
    ...                                                        "val_accuracy": 1.0}], width=8))
    step  reward  val acc  tools
       0       -    0.250      -  ##
       5   0.500    1.000      -  ########
    """
    lines = ["step  reward  val acc  tools"]
    for metrics in history:
        accuracy = metrics.get("val_accuracy", metrics.get("best_score"))  # a prompt search's best
        if accuracy is None and metrics.get("reward_mean") is None:
            continue
        tools = metrics.get("val_tool_call_rate", metrics.get("tool_call_rate"))
        bar = "#" * round(width * accuracy) if _finite(accuracy) else ""
        lines.append(
            f"{metrics.get('step', '?'):>4}  {_number(metrics.get('reward_mean')):>6}  "
            f"{_number(accuracy):>7}  {_number(tools):>5}  {bar}".rstrip()
        )
    return "\n".join(lines)


def _plot(history: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        from matplotlib import pyplot
    except ImportError as error:
        raise ConfigError(
            "the run report's PNG needs matplotlib; install it with pip install 'fulgor[report]'"
        ) from error
    figure, axes = pyplot.subplots(figsize=(7.5, 4.2), dpi=110)
    try:
        for key, label in _CURVES:
            points = [(m["step"], m[key]) for m in history if _finite(m.get(key))]
            if points:
                steps, values = zip(*points, strict=True)
                style = "o-" if key.startswith("val_") else "-"
                axes.plot(steps, values, style, label=label, markersize=4)
        axes.set_xlabel("training step")
        axes.set_ylim(-0.03, 1.03)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend(loc="best", fontsize=8)
        figure.tight_layout()
        figure.savefig(path)
    finally:
        pyplot.close(figure)


def _html(
    history: Sequence[Mapping[str, Any]], png: Path, title: str, notes: dict[str, Any], extra: str = ""
) -> str:
    columns = [c for c in _COLUMNS if any(c in m for m in history)]
    drift = sorted({k for m in history for k in m if k.startswith("drift/")})
    summary = _summary(history)
    image = base64.b64encode(png.read_bytes()).decode("ascii")
    rows = "\n".join(
        "<tr>" + "".join(f"<td>{_cell(m.get(c))}</td>" for c in [*columns, *drift]) + "</tr>" for m in history
    )
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [*columns, *drift])
    facts = {**summary, **notes}
    fact_rows = "\n".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in facts.items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85rem; }}
th, td {{ border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: right; }}
th {{ background: #f3f3f3; }}
.facts th {{ text-align: left; }}
.candidate {{ border-top: 1px solid #ddd; margin: 0.6rem 0; }}
ins {{ color: #14632b; text-decoration: none; }} del {{ color: #a31515; }}
.reason {{ color: #a31515; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<table class="facts">
{fact_rows}
</table>
<h2>Curves</h2>
<img alt="reward, accuracy and tool-call rate by step" src="data:image/png;base64,{image}">
<h2>Every step</h2>
<p>Drift columns count what training left out or could not merge (see the adapter's drift report);
<code>drift/id_mismatches</code> (trained token ids that differ from the engine's) must be zero.</p>
<table><thead><tr>{head}</tr></thead><tbody>
{rows}
</tbody></table>
{extra}
</body></html>
"""


def _summary(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    trained = [m for m in history if m.get("step", 0) > 0]
    validated = [m for m in history if _finite(m.get("val_accuracy"))]
    summary: dict[str, Any] = {"training steps": len(trained)}
    searched = [m for m in history if _finite(m.get("best_score"))]
    if searched:
        summary["best prompts' validation score"] = searched[-1]["best_score"]
    if validated:
        summary["validation accuracy, first"] = validated[0]["val_accuracy"]
        summary["validation accuracy, last"] = validated[-1]["val_accuracy"]
        summary["validation accuracy, best"] = max(m["val_accuracy"] for m in validated)
    if trained and "elapsed_seconds" in trained[-1]:
        summary["training wall time (s)"] = trained[-1]["elapsed_seconds"]
    drift: dict[str, float] = {}
    for metrics in history:
        for key, value in metrics.items():
            if key.startswith("drift/") and _finite(value):
                drift[key] = drift.get(key, 0) + value
    if drift:
        summary["drift totals"] = ", ".join(f"{k[6:]}={v}" for k, v in sorted(drift.items()))
    return summary


def _finite(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and math.isfinite(value)


def _number(value: Any) -> str:
    return f"{value:.3f}" if _finite(value) else "-"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape("-" if value is None else str(value))
