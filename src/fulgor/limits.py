"""What fulgor accepts, in one place: the limits every write path holds records to, and how error
messages quote what they refuse.

Everything the store keeps must read back: a record that breaks these limits is refused when it is
written (a ``ValidationError`` naming the limit, a 400 over HTTP), never stored to fail every later
read. The store checks them under every backend (:mod:`fulgor.store._rules`), the OTLP endpoint
and the gateway check them before anything is stored or sent upstream.

How the values were chosen:

* ``MAX_JSON_DEPTH``: the nesting of one JSON value the store keeps (a span's attributes, a
  rollout's input, metadata). pydantic's JSON parser stops at 200 levels (``recursion limit
  exceeded``), counted over a whole document: a span adds 1 level around its attributes, an HTTP
  answer or request around it up to 4 more, the gateway's record 2 around the request it holds.
  Real requests sit far below: a chat request whose tool takes four levels of nested pydantic
  models nests 19 levels with the schema inlined (as LangChain sends it), 12 with ``$defs`` (the
  OpenAI Agents SDK), and OpenAI's structured outputs stop at 10 levels of nested objects, about 25
  JSON levels. 100 leaves that room several times over and stays half of pydantic's limit.
* ``MAX_SPAN_ATTRIBUTES_BYTES``: a span's attributes, its events' attributes and its resource
  together, as UTF-8 JSON. A model call span holds the whole request (up to
  ``MAX_MODEL_CALL_BODY_BYTES``), the response, and a token id and logprob per token: a 1M-token
  prompt's ids take about 7 MB. One span stays under ``MAX_BODY_BYTES`` with room for the request
  around it, so any span the store takes can cross HTTP alone.
* ``MAX_ID_CHARS`` and ``MAX_NAME_CHARS``: fulgor's ids are under 40 characters and OpenTelemetry's
  32; worker and resources ids already stopped at 256, span names at 512.
* ``MAX_BODY_BYTES`` (the store server's request limit) and ``MAX_MODEL_CALL_BODY_BYTES`` (the
  gateway's): a 200k-token chat history is about 1 MB of JSON; 16 MiB is Anthropic's own request
  limit halved, ample for text agents, and leaves a call's record room under the span limit.
* ``BODY_TIMEOUT_SECONDS``: how long a server waits for the next part of a request body before it
  answers 408 and closes the connection (nginx waits 60 s; a client on loopback or a LAN sends its
  body in milliseconds).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BODY_TIMEOUT_SECONDS",
    "MAX_BODY_BYTES",
    "MAX_ID_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_MODEL_CALL_BODY_BYTES",
    "MAX_NAME_CHARS",
    "MAX_QUOTED_CHARS",
    "MAX_SPAN_ATTRIBUTES_BYTES",
    "quoted",
]

MAX_JSON_DEPTH: Final = 100
MAX_SPAN_ATTRIBUTES_BYTES: Final = 24 * 2**20
MAX_ID_CHARS: Final = 256
MAX_NAME_CHARS: Final = 512
MAX_BODY_BYTES: Final = 32 * 2**20
MAX_MODEL_CALL_BODY_BYTES: Final = 16 * 2**20
BODY_TIMEOUT_SECONDS: Final = 30.0
MAX_QUOTED_CHARS: Final = 64


def quoted(value: object, *, bare: bool = False) -> str:
    """``value`` as an error message shows it: ``repr(value)``, or for a string longer than
    ``MAX_QUOTED_CHARS`` the repr of its start and its length, so that an answer never carries back
    a megabyte it refused. ``bare`` shows a string as it is, without the repr's quotes (a field path,
    a JSON excerpt), and cut the same way.

    >>> quoted("ro-1")
    "'ro-1'"
    >>> quoted("x" * 1000)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (1000 characters)"
    >>> quoted("messages.0.content", bare=True)
    'messages.0.content'
    """
    if isinstance(value, str):
        if len(value) <= MAX_QUOTED_CHARS:
            return value if bare else repr(value)
        start = value[:MAX_QUOTED_CHARS] if bare else repr(value[:MAX_QUOTED_CHARS])
        return f"{start}... ({len(value)} characters)"
    try:
        shown = repr(value)
    except ValueError:  # an int too long for its repr (Python's limit on digits)
        return f"a {type(value).__name__} too long to show"
    if len(shown) > MAX_QUOTED_CHARS + 2:
        return f"{shown[:MAX_QUOTED_CHARS]}... ({len(shown)} characters)"
    return shown
