"""The calculator as an MCP tool server over stdio: one tool, ``calculator``, with the calc demo's
exact name, description and input schema, answered by the same safe evaluator.

    python -m examples.calc_autogen.calculator_server     # speaks MCP on stdin/stdout

It runs wherever the agent runs (the AutoGen example's own virtual environment): it needs the
``mcp`` package and the standard library, nothing of fulgor. That environment holds mcp 1.x, which
autogen-ext 0.7.5 needs, so this server registers its handlers with mcp 1's decorators (the RAG
example's search server, on mcp 2, passes them to ``Server`` instead).
"""

from __future__ import annotations

import anyio
import mcp.server.stdio
import mcp.types as types
from mcp.server.lowlevel import Server

from examples.calc.calculator import CALCULATOR_TOOL, calculate

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
    if name != _FUNCTION["name"]:
        return [types.TextContent(type="text", text=f"error: unknown tool {name!r}")]
    return [types.TextContent(type="text", text=calculate(str(arguments.get("expression", ""))))]


async def main() -> None:
    async with mcp.server.stdio.stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
