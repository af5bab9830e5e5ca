"""Incremental detokenisation with stop strings, for streaming and early stopping.

Decoding the whole output after every token costs time quadratic in its length; instead the tracker
decodes a short window (the approach of vLLM and TGI) and holds back text that is an incomplete UTF-8
character or could still grow into a stop string.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TextTracker"]

_REPLACEMENT = "\ufffd"


class TextTracker:
    """Follows one sequence's output tokens and turns them into text deltas.

    ``push`` returns True when the text now contains one of the stop strings; the text is then cut
    just before it, as the OpenAI API does, and ``stop_string`` names the one that matched (the
    earliest in the text; of two starting at the same place, the first in ``stop``).
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._searched_upto = 0
        self._emitted = 0
        self.text = ""
        self.stopped = False
        self.stop_string: str | None = None

    def _decode(self, ids: list[int]) -> str:
        text: str = self._tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def push(self, token_id: int) -> bool:
        """Add a token; True when a stop string has just appeared."""
        if self.stopped:
            return True
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._check_stop()

    def _check_stop(self) -> bool:
        if not self._stop:
            return False
        start = max(0, self._searched_upto - self._hold)
        hits = [(at, stop) for stop in self._stop if (at := self.text.find(stop, start)) >= 0]
        self._searched_upto = len(self.text)
        if hits:
            at, self.stop_string = min(hits, key=lambda hit: hit[0])
            self.text = self.text[:at]
            self.stopped = True
        return self.stopped

    def take_delta(self, final: bool = False) -> str:
        """Text not handed out yet, minus what a stop string might still claim (unless ``final``)."""
        end = len(self.text) if final or self.stopped else max(self._emitted, len(self.text) - self._hold)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta

    def finish(self) -> str:
        """Flush what the window held back (an incomplete character at the very end) and return all text."""
        if not self.stopped:
            tail = self._decode(self._ids[self._prefix_offset :])
            prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
            if len(tail) > len(prefix):
                self.text += tail[len(prefix) :]
                self._read_offset = len(self._ids)
                self._prefix_offset = self._read_offset
                self._check_stop()
        return self.text
