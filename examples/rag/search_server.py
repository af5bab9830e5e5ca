"""The passages' search as an MCP tool server over stdio: one tool, ``search(query, k)``, answered
from the BM25 index of :mod:`examples.rag.index`.

    python -m examples.rag.search_server runs/rag/index.sqlite     # speaks MCP on stdin/stdout

The agent starts it (``MCPServerStdio``) and it ends when the agent closes its stdin or exits: a
runner process that dies takes its server with it. It needs the ``mcp`` package (2.x: its low-level
``Server`` takes the handlers as arguments; ``fulgor[frameworks]`` installs it) and the standard
library, nothing of fulgor.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp.server.stdio
import mcp.types as types
from mcp.server.lowlevel import Server

from examples.rag.index import MAX_K, SearchIndex, format_results

__all__ = ["SEARCH_TOOL", "list_tools", "main", "make_server"]

SEARCH_TOOL: dict[str, Any] = {
    "name": "search",
    "description": "Search the passages; returns the k best, one a line.",
    "inputSchema": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "k": {"type": "integer", "minimum": 1, "maximum": MAX_K}},
        "required": ["query"],
    },
}


async def list_tools(context: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(**SEARCH_TOOL)])


def make_server(index: SearchIndex) -> Server[Any]:
    async def call_tool(context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name != SEARCH_TOOL["name"]:
            return _error(f"unknown tool {params.name!r}; the one tool is 'search'")
        query, k = arguments.get("query"), arguments.get("k", 3)
        if not isinstance(query, str) or not isinstance(k, int) or isinstance(k, bool):
            return _error("search takes a string 'query' and an optional integer 'k'")
        text = format_results(index.search(query, k))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server("rag-search", on_list_tools=list_tools, on_call_tool=call_tool)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


async def main(index_path: str) -> None:
    server = make_server(SearchIndex(index_path))
    async with mcp.server.stdio.stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m examples.rag.search_server INDEX.sqlite")
    anyio.run(main, sys.argv[1])
