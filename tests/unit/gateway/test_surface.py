"""The gateway's public surface: sorted names, errors with codes and HTTP statuses."""

from __future__ import annotations

import pytest

import fulgor.gateway
import fulgor.testing
from fulgor.errors import FulgorError
from fulgor.gateway import errors


@pytest.mark.parametrize("module", [fulgor.gateway, fulgor.testing, errors])
def test_all_is_sorted_and_importable(module: object) -> None:
    names = list(module.__all__)  # type: ignore[attr-defined]
    assert names == sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    for name in names:
        assert hasattr(module, name), name


def test_every_gateway_error_has_a_unique_code_and_a_status() -> None:
    codes = set()
    for name in errors.__all__:
        error_type = getattr(errors, name)
        assert issubclass(error_type, FulgorError)
        assert 400 <= error_type.status < 600
        codes.add(error_type.code)
    assert len(codes) == len(errors.__all__)
