"""The simulated rooms model and prompt optimiser: the model follows exactly the rules its prompt
states; the optimiser's critic and editor read fulgor's requests and Agent Lightning 0.3.0's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import AsyncOpenAI

from examples.rooms.agent import SEED_PROMPT, SEED_SYSTEM_PROMPT, first_messages
from examples.rooms.dataset import make_splits, make_tasks
from examples.rooms.rules import grade
from examples.rooms.tools import ROOMS_TOOL, run_tool
from fulgor import PromptTemplate
from fulgor.testing import RoomsModel, RoomsOptimizer, simulated_optimizer, simulated_rooms_model
from fulgor.testing.rooms import HARD_RULES, RULE_SENTENCES, TIE_BREAKS, read_request, stated_rules

SEED = SEED_PROMPT.template

# What Agent Lightning 0.3.0's APO sends its critic (text_gradient_variant01-03) and its editor
# (apply_edit_variant01-02): its POML templates rendered by poml 0.0.8 with format="openai_chat", for
# the seed prompt, two experiments (rewards 0.0 and 1.0) and the critique "- The room must seat every
# attendee.\n- Then prefer the closest room.".
AGL_MESSAGES: dict[str, list[dict[str, str]]] = {
    "text_gradient_variant01": [
        {
            "role": "user",
            "content": (
                "You optimize a prompt template.\n"
                "\n"
                "# Original Prompt Template\n"
                "\n"
                f"{SEED}\n"
                "\n"
                "# Experiments with Original Prompt Template\n"
                "\n"
                "## Experiment 1\n"
                "\n"
                "This experiment has succeeded. It gets a final reward: 0\n"
                "\n"
                "### Rollout Traces (Chat Messages, Grader Requests included)\n"
                "\n"
                '[{"messages":[{"role":"user","content":"Book a meeting room for this '
                "meeting.\\nDate: 2025-03-05\\nStart: 10:00\\nLength: 60 minutes\\nAttendees: 5\\nNeeds: "
                "projector\\nWheelchair access: no\\nLook the rooms up with the list_rooms tool, then "
                "reply with only the name of the room to book, or No Room if there is "
                'none."},{"role":"assistant","content":"Hazel"}],"tools":[]}]\n'
                "\n"
                "## Experiment 2\n"
                "\n"
                "This experiment has succeeded. It gets a final reward: 1\n"
                "\n"
                "### Rollout Traces (Chat Messages, Grader Requests included)\n"
                "\n"
                '[{"messages":[{"role":"user","content":"Book a meeting room for this '
                "meeting.\\nDate: 2025-03-05\\nStart: 10:00\\nLength: 60 minutes\\nAttendees: 5\\nNeeds: "
                "projector\\nWheelchair access: no\\nLook the rooms up with the list_rooms tool, then "
                "reply with only the name of the room to book, or No Room if there is "
                'none."},{"role":"assistant","content":"Cedar"}],"tools":[]}]\n'
                "\n"
                "# Your Task\n"
                "\n"
                "Produce a brief critique listing specific causes for the error or ways to raise "
                "reward next time. Return a bullet list with concrete, testable changes (format, "
                "constraints, ordering, definitions)."
            ),
        },
    ],
    "text_gradient_variant02": [
        {
            "role": "user",
            "content": (
                "# Role\n"
                "\n"
                "You are a prompt engineer.\n"
                "\n"
                "# Task\n"
                "\n"
                "Analyze where the current prompt failed to elicit the right mechanism.\n"
                "\n"
                "# Current Prompt Template\n"
                "\n"
                f"{SEED}\n"
                "\n"
                "# Sample Runs with Current Prompt Template\n"
                "\n"
                "The following are the OpenTelemetry spans collected from the sample runs with the "
                "current prompt template. They should contain both prompt, responses and rewards.\n"
                "\n"
                "## Sample Run #1 Diagnostics\n"
                "\n"
                '{"name":"agentlightning.annotation","attributes":{"agentlightning.reward.0.name":"pr'
                'imary","agentlightning.reward.0.value":0}}\n'
                "\n"
                "## Sample Run #2 Diagnostics\n"
                "\n"
                '{"name":"agentlightning.annotation","attributes":{"agentlightning.reward.0.name":"pr'
                'imary","agentlightning.reward.0.value":1}}\n'
                "\n"
                "# Output Format\n"
                "\n"
                "Write 3-5 short bullets titled 'Critique:' focusing on missing constraints, "
                "ordering, or formatting."
            ),
        },
    ],
    "text_gradient_variant03": [
        {
            "role": "system",
            "content": (
                "# Role\n"
                "\n"
                "You are an expert prompt engineer.\n"
                "\n"
                "# Task\n"
                "\n"
                "Your task is to analyze the prompt and provide a critique of the prompt. Follow the "
                "steps below to create the critique. \n"
                "\n"
                "## 1. Structural Issues\n"
                "\n"
                "These flaws block clarity and logic. Always check them first.\n"
                "\n"
                "- **Missing goal**: The prompt never defines what success looks like. Ask: *Can I "
                "summarize its output goal in one line?*\n"
                "- **Contradictions**: Two or more instructions conflict. Search for words like "
                "*never*, *always*, *except*, *but also*.\n"
                "- **Circular dependencies**: The model is told to do A before B and B before A.\n"
                "- **No stop condition**: The prompt doesn\u2019t say when the task is done. Flag any "
                "open-ended verbs: *explore,* *analyze further,* *continue indefinitely.*\n"
                "\n"
                "## 2. Instruction Quality\n"
                "\n"
                "Examine how the instructions are stated and ordered to ensure clarity and "
                "enforceability.\n"
                "\n"
                "- **Vague verbs**: Avoid terms like *optimize,* *improve,* and *ensure.* Use "
                "precise, measurable instructions.\n"
                "- **Lack of hierarchy**: All rules appear equally important, making conflict "
                "resolution impossible. Clarify rule precedence.\n"
                "- **Mixed abstraction**: High-level policies are interleaved with implementation "
                "details. Keep principles separate from step-by-step actions.\n"
                "- **Overlapping scope**: Similar instructions appear in several sections with minor "
                "changes. Identify and consolidate duplicates.\n"
                "\n"
                "## 3. Control and Behavior\n"
                "\n"
                "Review boundaries on model autonomy, tool use, and communication style.\n"
                "\n"
                "- **No tool limits**: Limits on tool calls, retries, or time not specified. Define "
                "boundaries for operations.\n"
                "- **Unclear uncertainty handling**: Conflicting instructions regarding clarifying "
                "uncertainties vs. never asking users. Select one behavior.\n"
                "- **Verbosity confusion**: Some parts demand detailed answers, others specify "
                "brevity. Highlight and resolve inconsistency.\n"
                "- **Feedback omission**: No plan for progress reporting or preamble during "
                "multi-step operations.\n"
                "\n"
                "## 4. Input and Output Specification\n"
                "\n"
                "Assess if required data and expected output formats are clearly defined.\n"
                "\n"
                "- **No input defaults**: What should happen if a needed value is absent or invalid "
                "isn\u2019t explained.\n"
                "- **Output schema missing**: Expected response format or sections are not spelled "
                "out.\n"
                "- **Format inconsistency**: Output style (Markdown, JSON, XML, etc.) shifts "
                "mid-prompt. Ensure format requirements are stable.\n"
                "- **No validation**: Lacks steps like *verify results before submitting* or "
                "*summarize at end.*\n"
                "\n"
                "## 5. Scope and Safety\n"
                "\n"
                "Ensure prompt actions remain within safe, authorized boundaries.\n"
                "\n"
                "- **Scope creep**: Open-ended statements such as *feel free to enhance* can justify "
                "unrelated changes.\n"
                "- **Unsafe actions**: Allows deletions or modifications without explicit user "
                "approval.\n"
                "- **No error handling**: What happens if a tool call fails or data is missing is "
                "not addressed.\n"
                "- **User authority ambiguity**: Model may act for multiple users or perform "
                "irreversible actions without checks.\n"
                "\n"
                "## 6. Efficiency and Maintainability\n"
                "\n"
                "Consider the prompt\u2019s length, redundancy, and future comprehensibility.\n"
                "\n"
                "- **Overexplained**: Verbose explanations where concise, numbered steps suffice.\n"
                "- **Redundancy**: Similar rules scattered in multiple aliases; centralize and "
                "summarize them.\n"
                "- **Hidden assumptions**: Implicit defaults (like timezone, language) are not "
                "stated.\n"
                "- **Poor auditability**: Lacks section markers (e.g., `policy`, `procedure`). "
                "Structure prompt for easy review.\n"
                "\n"
                "## 7. Testing Method\n"
                "\n"
                "Methodical approach for reviewing a prompt:\n"
                "\n"
                "- Read the prompt fully; highlight all unclear or contradictory instructions.\n"
                "\n"
                "- For each main area, answer: \n"
                "\n"
                "  1. What is the intended outcome?\n"
                "  2. What is the stop or completion condition?\n"
                "  3. How are conflicts between rules resolved?\n"
                "  4. What are the explicit limits (tools, run time, tokens)?\n"
                "  5. What should the output format be?\n"
                "\n"
                "- Rate each section: *clear*, *incomplete*, *contradictory*, or *redundant*.\n"
                "- Summarize findings under categories: structure, control, scope, format, safety.\n"
                "\n"
                "This method surfaces issues such as ambiguity, contradiction, missing boundaries, "
                "and output uncertainty\u2014core failure modes in prompting identified by the GPT-5 "
                "prompting guide.\n"
                "\n"
                "# Output Format\n"
                "\n"
                "Respond with a complete analysis and critique of the prompt. Be concise and direct. "
                "Less than 350 words."
            ),
        },
        {
            "role": "user",
            "content": (
                "# Prompt\n"
                "\n"
                f"{SEED}\n"
                "\n"
                "# Sample Runs of the Prompts (Historical Messages and Rewards)\n"
                "\n"
                "## Sample Run #1\n"
                "\n"
                "### Overall Status\n"
                "\n"
                "This run has succeeded. The final score is 0.\n"
                "\n"
                "### Messages\n"
                "\n"
                '[{"messages":[{"role":"user","content":"Book a meeting room for this '
                "meeting.\\nDate: 2025-03-05\\nStart: 10:00\\nLength: 60 minutes\\nAttendees: 5\\nNeeds: "
                "projector\\nWheelchair access: no\\nLook the rooms up with the list_rooms tool, then "
                "reply with only the name of the room to book, or No Room if there is "
                'none."},{"role":"assistant","content":"Hazel"}],"tools":[]}]\n'
                "\n"
                "## Sample Run #2\n"
                "\n"
                "### Overall Status\n"
                "\n"
                "This run has succeeded. The final score is 1.\n"
                "\n"
                "### Messages\n"
                "\n"
                '[{"messages":[{"role":"user","content":"Book a meeting room for this '
                "meeting.\\nDate: 2025-03-05\\nStart: 10:00\\nLength: 60 minutes\\nAttendees: 5\\nNeeds: "
                "projector\\nWheelchair access: no\\nLook the rooms up with the list_rooms tool, then "
                "reply with only the name of the room to book, or No Room if there is "
                'none."},{"role":"assistant","content":"Cedar"}],"tools":[]}]'
            ),
        },
    ],
    "apply_edit_variant01": [
        {
            "role": "system",
            "content": (
                "Revise the given prompt template using the critique as constraints and improvement "
                "guide.\n"
                "\n"
                "# Revision Rules\n"
                "\n"
                "1. Rewrite or restructure the prompt if critique implies it.\n"
                "2. Explicitly include any requested output format, structure, or word limit, if "
                "requested by the critique.\n"
                "3. Prioritize mechanism-first phrasing: define what to do, then how to do it.\n"
                "4. Preserve placeholder variables inside curly brackets.\n"
                "\n"
                "# Output Format\n"
                "\n"
                "Return only the improved prompt template with placeholders intact. Do not include "
                "other explanations on how you did it, or headers and introductory texts."
            ),
        },
        {
            "role": "user",
            "content": (
                "# Prompt Template\n"
                "\n"
                f"{SEED}\n"
                "\n"
                "# Critique\n"
                "\n"
                "- The room must seat every attendee.\n"
                "- Then prefer the closest room."
            ),
        },
    ],
    "apply_edit_variant02": [
        {
            "role": "system",
            "content": (
                "Revise the prompt to address ONE critique point clearly and effectively. Preserve "
                "all variable names in curly-brackets.\n"
                "\n"
                "Do not address more than one critique point. Focus on the single most critical "
                "issue.\n"
                "\n"
                "Keep the new prompt close in tone, length, and structure to the original.\n"
                "\n"
                "# Output Format\n"
                "\n"
                "Return only the revised full prompt. Do not include explanations, comparisons, or "
                "other text."
            ),
        },
        {
            "role": "user",
            "content": (
                "### PROMPT\n"
                "\n"
                f"{SEED}\n"
                "\n"
                "### CRITIQUE\n"
                "\n"
                "- The room must seat every attendee.\n"
                "- Then prefer the closest room."
            ),
        },
    ],
}

RULES = HARD_RULES + TIE_BREAKS
CRITIQUE = "- The room must seat every attendee.\n- Then prefer the closest room."


def with_rules(*rules: str) -> str:
    return "\n".join([SEED, *(RULE_SENTENCES[rule] for rule in rules)])


def converse(model: RoomsModel, task: dict[str, Any], template: str, system: str | None) -> str | None:
    """The room agent's conversation, in process: the model's final text."""
    system_prompt = None if system is None else PromptTemplate(template=system)
    messages = first_messages(task, PromptTemplate(template=template), system_prompt)
    for _ in range(4):
        reply = model({"messages": messages, "tools": [ROOMS_TOOL]})
        if not reply.tool_calls:
            return reply.text
        calls = [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(reply.tool_calls)
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            result = run_tool(call["function"]["name"], call["function"]["arguments"], task["id"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return None


def graded(tasks: list[dict[str, Any]], template: str, system: str | None = None) -> list[tuple[float, str]]:
    model = RoomsModel()
    return [grade(converse(model, task, template, system), task) for task in tasks]


def accuracy(tasks: list[dict[str, Any]], template: str, system: str | None = None) -> float:
    return sum(reward for reward, _ in graded(tasks, template, system)) / len(tasks)


# -- the model --------------------------------------------------------------------------------------


def test_the_seed_prompts_state_no_rule_and_each_rule_sentence_states_its_own() -> None:
    assert stated_rules(SEED + "\n" + SEED_SYSTEM_PROMPT.template) == ()
    for task in make_tasks():
        assert stated_rules(SEED_PROMPT.format(**_fields(task))) == ()
    for rule, sentence in RULE_SENTENCES.items():
        assert stated_rules(sentence) == (rule,)
    assert stated_rules(with_rules(*RULES)) == RULES


def _fields(task: dict[str, Any]) -> dict[str, str]:
    from examples.rooms.tools import prompt_fields

    return prompt_fields(task)


def test_the_model_scores_by_the_rules_it_is_told() -> None:
    tasks = make_tasks()
    seed = accuracy(tasks, SEED, SEED_SYSTEM_PROMPT.template)
    hard = accuracy(tasks, with_rules(*HARD_RULES))
    assert seed <= 0.25
    assert seed + 0.25 <= hard <= 0.7
    assert accuracy(tasks, with_rules(*RULES), SEED_SYSTEM_PROMPT.template) == 1.0
    # Each tie-break added (in their order) raises the score, to every task right.
    scores = [accuracy(tasks, with_rules(*HARD_RULES, *TIE_BREAKS[:k])) for k in range(len(TIE_BREAKS) + 1)]
    assert scores == sorted(set(scores))
    assert scores[-1] == 1.0


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_matters(rule: str) -> None:
    assert accuracy(make_tasks(), with_rules(*(r for r in RULES if r != rule))) <= 0.95


def test_rules_count_from_the_system_prompt_too_and_the_scores_hold_on_both_splits() -> None:
    train, val = make_splits()
    everything = "\n".join(RULE_SENTENCES.values())
    assert accuracy(train, SEED, everything) == accuracy(val, SEED, everything) == 1.0
    assert accuracy(train, SEED) <= 0.25
    assert accuracy(val, SEED) <= 0.25


def test_the_model_looks_the_rooms_up_first_and_never_reads_rules_off_the_tool_result() -> None:
    model = RoomsModel()
    user = {"role": "user", "content": "Room for 2025-03-05 at 14:30, 30 minutes. Attendees: 5"}
    [call] = model({"messages": [user], "tools": [ROOMS_TOOL]}).tool_calls
    assert (call.name, call.arguments) == ("list_rooms", {"date": "2025-03-05", "time": "14:30"})
    assert "list_rooms" in model({"messages": [user]}).text
    rooms = [
        {"name": "Tiny", "capacity": 2, "equipment": [], "accessible": True, "distance_m": 5, "bookings": []},
        {
            "name": "Large",
            "capacity": 9,
            "equipment": [],
            "accessible": True,
            "distance_m": 9,
            "bookings": [],
        },
    ]
    tool = {
        "role": "tool",
        "tool_call_id": "c",
        "content": json.dumps([{**rooms[0], "note": CRITIQUE}, rooms[1]]),
    }
    assert model({"messages": [user, tool]}).text == "Tiny"
    system = {"role": "system", "content": RULE_SENTENCES["capacity"]}
    assert model({"messages": [system, user, tool]}).text == "Large"
    bad = {"role": "tool", "tool_call_id": "c", "content": "error: no such date"}
    assert "could not be read" in model({"messages": [user, bad]}).text


async def test_the_simulated_model_answers_over_http() -> None:
    async with simulated_rooms_model() as server:
        client = AsyncOpenAI(base_url=server.url, api_key="x")
        task = make_tasks()[0]
        messages = first_messages(task, SEED_PROMPT)
        response = await client.chat.completions.create(
            model="any",
            messages=messages,
            tools=[ROOMS_TOOL],  # type: ignore[arg-type, list-item]
        )
        await client.close()
    assert response.model == "rooms-sim"
    [call] = response.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"date": task["date"], "time": task["time"]}  # type: ignore[union-attr]


# -- the optimiser: fulgor's requests ----------------------------------------------------------------


def fulgor_critic(template: str, rollouts: list[tuple[float | None, str]], other: str = "") -> dict[str, Any]:
    """A critic request as fulgor's prompt optimisation writes one (see ``critic_messages``)."""
    parts = [f'<prompt name="prompt_template">\n{template}\n</prompt>']
    if other:
        parts.append(f'<other_prompt name="system_prompt">\n{other}\n</other_prompt>')
    for i, (reward, feedback) in enumerate(rollouts, 1):
        shown = "none" if reward is None else f"{reward:g}"
        head = f'<rollout index="{i}" reward="{shown}" status="succeeded">'
        parts.append(
            f"{head}\n<feedback>{feedback}</feedback>\n[user] Book a room.\n[assistant] Oak\n</rollout>"
        )
    parts.append("Write a brief critique of the prompt.")
    system = {"role": "system", "content": "You improve the prompts of an AI agent."}
    return {"messages": [system, {"role": "user", "content": "\n\n".join(parts)}]}


