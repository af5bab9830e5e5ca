"""Benchmarks reach loopback only, as the tests do: each benchmark's ``main`` first calls
:func:`go_offline` (``tests/offline.py``: every library's switch against phoning home, and HTTP
proxies on a closed loopback port, for the benchmark and every process it starts); an install into
``.bench/``, which needs the network, takes :func:`online` of its environment."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tests.offline import go_offline, online

__all__ = ["go_offline", "online"]
