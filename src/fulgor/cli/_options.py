"""Argument types shared by the command modules."""

from __future__ import annotations

import argparse

__all__ = ["port_number"]


def port_number(text: str) -> int:
    """``--port``: an integer from 0 to 65535 (0 picks a free port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; pass 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range; pass 0 to 65535 (0 picks a free port)")
    return port
