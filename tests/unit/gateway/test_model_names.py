"""Which model an upstream is asked for: the rollout's, whatever name the agent's code sends."""

from __future__ import annotations

from fulgor.gateway.model_names import ModelNames
from fulgor.store import MemoryStore
from fulgor.types import LLM, PromptTemplate, RolloutRequest


async def rollout_with(store: MemoryStore, **llms: str) -> str:
    resources = {name: LLM(endpoint="http://engine/v1", model=model) for name, model in llms.items()}
    version = await store.put_resources({**resources, "prompt": PromptTemplate(template="{q}")})
    attempted = await store.start_rollout(RolloutRequest(input={}, resources_id=version.resources_id), "w")
    return attempted.rollout_id


async def test_the_rollouts_llm_serves_whatever_name_is_sent() -> None:
    store = MemoryStore()
    names = ModelNames(store, {})
    one = await rollout_with(store, llm="small")
    assert await names.upstream_model(one, "gpt-4.1-mini") == "small"
    assert await names.upstream_model(one, None) == "small"
    assert await names.upstream_model(one, "small") == "small"
    only = await rollout_with(store, policy="tiny")  # one LLM, whatever its resource name
    assert await names.upstream_model(only, "claude-sonnet-4-5") == "tiny"


async def test_with_several_llms_a_name_sent_picks_one_else_the_one_named_llm() -> None:
    store = MemoryStore()
    names = ModelNames(store, {})
    rollout = await rollout_with(store, llm="writer-model", checker="checker-model")
    assert await names.upstream_model(rollout, "checker-model") == "checker-model"
    assert await names.upstream_model(rollout, "gpt-4.1") == "writer-model"
    neither = await rollout_with(store, writer="w", checker="c")
    assert await names.upstream_model(neither, "gpt-4.1") == "gpt-4.1"  # ambiguous: as sent


async def test_a_mapping_wins_and_a_default_serves_rollouts_without_an_llm() -> None:
    store = MemoryStore()
    rollout = await rollout_with(store, llm="small")
    mapped = ModelNames(store, {"gpt-4.1-mini": "big", "keep": "keep"})
    assert await mapped.upstream_model(rollout, "gpt-4.1-mini") == "big"
    assert await mapped.upstream_model(rollout, "keep") == "keep"
    await store.put_resources({})  # the latest version names no LLM
    bare = (await store.start_rollout(RolloutRequest(input={}), "w")).rollout_id
    assert await ModelNames(store, {}).upstream_model(bare, "gpt-4.1-mini") == "gpt-4.1-mini"
    assert await ModelNames(store, {}, default="small").upstream_model(bare, "gpt-4.1-mini") == "small"
    assert await ModelNames(store, {}).upstream_model("ro-unknown", "x") == "x"


async def test_a_call_that_names_its_agent_goes_to_that_agents_model() -> None:
    store = MemoryStore()
    llm = LLM(
        endpoint="http://engine/v1", model="base", agent_models={"write": "base-write", "rewrite": "base-rw"}
    )
    version = await store.put_resources({"llm": llm})
    request = RolloutRequest(input={}, resources_id=version.resources_id)
    rollout = (await store.start_rollout(request, "w")).rollout_id
    names = ModelNames(store, {})
    assert await names.upstream_model(rollout, "gpt-4.1", "write_query") == "base-write"
    assert await names.upstream_model(rollout, "gpt-4.1", "rewrite_query") == "base-rw"  # the longest start
    assert await names.upstream_model(rollout, "gpt-4.1", "check_query") == "base"  # no adapter: the base
    assert await names.upstream_model(rollout, "gpt-4.1") == "base"  # no agent named
    assert (
        await ModelNames(store, {"gpt-4.1": "big"}).upstream_model(rollout, "gpt-4.1", "write_query") == "big"
    )
