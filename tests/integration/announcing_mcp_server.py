"""The example's MCP calculator server, saying on stderr when it starts: how a test counts the
servers a runner started (``tests/integration/test_calc_autogen.py``)."""

from __future__ import annotations

import os
import sys

import anyio

from examples.calc_autogen.calculator_server import main

if __name__ == "__main__":
    print(f"calculator server {os.getpid()} started", file=sys.stderr, flush=True)
    anyio.run(main)
