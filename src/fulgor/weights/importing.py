"""``fulgor model import``: a GGUF file or a Hugging Face directory made into a model directory that
fulgor's engine, the Trainer and vLLM all load.

A GGUF file (from llama.cpp, from Ollama's blob store, or shipped in a package) is dequantised by
transformers (with the ``gguf`` package) to the dtype asked and saved in Hugging Face format with
its tokenizer and chat template. A Hugging Face directory is checked (its config, weights and
tokenizer load) and copied, or linked file by file. Nothing is downloaded. The directory is built
beside ``out`` and renamed into place when complete, so a failure leaves nothing half-written.

:func:`describe_model` reads what ``fulgor doctor --model`` reports from a directory's files without
loading its weights.

What it does not know: serving or training the directory it writes (:mod:`fulgor.weights.loading`
loads it for both), or where a model comes from (nothing is fetched from a hub).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from fulgor.weights.errors import ModelLoadError
from fulgor.weights.loading import (
    CONTEXT_LENGTH_KEYS,
    no_progress_bars,
    require_transformers,
    resolve_dtype,
)

__all__ = ["GGUF_MAGIC", "ImportDtype", "ModelFacts", "describe_model", "import_model", "is_gguf"]

GGUF_MAGIC: Final = b"GGUF"
ImportDtype = Literal["bfloat16", "float16", "float32"]
# Files of a Hugging Face directory that serving and training never read.
_SKIPPED: Final = (
    ".git",
    "*.gguf",
    "original",
    "*.pth",
    "onnx",
    "*.onnx",
    "flax_model.msgpack",
    "tf_model.h5",
)


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes (whatever its name)."""
    try:
        with path.open("rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def import_model(
    source: str | Path, out: str | Path, *, dtype: ImportDtype = "bfloat16", link: bool = False
) -> Path:
    """Make ``source`` (a GGUF file or a Hugging Face directory) the model directory ``out``.

    ``dtype`` is what a GGUF file's weights are dequantised to; ``link`` links a directory's files
    instead of copying them. Raises ModelLoadError naming the problem and what to do.
    """
    source, out = Path(source), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"--out {out} already exists and is not empty; pass a new directory")
    if source.is_dir():
        build: Callable[[Path], None] = functools.partial(_copy_directory, source, link=link)
    elif source.is_file():
        if not is_gguf(source):
            raise ModelLoadError(
                f"{source} is not a GGUF file (it does not start with {GGUF_MAGIC!r}); pass a .gguf file "
                "(llama.cpp, an Ollama blob) or a Hugging Face model directory"
            )
        build = functools.partial(_dequantise, source, dtype=dtype)
    else:
        raise ModelLoadError(f"{source} does not exist; pass a GGUF file or a Hugging Face model directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # as mkdir would have made it, not mkdtemp's owner-only
    try:
        build(staging)
        describe_model(staging)  # what was written reads back
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _dequantise(source: Path, out: Path, *, dtype: ImportDtype) -> None:
    transformers = require_transformers()
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files with it)
    except ImportError as exc:
        raise ImportError(
            "importing a GGUF file needs the gguf package: pip install 'fulgor[torch]'"
        ) from exc
    options: dict[str, Any] = {"gguf_file": source.name}
    try:
        with no_progress_bars():
            tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, **options)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                source.parent,
                dtype=resolve_dtype(dtype, "cpu"),
                quantization_config=transformers.GgufConfig(dequantize=True),
                **options,
            )
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
    except Exception as exc:  # transformers' GGUF reader raises many kinds (struct.error on a cut file)
        raise ModelLoadError(
            f"transformers cannot read {source} as a model ({type(exc).__name__}: {exc}): the file is "
            "cut short (compare its size with the source's), or its architecture or quantisation is one "
            "transformers does not read (export the model as a Hugging Face directory instead)"
        ) from exc


def _copy_directory(source: Path, out: Path, *, link: bool) -> None:
    describe_model(source)  # refuse a directory that is not a model before copying gigabytes
    transformers = require_transformers()
    try:
        transformers.AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # transformers raises many kinds for broken tokenizer files
        raise ModelLoadError(
            f"the tokenizer in {source} does not load: {exc}; copy the model's tokenizer files "
            "(tokenizer.json, tokenizer_config.json) into it"
        ) from exc
    ignore = shutil.ignore_patterns(*_SKIPPED)
    if link:
        for entry in source.iterdir():
            if not ignore(str(source), [entry.name]):
                os.symlink(entry.resolve(), out / entry.name)
    else:
        shutil.copytree(source, out, ignore=ignore, dirs_exist_ok=True)


@dataclass(frozen=True)
class ModelFacts:
    """What a model directory's files say about it."""

    architecture: str
    model_type: str
    parameters: int
    context_length: int | None
    dtype: str | None
    weights: list[str]

    def summary(self) -> str:
        """``LlamaForCausalLM (llama), 134.5M parameters, 8192-token context, bfloat16``."""
        parts = [f"{self.architecture} ({self.model_type})", f"{_count(self.parameters)} parameters"]
        if self.context_length:
            parts.append(f"{self.context_length}-token context")
        if self.dtype:
            parts.append(self.dtype)
        shown = self.weights[0] if len(self.weights) == 1 else f"{len(self.weights)} weight files"
        return ", ".join([*parts, shown])


def describe_model(folder: Path) -> ModelFacts:
    """The facts of a model directory, read from ``config.json`` and the safetensors headers;
    a ModelLoadError when it has no config or no weights."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(
            f"{folder} holds no config.json: it is not a Hugging Face model directory"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{folder / 'config.json'} does not read as JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{folder / 'config.json'} is not a JSON object")
    tensors = sorted(folder.glob("*.safetensors"))
    others = sorted(p for p in folder.glob("*.bin") if p.name.startswith("pytorch_model"))
    if not tensors and not others:
        raise ModelLoadError(f"{folder} holds no weights (*.safetensors or pytorch_model*.bin)")
    parameters, dtypes = 0, set()
    for path in tensors:
        for name, entry in _safetensors_header(path).items():
            if name != "__metadata__" and isinstance(entry, dict):
                parameters += math.prod(entry.get("shape", []))
                dtypes.add(str(entry.get("dtype")))
    nested = config.get("text_config")
    text_config: dict[str, Any] = nested if isinstance(nested, dict) else config
    context = next(
        (text_config[key] for key in CONTEXT_LENGTH_KEYS if isinstance(text_config.get(key), int)),
        None,
    )
    architectures = config.get("architectures") or ["unknown architecture"]
    return ModelFacts(
        architecture=str(architectures[0]),
        model_type=str(config.get("model_type", "unknown")),
        parameters=parameters,
        context_length=context,
        dtype=_DTYPES.get(next(iter(dtypes)), None) if len(dtypes) == 1 else None,
        weights=[p.name for p in tensors or others],
    )


_DTYPES: Final = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def _safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header: 8 bytes of little-endian length, then that much JSON."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100_000_000:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"{path} is not a safetensors file: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path} is not a safetensors file: its header is not a JSON object")
    return header


def _count(parameters: int) -> str:
    if parameters >= 10**9:
        return f"{parameters / 10**9:.2f}B"
    if parameters >= 10**6:
        return f"{parameters / 10**6:.1f}M"
    return f"{parameters / 10**3:.0f}K"