def fulgor_editor(template: str, critique: str) -> dict[str, Any]:
    """An editor request as fulgor's prompt optimisation writes one (see ``editor_messages``)."""
    user = (
        f'<prompt name="prompt_template">\n{template}\n</prompt>\n\n<critique>\n{critique}\n</critique>\n\n'
        "Keep exactly these placeholders. Answer with the whole new prompt."
    )
    return {
        "messages": [
            {"role": "system", "content": "You rewrite one prompt."},
            {"role": "user", "content": user},
        ]
    }


def bullets(critique: str) -> list[str]:
    lines = critique.splitlines()
    assert all(line.startswith("- ") for line in lines)
    return [line[2:] for line in lines]


FAILED = [
    (0.0, "expected Birch, got Aspen: Aspen seats 6, fewer than the 8 attendees"),
    (1.0, "correct: Oak"),
]


def test_the_critic_names_one_or_two_missing_rules_and_ignores_the_other_prompts() -> None:
    optimizer = RoomsOptimizer(seed=0)
    critique = optimizer(fulgor_critic(SEED, FAILED)).text
    named = bullets(critique)
    assert 1 <= len(named) <= 2
    assert set(named) <= set(RULE_SENTENCES.values())
    # The system prompt states capacity, the prompt under critique does not: only it is missing.
    all_but_capacity = with_rules(*RULES[1:])
    request = fulgor_critic(all_but_capacity, FAILED, other=RULE_SENTENCES["capacity"])
    assert optimizer(request).text == f"- {RULE_SENTENCES['capacity']}"
    assert (optimizer.critic_calls, optimizer.editor_calls) == (2, 0)


