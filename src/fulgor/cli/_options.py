"""Argument types shared by the command modules."""

from __future__ import annotations

import argparse
import math

__all__ = ["non_negative_float", "non_negative_int", "port_number", "positive_float", "positive_int"]


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
