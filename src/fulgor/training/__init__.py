"""Training: the Trainer that wires store, gateway, engine, runners and an algorithm together.

``Trainer(algorithm=GRPO(...), engine=EngineConfig(model=...), run_dir=...)``; ``fit`` trains,
``dev`` runs an agent through the same system without training; ``trackers=[TensorBoardTracker(),
WandbTracker(...)]`` send each step's metrics on (``fulgor[tracking]``). Needs ``fulgor[torch]`` and
``fulgor[server]`` when it runs (not to import).
"""

from __future__ import annotations

from fulgor.training.reports import DevReport, RolloutReport
from fulgor.training.runners import KubernetesRunners, RayRunners
from fulgor.training.tracking import TensorBoardTracker, WandbTracker
from fulgor.training.trainer import Trainer

__all__ = [
    "DevReport",
    "KubernetesRunners",
    "RayRunners",
    "RolloutReport",
    "TensorBoardTracker",
    "Trainer",
    "WandbTracker",
]
