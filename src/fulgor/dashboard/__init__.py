"""The dashboard: every run, rollout, model call and token of a store, in a browser.

``fulgor serve`` serves it at ``/`` beside the store API (``ServerConfig(dashboard=...)``), live
while a run trains; ``fulgor dashboard RUN_DIR`` serves it read-only over an ended run's SQLite
store and metrics. Pages: Runs (curves and steps, store counts), Rollouts (filters, sort, pages),
one rollout (attempts, span timeline, rewards, each model call's chat and tokens and why it was or
was not trained on), Resources (versions, prompt diffs) and Workers. Its HTML, CSS and script ship
in the package: nothing is fetched from elsewhere, and there is no build step.
"""

from fulgor.dashboard.app import Dashboard
from fulgor.dashboard.reader import RolloutQuery, SqliteReader, StoreReader, open_reader

__all__ = ["Dashboard", "RolloutQuery", "SqliteReader", "StoreReader", "open_reader"]
