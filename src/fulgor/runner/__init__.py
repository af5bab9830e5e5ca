"""Runners: where agents run, claiming rollouts from the store and reporting how they ended."""

from __future__ import annotations

from fulgor.runner.subprocess_agent import ProgramResult, SubprocessAgent
from fulgor.runner.worker import Runner, RunnerConfig, default_worker_id, gateway_base_url

__all__ = [
    "ProgramResult",
    "Runner",
    "RunnerConfig",
    "SubprocessAgent",
    "default_worker_id",
    "gateway_base_url",
]