def test_the_critic_sees_no_change_to_make_without_a_failure_or_a_missing_rule() -> None:
    optimizer = RoomsOptimizer()
    assert (
        optimizer(fulgor_critic(SEED, [(1.0, "correct: Oak"), (1.0, "correct: Elm")])).text
        == "- No change needed."
    )
    assert optimizer(fulgor_critic(with_rules(*RULES), FAILED)).text == "- No change needed."
    assert optimizer(fulgor_critic(SEED, [])).text == "- No change needed."
    assert optimizer(fulgor_critic(SEED, [(0.5, "half")])).text != "- No change needed."
    assert optimizer(fulgor_critic(SEED, [(1e-05, "almost nothing")])).text != "- No change needed."
    assert optimizer(fulgor_critic(SEED, [(None, "the rollout failed")])).text != "- No change needed."


def test_the_optimizer_reads_the_requests_fulgors_prompt_optimisation_sends() -> None:
    from fulgor.algorithms.apo.messages import RolloutView, critic_messages, editor_messages

    prompts = {"prompt_template": SEED_PROMPT, "system_prompt": SEED_SYSTEM_PROMPT}
    views = [
        RolloutView("succeeded", 0.0, FAILED[0][1], ["[user] Book a room.", "[assistant] Aspen"]),
        RolloutView("failed", None, None, ["[user] Book a room."]),
    ]
    optimizer = RoomsOptimizer()
    critique = optimizer({"messages": critic_messages("prompt_template", prompts, views)}).text
    assert 1 <= len(bullets(critique)) <= 2
    assert set(bullets(critique)) <= set(RULE_SENTENCES.values())
    edited = optimizer({"messages": editor_messages("prompt_template", SEED_PROMPT, critique)}).text
    assert edited == "\n".join([SEED, *bullets(critique)])
    assert (optimizer.critic_calls, optimizer.editor_calls) == (1, 1)


