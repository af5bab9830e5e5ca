"""Property-based API testing with schemathesis against the served OpenAPI spec.

Every operation gets generated requests, valid and invalid; no answer may be a 5xx, and every
answer must match the spec (status code documented, content type, body schema). OTLP's JSON body is
generated from its OTLP/JSON schema (a request of another shape must be a 400 as a whole). Bounded in
examples so the whole run stays well under a minute.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
# Protobuf bodies (OTLP) cannot be generated from a schema; the OTLP tests cover them, and
# tests/reliability/test_bad_input.py the malformed ones.
pytestmark = pytest.mark.filterwarnings("ignore:Skipped test cases with unsupported payload media types")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import positive_data_acceptance  # noqa: E402
from starlette.types import Receive, Scope, Send  # noqa: E402

from fulgor.server import ServerConfig, create_app  # noqa: E402
from fulgor.store.sqlite import SqliteStore  # noqa: E402

# Every default check except positive_data_acceptance: some schema-valid inputs are rightly refused
# by rules JSON Schema cannot state (a span's end_time before its start_time, an unknown rollout id).
EXCLUDED = [positive_data_acceptance]

_directory = Path(tempfile.mkdtemp(prefix="fulgor-schemathesis-"))
# Long-polls are capped at 10 ms so generated wait_seconds cannot stall the run. No token: schemathesis
# would also negate the security header, which a fixed header defeats (test_server_api tests auth).
app = create_app(ServerConfig(store=SqliteStore(_directory / "store.sqlite"), max_wait_seconds=0.01))


async def served_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The app without its lifespan: schemathesis runs one per call, which would close the store."""
    if scope["type"] != "lifespan":
        await app(scope, receive, send)
        return
    while True:
        phase = (await receive())["type"].split(".")[1]
        await send({"type": f"lifespan.{phase}.complete"})
        if phase == "shutdown":
            return


schema = schemathesis.openapi.from_asgi("/openapi.json", served_app)


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_api_answers_match_the_spec_and_never_5xx(case: schemathesis.Case) -> None:
    case.call_and_validate(excluded_checks=EXCLUDED)
