"""The RAG task's own verification: 0.1 x format + 0.9 x token F1 of the answer against the gold.

The format term pays for a final message that is ``Answer: TEXT`` and nothing else; F1 compares
the answer's words with the gold answer's (lower-cased, punctuation dropped), so an answer that
names the right entity among others earns part of the reward, and one that names another entity
earns none of it. A message out of format is scored on its whole text.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TypedDict

__all__ = ["Score", "answer_f1", "parse_answer", "score"]

_ANSWER = re.compile(r"^\s*answer\s*:\s*(.+?)\s*$", re.IGNORECASE | re.DOTALL)
_WORD = re.compile(r"[a-z0-9]+")
FORMAT_WEIGHT = 0.1


class Score(TypedDict):
    reward: float
    f1: float
    format: float


def parse_answer(text: str | None) -> str | None:
    """The answer the message states in the ``Answer: TEXT`` format, or None.

    >>> parse_answer("Answer: Drevia."), parse_answer("Drevia"), parse_answer("Answer:")
    ('Drevia.', None, None)
    """
    match = _ANSWER.match(text or "")
    return match.group(1) if match else None


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def answer_f1(prediction: str, gold: str) -> float:
    """Token F1 of ``prediction`` against ``gold``.

    >>> answer_f1("Drevia", "drevia"), answer_f1("Kelmar or Drevia", "Drevia"), answer_f1("Kelmar", "Drevia")
    (1.0, 0.5, 0.0)
    """
    predicted, expected = _words(prediction), _words(gold)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def score(text: str | None, gold: str) -> Score:
    """The reward of a final message, with its two terms.

    >>> score("Answer: Drevia", "Drevia")
    {'reward': 1.0, 'f1': 1.0, 'format': 1.0}
    >>> score("Answer: Kelmar", "Drevia")
    {'reward': 0.1, 'f1': 0.0, 'format': 1.0}
    >>> score("it is Drevia", "Drevia")["reward"]
    0.45
    >>> score(None, "Drevia")["reward"]
    0.0
    """
    answer = parse_answer(text)
    formatted = 1.0 if answer is not None else 0.0
    f1 = answer_f1(answer if answer is not None else text or "", gold)
    reward = round(FORMAT_WEIGHT * formatted + (1 - FORMAT_WEIGHT) * f1, 6)
    return Score(reward=reward, f1=f1, format=formatted)
