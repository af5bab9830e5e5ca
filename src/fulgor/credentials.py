"""Credentials: the operator's key, and the credential each attempt's agent gets instead of it.

The operator key is the run's secret: runners and trainers send it to the store API, and the
gateway's admin routes need it. An agent never gets it. Each attempt's agent gets a credential
derived from it (an HMAC of the rollout and attempt ids under the operator key), which the gateway
and the OTLP endpoint take for that attempt only: whoever holds the operator key can check a
credential without asking the store, and no credential says anything about another attempt.
A credential is refused once its attempt has ended (the routes that take it check that).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["ATTEMPT_CREDENTIAL_PREFIX", "attempt_credential", "is_attempt_credential", "new_operator_key"]

ATTEMPT_CREDENTIAL_PREFIX = "fulgor-attempt-"


def new_operator_key() -> str:
    """A fresh random operator key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def attempt_credential(operator_key: str, rollout_id: str, attempt_id: str) -> str:
    """The credential of one attempt: good for that attempt's gateway URL and OTLP export only."""
    message = f"{rollout_id}\x00{attempt_id}".encode()
    mac = hmac.new(operator_key.encode(), message, hashlib.sha256).hexdigest()[:40]
    return ATTEMPT_CREDENTIAL_PREFIX + mac


def is_attempt_credential(operator_key: str, rollout_id: str, attempt_id: str, presented: bytes) -> bool:
    """Whether ``presented`` is the credential of this attempt (compared in constant time)."""
    expected = attempt_credential(operator_key, rollout_id, attempt_id).encode()
    return hmac.compare_digest(presented, expected)
