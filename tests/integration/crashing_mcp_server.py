"""The example's MCP calculator server, but its tool crashes the process on the first call: what a
tool server with a bug does to a rollout (``tests/integration/test_calc_autogen.py``)."""

from __future__ import annotations

import os
import sys

import anyio
import mcp.types as types

from examples.calc_autogen.calculator_server import main, server


@server.call_tool()  # type: ignore[misc]  # replaces the calculator's handler
async def call_tool(name: str, arguments: dict[str, object]) -> list[types.TextContent]:
    print("calculator server crashed: a bug on its first call", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    anyio.run(main)