def test_critiques_are_the_same_for_one_request_and_vary_with_the_rollouts_and_the_seed() -> None:
    requests = [fulgor_critic(SEED, [(0.0, f"expected Oak, got Elm ({i})")]) for i in range(12)]
    first = [RoomsOptimizer(seed=0)(r).text for r in requests]
    assert [RoomsOptimizer(seed=0)(r).text for r in requests] == first
    assert len(set(first)) >= 4
    assert [RoomsOptimizer(seed=1)(r).text for r in requests] != first


def test_the_editor_appends_the_rule_sentences_of_the_critique_and_keeps_the_placeholders() -> None:
    optimizer = RoomsOptimizer()
    edited = optimizer(fulgor_editor(SEED, CRITIQUE + "\n- Be more concise.")).text
    assert edited == SEED + "\nThe room must seat every attendee.\nThen prefer the closest room."
    assert PromptTemplate(template=edited).placeholders == SEED_PROMPT.placeholders
    assert optimizer(fulgor_editor(edited, CRITIQUE)).text == edited  # nothing twice
    assert optimizer(fulgor_editor(SEED, "- Be more concise.")).text == SEED
    assert (optimizer.critic_calls, optimizer.editor_calls) == (0, 3)
    assert "no prompt" in optimizer({"messages": [{"role": "user", "content": "hello"}]}).text


