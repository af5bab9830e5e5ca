"""Token ids to text for the token view, with the run's own tokenizer when one is at hand.

The token view always shows the ids the store holds; their text needs the tokenizer the engine
used. :func:`load_decoder` finds a ``tokenizer.json`` (the fast tokenizer every Hugging Face model
folder and every fulgor checkpoint holds) in the folders it is given, or the newest ``step-N``
checkpoint below them, and reads it with the ``tokenizers`` package; without one (or without the
package) the view shows ids only.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["TokenDecoder", "load_decoder"]

logger = logging.getLogger(__name__)


class TokenDecoder:
    """One token id at a time to its text (the byte-level piece when it is not whole UTF-8)."""

    def __init__(self, tokenizer: Any, source: Path) -> None:
        self._tokenizer = tokenizer
        self.source = source

    @functools.lru_cache(maxsize=65_536)  # noqa: B019 (one decoder per dashboard, kept for its life)
    def decode(self, token_id: int) -> str:
        text: str = self._tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text or not text:
            piece = self._tokenizer.id_to_token(token_id)
            return piece if piece is not None else text
        return text


def _step(path: Path) -> int:
    match = re.fullmatch(r"step-(\d+)", path.name)
    return int(match.group(1)) if match else -1


def _candidates(folder: Path) -> list[Path]:
    found = [folder / "tokenizer.json"]
    if folder.is_dir():
        steps = sorted((p for p in folder.iterdir() if _step(p) >= 0), key=_step, reverse=True)
        for step in steps:
            found += [step / "tokenizer.json", *sorted(step.glob("*/tokenizer.json"))]
    return found


def load_decoder(folders: Iterable[Path]) -> TokenDecoder | None:
    """The decoder of the first ``tokenizer.json`` found (see the module docstring), or None."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    for folder in folders:
        for path in _candidates(Path(folder)):
            if path.is_file():
                try:
                    return TokenDecoder(Tokenizer.from_file(str(path)), path)
                except Exception as error:  # a damaged file: say so, and show ids only
                    logger.warning(
                        "cannot read the tokenizer %s (%s); the token view shows ids only", path, error
                    )
    return None
