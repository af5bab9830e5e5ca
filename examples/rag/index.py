"""The passages' search index: an SQLite FTS5 table ranked by BM25.

>>> import pathlib, tempfile
>>> passages = ["Kelmar is a city in Drevia.", "Talvor was born in Kelmar.", "Talvor works for Trelco."]
>>> index = SearchIndex(build_index(pathlib.Path(tempfile.mkdtemp()) / "index.sqlite", passages))
>>> index.search("Talvor born", 1), index.search("Kelmar city", 1)
(['Talvor was born in Kelmar.'], ['Kelmar is a city in Drevia.'])
>>> index.search("Talvor", 5)
['Talvor works for Trelco.', 'Talvor was born in Kelmar.']
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MAX_K", "SearchIndex", "build_index", "format_results"]

MAX_K = 5
"""The most passages one search returns."""
_WORD = re.compile(r"[A-Za-z0-9]+")


def build_index(path: Path, passages: Sequence[str]) -> Path:
    """Write ``passages`` into a new FTS5 index at ``path`` (written whole, then renamed into place,
    so that a reader never sees half an index); an existing index there is kept as it is."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    with sqlite3.connect(partial) as connection:
        connection.execute("CREATE VIRTUAL TABLE passages USING fts5(text)")
        connection.executemany("INSERT INTO passages (text) VALUES (?)", [(text,) for text in passages])
    connection.close()
    partial.rename(path)
    return path


class SearchIndex:
    """Read-only BM25 search over an index :func:`build_index` wrote."""

    def __init__(self, path: Path | str) -> None:
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"no search index at {path}: build it with examples.rag.index.build_index"
            )
        self._connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)

    def search(self, query: str, k: int = 3) -> list[str]:
        """The ``k`` passages (at most :data:`MAX_K`) that best match the query: those holding all
        of its words first, then those holding any, each group by BM25."""
        words = _WORD.findall(query)
        if not words:
            return []
        limit = max(1, min(int(k), MAX_K))
        quoted = [f'"{word}"' for word in words]
        found: list[str] = []
        for match in (" AND ".join(quoted), " OR ".join(quoted)):
            rows = self._connection.execute(
                "SELECT text FROM passages WHERE passages MATCH ? ORDER BY bm25(passages) LIMIT ?",
                (match, limit),
            ).fetchall()
            found += [text for (text,) in rows if text not in found]
            if len(found) >= limit:
                break
        return found[:limit]

    def close(self) -> None:
        self._connection.close()


def format_results(passages: Sequence[str]) -> str:
    """What the search tool answers: one passage a line, or a line saying nothing matched.

    >>> format_results(["A is a city in B.", "C works for D."])
    'A is a city in B.\\nC works for D.'
    >>> format_results([])
    'no passage matches'
    """
    return "\n".join(passages) if passages else "no passage matches"
