"""The verl bridge: fulgor's trajectories as verl's ``DataProto``, verl's registered advantage
estimators and policy losses on them (``GRPOConfig(advantage="verl:grpo",
policy_loss="verl:vanilla")``), and the export of a run's trajectories for verl's trainer.

Needs verl (``pip install --no-deps -r requirements-verl.txt``); nothing here imports it before it
is used.
"""

from __future__ import annotations

from fulgor.algorithms.verl.bridge import (
    PREFIX,
    VerlPolicyLoss,
    advantage_names,
    compute_advantages,
    is_verl,
    policy_loss_names,
    to_data_proto,
    token_advantages,
)

__all__ = [
    "PREFIX",
    "VerlPolicyLoss",
    "advantage_names",
    "compute_advantages",
    "is_verl",
    "policy_loss_names",
    "to_data_proto",
    "token_advantages",
]