def test_critic_and_editor_take_the_seed_prompt_to_every_rule() -> None:
    train, val = make_splits()
    optimizer, template = RoomsOptimizer(seed=0), SEED
    for step in range(30):
        results = graded(train, template)
        if all(reward == 1.0 for reward, _ in results):
            break
        shown = [results[(4 * step + k) % len(results)] for k in range(4)]
        critique = optimizer(fulgor_critic(template, shown)).text
        template = optimizer(fulgor_editor(template, critique)).text
    assert accuracy(val, template) == 1.0
    assert stated_rules(template) == RULES
    assert PromptTemplate(template=template).placeholders == SEED_PROMPT.placeholders
    assert optimizer.editor_calls <= 12


# -- the optimiser: Agent Lightning 0.3.0's requests -------------------------------------------------

CRITICS = ["text_gradient_variant01", "text_gradient_variant02", "text_gradient_variant03"]
EDITORS = ["apply_edit_variant01", "apply_edit_variant02"]


def agl(name: str, old: str = "", new: str = "") -> dict[str, Any]:
    messages = [dict(m, content=m["content"].replace(old, new)) if old else m for m in AGL_MESSAGES[name]]
    return {"messages": messages}


@pytest.mark.parametrize("name", CRITICS)
def test_the_critic_reads_agent_lightnings_requests(name: str) -> None:
    request = read_request(AGL_MESSAGES[name][-1]["content"])
    assert request is not None
    assert (request.format, request.template, request.failed) == (f"agl {name} critic", SEED, True)
    optimizer = RoomsOptimizer()
    named = bullets(optimizer(agl(name)).text)
    assert 1 <= len(named) <= 2
    assert set(named) <= set(RULE_SENTENCES.values())
    assert optimizer.critic_calls == 1
    # Every rule stated: nothing to add, whatever the rewards.
    assert optimizer(agl(name, SEED, with_rules(*RULES))).text == "- No change needed."


