"""A one-call agent whose reward depends on its prompt, and simulations to optimise it with APO.

The simulated model (``model_reply``) answers with one "YES" per rule of ``RULES`` that the
messages it is sent state; the agent's reward is the share of rules its prompt states, with the
task's feedback naming how many. The simulated critic (``optimizer_reply``) names one rule the
prompt under critique lacks; the editor appends the rules its critique names. Both speak the real
OpenAI protocol through ScriptedOpenAIServer, in the request format fulgor's APO sends.
"""

from __future__ import annotations

import re
from typing import Any

from openai import AsyncOpenAI

from fulgor import LLM, PromptTemplate, emit_reward, rollout
from fulgor.testing import ScriptedReply

RULES = ("Be brief.", "Say yes.", "Use capitals.")
SEED = "Answer question {q}."
_PROMPT = re.compile(r'<prompt name="[^"]+">\n(.*?)\n</prompt>', re.DOTALL)
_CRITIQUE = re.compile(r"<critique>\n(.*?)\n</critique>", re.DOTALL)


def model_reply(body: dict[str, Any]) -> ScriptedReply:
    """One YES per rule the messages state (and a full stop)."""
    text = " ".join(str(m.get("content") or "") for m in body["messages"])
    return ScriptedReply(text="YES" * sum(rule in text for rule in RULES) + ".")


def optimizer_reply(body: dict[str, Any]) -> ScriptedReply:
    """The critic names the first rule the prompt lacks; the editor appends the rules named."""
    text = body["messages"][-1]["content"]
    found = _PROMPT.search(text)
    prompt = found.group(1) if found else ""
    critique = _CRITIQUE.search(text)
    if critique is not None:
        named = [rule for rule in RULES if rule in critique.group(1) and rule not in prompt]
        return ScriptedReply(text=prompt + "".join(f" {rule}" for rule in named))
    missing = [rule for rule in RULES if rule not in prompt]
    return ScriptedReply(text=f"- State this rule: {missing[0]}" if missing else "- No change needed.")


async def _answer(llm: LLM, content: str) -> str:
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": content}], **llm.sampling_parameters
        )
    finally:
        await client.close()
    return reply.choices[0].message.content or ""


@rollout
async def prompted(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> None:
    """One call with the prompt filled in; the reward is the share of rules the answer shows."""
    followed = (await _answer(llm, prompt_template.format(q=task["q"]))).count("YES")
    emit_reward(followed / len(RULES), feedback=f"the answer followed {followed} of {len(RULES)} rules")


@rollout
async def unprompted(task: dict[str, Any], llm: LLM) -> float:
    """An agent that takes no prompt: optimising one for it is refused."""
    return float("YES" in await _answer(llm, str(task["q"])))
