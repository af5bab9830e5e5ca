"""Full weights as vLLM's in-place reload must read them: tied word embeddings made explicit.

vLLM's layerwise reload (``reload_weights`` through ``/collective_rpc``, vLLM 0.32) loads each layer
from the checkpoint and puts the old tensors back into a layer the checkpoint holds nothing for.
A model with tied word embeddings is saved with the shared tensor once, as the input embeddings, so
the LM head kept the old weights while the embeddings took the new ones, and vLLM served a model
that was neither (its logprobs matched neither checkpoint). :func:`reload_view` gives vLLM a
directory of links to the checkpoint's files plus ``lm_head.weight``, a copy of the embeddings in a
file of its own, so the reload loads both. Only safetensors headers are parsed: no torch here.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

__all__ = ["reload_view"]

_LM_HEAD = "lm_head.weight"
_INDEX = "model.safetensors.index.json"


def reload_view(checkpoint: Path, scratch: Path) -> Path:
    """``checkpoint`` itself, or (when it ties word embeddings and holds no ``lm_head.weight``) a
    view of it made under ``scratch`` (emptied first) that holds one."""
    config = json.loads((checkpoint / "config.json").read_text())
    if not config.get("tie_word_embeddings", False):
        return checkpoint
    headers = {path: _header(path)[0] for path in sorted(checkpoint.glob("*.safetensors"))}
    if any(_LM_HEAD in header for header in headers.values()):
        return checkpoint
    found = [
        (path, name)
        for path, header in headers.items()
        for name in header
        if name.endswith("embed_tokens.weight")
    ]
    if len(found) != 1:
        return checkpoint  # not a layout this knows; vLLM loads it as it is
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for entry in checkpoint.iterdir():
        if entry.name != _INDEX:
            (scratch / entry.name).symlink_to(entry.resolve())
    _copy_tensor(*found[0], scratch / "lm_head.safetensors", _LM_HEAD)
    if (checkpoint / _INDEX).is_file():  # vLLM reads only the files the index names
        index = json.loads((checkpoint / _INDEX).read_text())
        index["weight_map"][_LM_HEAD] = "lm_head.safetensors"
        (scratch / _INDEX).write_text(json.dumps(index))
    return scratch


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's tensor entries, and where its data starts."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def _copy_tensor(source: Path, name: str, out: Path, new_name: str) -> None:
    """Write tensor ``name`` of ``source`` to ``out``, a safetensors file of its own, as ``new_name``."""
    header, data_start = _header(source)
    entry = header[name]
    begin, end = entry["data_offsets"]
    encoded = json.dumps({new_name: {**entry, "data_offsets": [0, end - begin]}}).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with source.open("rb") as file, out.open("wb") as target:
        target.write(struct.pack("<Q", len(encoded)) + encoded)
        file.seek(data_start + begin)
        remaining = end - begin
        while remaining:
            chunk = file.read(min(remaining, 1 << 24))
            if not chunk:
                raise OSError(f"{source} ends inside its tensor {name}: the checkpoint is damaged")
            target.write(chunk)
            remaining -= len(chunk)
