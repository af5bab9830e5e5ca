"""An MCP tool server that lists the calculator and then crashes on its first call: what a tool
server with a bug does to a rollout (``tests/integration/test_calc_autogen.py``)."""

from __future__ import annotations

import os
import sys

import anyio
import mcp.server.stdio
import mcp.types as types
from mcp.server.lowlevel import Server

from examples.calc.calculator import CALCULATOR_TOOL

server = Server("calculator")
_FUNCTION = CALCULATOR_TOOL["function"]


@server.list_tools()  # type: ignore[misc, no-untyped-call]
async def list_tools() -> list[types.Tool]:
    return [
        types.Tool(
            name=_FUNCTION["name"], description=_FUNCTION["description"], inputSchema=_FUNCTION["parameters"]
        )
    ]


@server.call_tool()  # type: ignore[misc]
async def call_tool(name: str, arguments: dict[str, object]) -> list[types.TextContent]:
    print("calculator server crashed: a bug on its first call", file=sys.stderr, flush=True)
    os._exit(3)


async def main() -> None:
    async with mcp.server.stdio.stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
