"""ModelNames: the model an upstream is asked for, whatever name the agent's own code sends.

An agent written for a hosted model names that model (``gpt-4.1-mini``, ``claude-sonnet-4-5``);
pointed at the gateway unchanged, its calls must reach the model being trained. So the gateway
serves every call with the model its rollout's resources name (the rollout's LLM resource: the one
whose model the agent sent, else the one named ``llm``, else the only one), unless ``mapping``
names the model for the name sent (``{"gpt-4.1-mini": "small"}``; mapping a name to itself keeps
it). A rollout whose resources name no LLM keeps the name sent, or gets ``default`` when one is
set. The recorded call keeps the name the agent sent (``ModelCall.requested_model``).

A call that names its agent (an ``X-Fulgor-Agent`` header) goes to the model the rollout's LLM
resource gives that agent in ``LLM.agent_models`` (by the longest key the agent's name starts
with): one LoRA adapter per agent of a multi-agent system, each served under its own name. A
mapping for the name sent still wins.

A rollout's resources are read from the store once (its first call) and kept for the gateway's
life: a rollout runs with one resources version.
"""

from __future__ import annotations

from collections.abc import Mapping

from fulgor.errors import NotFoundError
from fulgor.store.base import Store
from fulgor.types import LLM

__all__ = ["ModelNames"]

_MAX_CACHED = 100_000
_LLM_RESOURCE = "llm"


class ModelNames:
    def __init__(self, store: Store, mapping: Mapping[str, str], default: str | None = None) -> None:
        self._store = store
        self._mapping = dict(mapping)
        self._default = default
        self._by_rollout: dict[str, dict[str, LLM]] = {}  # rollout id -> its LLM resources

    async def upstream_model(self, rollout_id: str, sent: str | None, agent: str | None = None) -> str | None:
        """The model to ask the upstream for, for a call of ``rollout_id`` that named ``sent``
        (made by ``agent``, when the call names it)."""
        if sent is not None and sent in self._mapping:
            return self._mapping[sent]
        llms = await self._llms_of(rollout_id)
        llm = _rollout_llm(llms, sent)
        if llm is None:
            return self._default if self._default is not None else sent
        return llm.model_for(agent)

    async def _llms_of(self, rollout_id: str) -> dict[str, LLM]:
        known = self._by_rollout.get(rollout_id)
        if known is not None:
            return known
        try:
            rollout = await self._store.get_rollout(rollout_id)
            version = await self._store.get_resources(rollout.resources_id)
        except NotFoundError:  # the rollout guard answers for unknown rollouts; nothing to map here
            return {}
        llms = {
            name: resource
            for name, resource in (version.resources.items() if version is not None else ())
            if isinstance(resource, LLM)
        }
        if len(self._by_rollout) >= _MAX_CACHED:
            self._by_rollout.clear()
        self._by_rollout[rollout_id] = llms
        return llms


def _rollout_llm(llms: Mapping[str, LLM], sent: str | None) -> LLM | None:
    """The rollout's LLM resource for a call that named ``sent``: the one of that model, else the
    one named ``llm``, else the only one."""
    for llm in llms.values():
        if sent is not None and llm.model == sent:
            return llm
    if _LLM_RESOURCE in llms:
        return llms[_LLM_RESOURCE]
    return next(iter(llms.values())) if len(llms) == 1 else None
