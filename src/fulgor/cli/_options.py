"""Argument types shared by the command modules."""

from __future__ import annotations

import argparse
import math

__all__ = [
    "add_chat_arguments",
    "non_negative_float",
    "non_negative_int",
    "port_number",
    "positive_float",
    "positive_int",
]


def port_number(text: str) -> int:
    """``--port``: an integer from 0 to 65535 (0 picks a free port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; pass 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range; pass 0 to 65535 (0 picks a free port)")
    return port


def positive_int(text: str) -> int:
    """A count: an integer of at least 1."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number of at least 0 (a version number)."""
    return _whole_number(text, 0)


def positive_float(text: str) -> float:
    """A finite number greater than 0 (seconds, a learning rate)."""
    value = _finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (a temperature)."""
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; pass {least} or more") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is too small; pass {least} or more")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """``--chat-template``, ``--tool-call-parser`` and ``--reasoning-parser``, as ``fulgor engine``
    and ``fulgor train`` take them (and hand them to vLLM)."""
    from fulgor.engine.chat_format import SHIPPED_TEMPLATES
    from fulgor.engine.reasoning import REASONING_PARSERS
    from fulgor.engine.tool_calls import TOOL_PARSERS

    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template in place of the model's own, or the name of a tool-aware one "
        f"fulgor ships: {', '.join(SHIPPED_TEMPLATES)}",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS),
        help="how tool calls are read from the model's output (vLLM's names; default: detected from "
        "the chat template, else hermes)",
    )
    parser.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS),
        help="return <think> reasoning as reasoning_content (default: detected from the chat template)",
    )
