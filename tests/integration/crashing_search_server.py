"""The RAG example's search server, but its tool crashes the process on the first call: what a tool
server with a bug does to a rollout (``tests/integration/test_rag_example.py``)."""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import mcp.server.stdio
from mcp.server.lowlevel import Server

from examples.rag.search_server import list_tools


async def crash(context: Any, params: Any) -> Any:
    print("search server crashed: a bug on its first call", file=sys.stderr, flush=True)
    os._exit(3)


async def main() -> None:
    server: Server[Any] = Server("rag-search", on_list_tools=list_tools, on_call_tool=crash)
    async with mcp.server.stdio.stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)  # takes the index path like the real server, and ignores it
