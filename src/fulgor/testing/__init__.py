"""Fakes shipped with fulgor for tests and benchmarks: a scripted OpenAI-compatible server."""

from __future__ import annotations

from fulgor.testing.openai_server import (
    Sample,
    ScriptedOpenAIServer,
    ScriptedReply,
    ScriptedToolCall,
    encode,
)

__all__ = ["Sample", "ScriptedOpenAIServer", "ScriptedReply", "ScriptedToolCall", "encode"]
