"""Fakes shipped with fulgor for tests and benchmarks: a scripted OpenAI-compatible server, and
simulated models of the rooms example's agent and prompt optimiser that answer through it, and a
simulated Kubernetes API server that runs Jobs as local processes."""

from __future__ import annotations

from fulgor.testing.kubernetes_api import SimulatedJob, SimulatedKubernetesAPI
from fulgor.testing.openai_server import (
    Sample,
    ScriptedOpenAIServer,
    ScriptedReply,
    ScriptedToolCall,
    encode,
)
from fulgor.testing.rooms import (
    RoomsModel,
    RoomsOptimizer,
    simulated_optimizer,
    simulated_rooms_model,
)

__all__ = [
    "RoomsModel",
    "RoomsOptimizer",
    "Sample",
    "ScriptedOpenAIServer",
    "ScriptedReply",
    "ScriptedToolCall",
    "SimulatedJob",
    "SimulatedKubernetesAPI",
    "encode",
    "simulated_optimizer",
    "simulated_rooms_model",
]
