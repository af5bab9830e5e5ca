"""What the translated APIs (Anthropic Messages, OpenAI Responses) share: the list-of-objects check
on requests, the text of an upstream error chunk and of a stream cut short, and the named
server-sent event."""

from __future__ import annotations

import json
from typing import Any

from fulgor.gateway.errors import BadRequestError

__all__ = ["UNFINISHED", "JsonDict", "objects", "sse_event", "upstream_error_message"]

JsonDict = dict[str, Any]

# A translated stream ends in an error, not as a whole answer, when the upstream's stream stops
# (``[DONE]`` or end of body) before its choice has a finish reason.
UNFINISHED = "the upstream stream ended before the answer finished (no finish_reason); check the engine's log"


def objects(value: Any, what: str) -> list[JsonDict]:
    """``value`` when it is a list of JSON objects; BadRequestError (400) naming ``what`` if not."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise BadRequestError(f"{what} must be a list of JSON objects")
    return value


def upstream_error_message(error: Any) -> str:
    """The message of an upstream error chunk's ``error`` (an object or a bare value)."""
    message = error.get("message") if isinstance(error, dict) else None
    return f"upstream: {message or error}"


def sse_event(kind: str, payload: JsonDict) -> bytes:
    """A server-sent event named ``kind`` whose data is ``payload`` with ``type`` set to it."""
    data = json.dumps({"type": kind, **payload})
    return f"event: {kind}\ndata: {data}\n\n".encode()