@pytest.mark.parametrize(
    ("name", "failed", "passed"),
    [
        ("text_gradient_variant01", "final reward: 0\n", "final reward: 1\n"),
        (
            "text_gradient_variant02",
            '"agentlightning.reward.0.value":0}',
            '"agentlightning.reward.0.value":1}',
        ),
        ("text_gradient_variant03", "final score is 0.", "final score is 1."),
    ],
)
def test_the_critic_reads_the_rewards_of_agent_lightnings_runs(name: str, failed: str, passed: str) -> None:
    optimizer = RoomsOptimizer()
    assert failed in AGL_MESSAGES[name][-1]["content"]
    assert optimizer(agl(name, failed, passed)).text == "- No change needed."
    # A run without a reward (a failed rollout) counts as a failure.
    missing = failed.replace("0", "")
    assert optimizer(agl(name, failed, missing)).text != "- No change needed."


@pytest.mark.parametrize("name", EDITORS)
def test_the_editor_reads_agent_lightnings_requests(name: str) -> None:
    request = read_request(AGL_MESSAGES[name][-1]["content"])
    assert request is not None
    assert (request.format, request.template, request.critique) == (f"agl {name} editor", SEED, CRITIQUE)
    optimizer = RoomsOptimizer()
    edited = optimizer(agl(name)).text
    assert edited == SEED + "\nThe room must seat every attendee.\nThen prefer the closest room."
    assert PromptTemplate(template=edited).placeholders == SEED_PROMPT.placeholders
    assert optimizer.editor_calls == 1


async def test_the_simulated_optimizer_answers_over_http() -> None:
    async with simulated_optimizer(seed=3) as server:
        client = AsyncOpenAI(base_url=server.url, api_key="x")
        critique = await client.chat.completions.create(
            model="gpt-4.1",
            messages=AGL_MESSAGES["text_gradient_variant03"],  # type: ignore[arg-type]
        )
        edit = await client.chat.completions.create(
            model="gpt-4.1",
            messages=AGL_MESSAGES["apply_edit_variant01"],  # type: ignore[arg-type]
        )
        await client.close()
    assert critique.model == "optimizer-sim"
    assert critique.choices[0].message.content == RoomsOptimizer(seed=3)(agl("text_gradient_variant03")).text
    assert (edit.choices[0].message.content or "").startswith(SEED + "\n")
    assert isinstance(server.responder, RoomsOptimizer)
    assert (server.responder.critic_calls, server.responder.editor_calls) == (1, 1)
