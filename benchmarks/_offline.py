"""Benchmarks reach loopback only, as the tests do: each benchmark's ``main`` first calls
:func:`go_offline` (``tests/offline.py``: every library's switch against phoning home, for the
benchmark and every process it starts)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tests.offline import go_offline

__all__ = ["go_offline"]
