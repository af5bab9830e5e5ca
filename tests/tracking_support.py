"""Reading back what the metrics trackers wrote: TensorBoard event files and W&B offline runs."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_WANDB_BLOCK = 32768  # the .wandb file is a LevelDB-style log of protobuf records in 32 KiB blocks
_WANDB_HEADER = 7  # ":W&B", a 2-byte magic number, a version byte
_FULL, _LAST = 1, 4


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar under ``log_dir``: tag -> step -> value (event files of every session)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, dict[int, float]] = {}
    for events in sorted(log_dir.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            for event in accumulator.Scalars(tag):
                scalars.setdefault(tag, {})[event.step] = event.value
    return scalars


def wandb_records(run_file: Path) -> list[Any]:
    """The protobuf records of one W&B run file (``run-ID.wandb``), in order."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, position = [], b"", _WANDB_HEADER
    while position + 7 <= len(data):
        room = _WANDB_BLOCK - position % _WANDB_BLOCK
        if room < 7:  # a block's tail too short for a record header is padding
            position += room
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_file: Path) -> dict[int, dict[str, Any]]:
    """The rows a W&B run logged: step -> metrics (W&B's own ``_``-keys left out)."""
    rows: dict[int, dict[str, Any]] = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {
                "/".join(item.nested_key) or item.key: json.loads(item.value_json)
                for item in record.history.item
            }
            rows[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


def wandb_config(run_file: Path) -> dict[str, Any]:
    """The config a W&B run was started with."""
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "run":
            updates = record.run.config.update
            return {item.key: json.loads(item.value_json) for item in updates if item.key != "_wandb"}
    raise AssertionError(f"{run_file} holds no run record")
