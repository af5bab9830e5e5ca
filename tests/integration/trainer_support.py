"""What the Trainer's integration tests share: a Trainer whose model is a simulated one on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fulgor import GRPO, Trainer
from fulgor.testing.openai_server import ScriptedOpenAIServer


def scripted_trainer(upstream: ScriptedOpenAIServer, run_dir: Path, **options: Any) -> Trainer:
    """A Trainer whose agents' calls go through the gateway to ``upstream`` (no weights: ``dev`` and
    ``evaluate``), with one runner and no progress bar unless ``options`` say otherwise."""
    settings: dict[str, Any] = {"n_runners": 1, "progress": False, **options}
    return Trainer(algorithm=GRPO(), upstream=upstream.url, model="scripted", run_dir=run_dir, **settings)
