"""The calc task through an AutoGen AgentChat ``AssistantAgent`` whose calculator is an MCP server."""
