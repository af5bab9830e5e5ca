"""Distillation data: another model's recorded rollouts, rendered with the student's chat template.

This is the one place where fulgor tokenises text for training. A teacher's rollouts went through
the gateway to another model (a hosted API, a larger local model), whose token ids mean nothing to
the student; so each transcript (:mod:`fulgor.adapters.transcripts`) is rendered with the student's
own chat template, as its engine would render the same conversation, and the student learns the
teacher's turns (loss mask 1) with the rest as context.

A rendering is kept only when it is faithful, checked against what the student's engine would see
and do: each teacher turn, decoded from its trained tokens and parsed as the engine parses the
student's output (content and tool calls), must equal the teacher's turn, and every other message's
text must be in the rendered conversation. A template that lacks the tool-call format, drops a
turn or re-renders earlier turns fails the check, and the transcript is reported with its reason
(:class:`~fulgor.adapters.transcripts.Unusable`), never trained on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from fulgor.adapters.trajectory import Trajectory, TrajectoryRow
from fulgor.adapters.transcripts import Transcript, Unusable, rollout_transcripts
from fulgor.engine.errors import EngineError
from fulgor.errors import ConfigError
from fulgor.store.base import Store

__all__ = ["TeacherData", "read_teacher", "render_transcript", "teacher_data"]

logger = logging.getLogger(__name__)

_LATEST = "latest"


class TeacherData:
    """A teacher run's transcripts that the student can learn, and the rollouts it cannot."""

    def __init__(self, trajectories: list[Trajectory], unusable: list[Unusable], transcripts: int) -> None:
        self.trajectories = trajectories
        """One per rendered transcript (its row made by tokenising text)."""
        self.unusable = unusable
        self.transcripts = transcripts

    def summary(self) -> str:
        reasons = Counter(u.reason for u in self.unusable)
        text = f"{len(self.trajectories)} of {self.transcripts} transcripts rendered"
        if reasons:
            text += "; not used: " + "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
        return text


async def read_teacher(
    source: str | Path | Store, *, agent_match: str | None = None
) -> list[Transcript | Unusable]:
    """Each rollout's transcripts (or why it has none) in a teacher's store: a ``Store``, a run
    directory (its ``store.sqlite``) or a SQLite file; a ConfigError when there is none."""
    if isinstance(source, Store):
        return await _read(source, agent_match)
    from fulgor.store.sqlite import SqliteStore

    path = Path(source)
    if await asyncio.to_thread(path.is_dir):
        path = path / "store.sqlite"
    if not await asyncio.to_thread(path.is_file):
        raise ConfigError(
            f"the teacher run {source} has no store ({path} does not exist); pass the run directory "
            "of a run that recorded the teacher's rollouts (fulgor train --dev on it, or Trainer.dev)"
        )
    store = SqliteStore(path)
    try:
        return await _read(store, agent_match)
    finally:
        await store.close()


async def _read(store: Store, agent_match: str | None) -> list[Transcript | Unusable]:
    found: list[Transcript | Unusable] = []
    for rollout in await store.query_rollouts(status=["succeeded", "failed", "cancelled"]):
        spans = await store.query_spans(rollout.rollout_id, _LATEST)
        unreadable = getattr(spans, "spans_unreadable", 0)
        if unreadable:
            found.append(Unusable(rollout.rollout_id, f"{unreadable} of its spans do not read back"))
            continue
        transcripts = rollout_transcripts(rollout, spans, agent_match=agent_match)
        found += [transcripts] if isinstance(transcripts, Unusable) else transcripts
    return found


def teacher_data(
    found: Sequence[Transcript | Unusable],
    tokenizer: Any,
    *,
    stop_token_ids: Collection[int],
    max_tokens: int | None = None,
) -> TeacherData:
    """Render each transcript of ``found`` for the student; what cannot be rendered faithfully
    (or is longer than ``max_tokens``) is reported with its reason."""
    trajectories, unusable, transcripts = [], [], 0
    for item in found:
        if isinstance(item, Unusable):
            unusable.append(item)
            continue
        transcripts += 1
        row = render_transcript(tokenizer, item, stop_token_ids=stop_token_ids)
        if isinstance(row, str):
            unusable.append(Unusable(item.rollout_id, row))
        elif max_tokens is not None and len(row.token_ids) > max_tokens:
            reason = f"its rendering is longer than max_trajectory_tokens ({max_tokens})"
            unusable.append(Unusable(item.rollout_id, reason))
        else:
            trajectories.append(Trajectory(item.rollout_id, item.group_id, item.reward, [row], []))
    return TeacherData(trajectories, unusable, transcripts)


def render_transcript(
    tokenizer: Any, transcript: Transcript, *, stop_token_ids: Collection[int]
) -> TrajectoryRow | str:
    """The student's training row for ``transcript``, or why its template cannot render it faithfully."""
    from fulgor.algorithms.sft.update import chat_row

    try:
        row = chat_row(
            tokenizer,
            transcript.messages,
            transcript.tools,
            stop_token_ids=stop_token_ids,
            turns=transcript.turns,
        )
    except (ConfigError, EngineError) as error:  # a template that leaves tools out, say
        return f"the student's chat template cannot render it: {error.message}"
    except Exception as error:  # a template's own failure (jinja raising on a role it lacks, say)
        return f"the student's chat template fails on it: {type(error).__name__}: {str(error)[:64]}"
    runs = _trained_runs(row.loss_mask)
    if len(runs) != len(transcript.turns):
        return (
            f"the student's chat template renders {len(runs)} of the teacher's {len(transcript.turns)} "
            "turns (it drops a turn)"
        )
    tools_active = bool(transcript.tools)
    for number, ((start, end), index) in enumerate(zip(runs, transcript.turns, strict=True), start=1):
        ids = [t for t in row.token_ids[start:end] if t not in stop_token_ids]
        problem = _differs(
            tokenizer,
            tokenizer.decode(ids, skip_special_tokens=True),
            transcript.messages[index],
            tools_active,
        )
        if problem is not None:
            return f"teacher turn {number}: {problem}"
    rendered = tokenizer.decode(row.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    for message in transcript.messages:
        content = message.get("content")
        if message["role"] != "assistant" and isinstance(content, str) and content.strip() not in rendered:
            return f"the student's chat template drops the {message['role']} message {content[:32]!r}"
    return row


def _trained_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """The (start, end) of each run of mask 1."""
    runs: list[tuple[int, int]] = []
    for position, value in enumerate(mask):
        if value and (not runs or runs[-1][1] != position):
            runs.append((position, position + 1))
        elif value:
            runs[-1] = (runs[-1][0], position + 1)
    return runs


def _differs(tokenizer: Any, text: str, turn: dict[str, Any], tools_active: bool) -> str | None:
    """Why the student's rendering of ``turn``, parsed as its engine parses output, is not ``turn``."""
    from fulgor.engine.chat_format import ChatFormat

    parsed = ChatFormat.own(tokenizer).parse(text, tools_active)
    wanted = [
        (call["function"]["name"], json.loads(call["function"]["arguments"] or "{}"))
        for call in turn.get("tool_calls") or ()
    ]
    got = [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls]
    if wanted != got:
        names = ", ".join(name for name, _ in wanted) or "none"
        return (
            f"its tool calls ({names}) do not parse back from the student's rendering: the student's chat "
            "template lacks the tool-call format its engine reads"
        )
    content = turn.get("content")
    if isinstance(content, list):  # text parts
        content = "".join(part.get("text", "") for part in content)
    if (content or "").strip() != (parsed.content or "").strip():
        return "its text does not survive the student's rendering (the template changes or drops it)"
    return None
