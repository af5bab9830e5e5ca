"""Retrieval QA over a made-up world: an OpenAI Agents SDK agent searching through an MCP server."""
