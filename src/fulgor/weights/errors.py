"""The weights room's error: a model directory that cannot be loaded, imported or described.

It sits under :class:`fulgor.errors.FulgorError` directly, below the engine, so that whoever loads
weights (the engine serving them, the trainer updating them, ``fulgor model`` and ``fulgor doctor``)
raises and catches the same error. Servers map it to an HTTP status (the engine's: 400); it knows
nothing about HTTP.
"""

from __future__ import annotations

from fulgor.errors import FulgorError

__all__ = ["ModelLoadError"]


class ModelLoadError(FulgorError):
    """A model, tokenizer or adapter directory could not be loaded."""

    code = "model_load_error"
