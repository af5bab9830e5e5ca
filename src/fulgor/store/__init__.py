"""Stores: where rollouts, attempts, spans and resources live.

``Store`` is the protocol (its docstrings are the contract); ``MemoryStore`` keeps one process's
state in memory; ``SqliteStore`` is the embedded, durable default; ``SyncStore`` is the blocking
facade over any of them. ``open_store(url)`` builds one from a URL at the CLI/config edge.
"""

from __future__ import annotations

from fulgor.store.base import LATEST, Store
from fulgor.store.memory import MemoryStore
from fulgor.store.sqlite import SqliteStore
from fulgor.store.sync import SyncStore, open_store

__all__ = ["LATEST", "MemoryStore", "SqliteStore", "Store", "SyncStore", "open_store"]
