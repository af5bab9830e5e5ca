"""The calc task's own verification: strict numeric equality of the final answer.

An answer earns the reward only when the whole final message is the number (optionally written
``Answer: N``, with surrounding whitespace or one trailing period). A message that merely contains
the right number among other numbers earns nothing, so a model cannot win by listing guesses.
"""

from __future__ import annotations

import re

__all__ = ["parse_answer", "reward"]

_ANSWER = re.compile(r"^\s*(?:answer\s*[:=]\s*)?(-?\d+)\s*\.?\s*$", re.IGNORECASE)


def parse_answer(text: str | None) -> int | None:
    """The integer the message states as its answer, or None.

    >>> parse_answer("Answer: 84")
    84
    >>> parse_answer(" -12. ")
    -12
    >>> parse_answer("84 or 85") is None
    True
    >>> parse_answer("The result of 12*7 is 84") is None
    True
    """
    if text is None:
        return None
    match = _ANSWER.match(text)
    return int(match.group(1)) if match else None


def reward(text: str | None, answer: int) -> float:
    """1.0 when the message's stated answer equals ``answer``, else 0.0.

    >>> reward("84", 84), reward("8 4", 84), reward("84, 85", 84)
    (1.0, 0.0, 0.0)
    """
    return 1.0 if parse_answer(text) == answer else 0.0
