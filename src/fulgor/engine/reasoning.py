"""Reasoning in model output, ``<think>...</think>``, returned apart as ``reasoning_content``.

Two parsers, by vLLM's ``--reasoning-parser`` names:

- ``qwen3``: reasoning only when the output closes a ``</think>`` (the opening ``<think>`` may be
  in the output or already in the prompt, as Qwen3's templates write it); without ``</think>`` the
  whole output is content (a model told not to think);
- ``deepseek_r1``: the output starts inside the reasoning (DeepSeek-R1's template opens ``<think>``
  in the prompt): everything before ``</think>``, or the whole output when it never closes, is
  reasoning.

The text after ``</think>`` is the content, which a tool-call parser then reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from fulgor.errors import ConfigError

__all__ = ["REASONING_PARSERS", "ReasoningParser", "reasoning_parser"]

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"

ReasoningParser = Callable[[str], tuple[str | None, str]]
"""Splits generated text into (reasoning or None, the rest)."""


def _split(text: str, unclosed_is_reasoning: bool) -> tuple[str | None, str]:
    before, closed, after = text.partition(THINK_CLOSE)
    if not closed:
        if unclosed_is_reasoning:
            return text.removeprefix(THINK_OPEN).strip() or None, ""
        return None, text
    reasoning = before.strip().removeprefix(THINK_OPEN).strip()
    return reasoning or None, after.lstrip()


def _qwen3(text: str) -> tuple[str | None, str]:
    return _split(text, unclosed_is_reasoning=False)


def _deepseek_r1(text: str) -> tuple[str | None, str]:
    return _split(text, unclosed_is_reasoning=True)


REASONING_PARSERS: Final[dict[str, ReasoningParser]] = {"qwen3": _qwen3, "deepseek_r1": _deepseek_r1}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser called ``name``, or a ConfigError that lists them."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ConfigError(
            f"no reasoning parser is called {name!r}; choose one of {', '.join(sorted(REASONING_PARSERS))}"
        ) from None
