"""Prompt optimisation (APO): a critic and an editor model improve the agent's prompts, by beam
search over textual gradients or a Pareto front of candidates (GEPA)."""

from __future__ import annotations

from fulgor.algorithms.apo.algorithm import APO
from fulgor.algorithms.apo.candidates import Candidate, pareto_weights, read_edit

__all__ = ["APO", "Candidate", "pareto_weights", "read_edit"]
