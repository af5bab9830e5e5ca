"""APO end to end: the Trainer drives the search through the real store, gateway and runners.

The agent's model and the optimiser are simulations on loopback (tests/integration/sample_agents/
prompt_agent.py): the model follows the rules its prompt states, the critic names a missing rule,
the editor adds it. Every path of the search runs for real: beam and Pareto steps, rejected edits,
an optimiser that errors or times out, budgets, resume, the files of the run and the CLI.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sample_agents.prompt_agent import RULES, SEED, model_reply, optimizer_reply, prompted, unprompted

from fulgor import APO, LLM, PromptTemplate, Trainer
from fulgor.adapters import model_calls
from fulgor.errors import ConfigError
from fulgor.store import SqliteStore
from fulgor.testing import ScriptedOpenAIServer, ScriptedReply

TRAIN = [{"q": i} for i in range(8)]
VAL = [{"q": 100 + i} for i in range(6)]


@pytest.fixture
def model() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(responder=model_reply, supports_token_ids=False, model="agent-sim") as server:
        yield server


@pytest.fixture
def optimizer() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(responder=optimizer_reply, model="optimizer-sim") as server:
        yield server


def apo(optimizer: ScriptedOpenAIServer, **settings: Any) -> APO:
    defaults: dict[str, Any] = {"beam_width": 2, "branch_factor": 2, "val_batch_size": 4}
    return APO(
        prompts={"prompt_template": SEED},
        optimizer=LLM(endpoint=optimizer.url, model="optimizer-sim"),
        **{**defaults, **settings},
    )


def trainer(algorithm: APO, model: ScriptedOpenAIServer, run_dir: Path) -> Trainer:
    return Trainer(algorithm=algorithm, upstream=model.url, run_dir=run_dir, n_runners=1, progress=False)


def read(run_dir: Path, name: str) -> Any:
    return json.loads((run_dir / "apo" / name).read_text())


async def stored(run_dir: Path) -> tuple[list[Any], dict[str, Any]]:
    """Every rollout of the run's store with its spans, and its resources by id."""
    store = SqliteStore(run_dir / "store.sqlite")
    try:
        rollouts = await store.query_rollouts()
        spans = {r.rollout_id: await store.query_spans(r.rollout_id) for r in rollouts}
        resources = {r.resources_id: await store.get_resources(r.resources_id) for r in rollouts}
    finally:
        await store.close()
    return [(r, spans[r.rollout_id]) for r in rollouts], resources


@pytest.mark.parametrize("search", ["beam", "pareto"])
def test_the_search_finds_the_rules_and_keeps_its_history(
    search: str, model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    algorithm = apo(optimizer, search=search)
    history = trainer(algorithm, model, tmp_path).fit(prompted, TRAIN, VAL)

    assert [m["step"] for m in history] == [1, 2, 3]
    assert [m["best_score"] for m in history] == pytest.approx([1 / 3, 2 / 3, 1.0])
    best = algorithm.resources(tmp_path)["prompt_template"]
    assert isinstance(best, PromptTemplate)
    assert all(rule in best.template for rule in RULES)
    assert best.placeholders == {"q"}
    assert (tmp_path / "apo" / "best" / "prompt_template.txt").read_text() == best.template
    summary = read(tmp_path, "best.json")
    assert summary["score"] == 1.0
    candidates = {c["id"]: c for c in read(tmp_path, "candidates.json")}
    assert candidates["seed"]["val_score"] == 0.0
    child = candidates[summary["id"]]
    assert child["parent"] in candidates
    assert child["edited"] == "prompt_template"
    assert "State this rule" in child["critique"]
    # The same edit made twice is one candidate: the second is rejected before it runs.
    twins = [c for c in candidates.values() if (c["reason"] or "").startswith("its prompts are those of")]
    assert twins
    assert all(not c["val_scores"] for c in twins)
    if search == "pareto":
        kept = [c for c in candidates.values() if c["status"] != "rejected" and c["id"] != "seed"]
        assert all(c["minibatch"]["child"] > c["minibatch"]["parent"] for c in kept)
    assert history[-1]["rollouts_total"] == sum(m["rollouts"] for m in history) + len(VAL)


def test_every_rollout_records_its_prompt_and_the_optimiser_calls_are_recorded(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    algorithm = apo(optimizer, max_steps=1)
    trainer(algorithm, model, tmp_path).fit(prompted, TRAIN, VAL)
    rollouts, resources = asyncio.run(stored(tmp_path))
    templates = {c["prompts"]["prompt_template"]["template"] for c in read(tmp_path, "candidates.json")}

    agent = [(r, s) for r, s in rollouts if "apo" not in r.metadata]
    calls = [(r, s) for r, s in rollouts if "apo" in r.metadata]
    assert agent
    for rollout, spans in agent:
        prompt = resources[rollout.resources_id].resources["prompt_template"].template
        assert prompt in templates
        ((_, call),) = model_calls(spans)
        assert call.request["messages"][0]["content"] == prompt.format(q=rollout.input["q"])
    assert {r.metadata["apo"] for r, _ in calls} == {"critic", "editor"}
    assert len(calls) == 2 * 2 * 2 == len(optimizer.requests)  # beam 2 x branches 2 x (critic, editor)
    for rollout, spans in calls:
        ((_, call),) = model_calls(spans)
        assert rollout.status == "succeeded"
        assert call.request["model"] == "optimizer-sim"
        assert call.response["message"]["content"]
    critic = next(s for r, s in calls if r.metadata["apo"] == "critic")
    ((_, call),) = model_calls(critic)
    sent = call.request["messages"][-1]["content"]
    assert f'<prompt name="prompt_template">\n{SEED}\n</prompt>' in sent
    assert "<feedback>the answer followed 0 of 3 rules</feedback>" in sent
    assert "[user] Answer question" in sent
    assert "[assistant] ." in sent


def test_edits_that_break_the_template_are_rejected_with_their_reason(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    critique = ScriptedReply(text="- State this rule: Be brief.")
    optimizer.script(
        critique, ScriptedReply(text="Answer the question. Be brief."),  # drops {q}
        critique, ScriptedReply(text="Answer {q} for {user}. Be brief."),  # adds {user}
        critique, ScriptedReply(text="Answer {q. Be brief."),  # not a template
        critique, ScriptedReply(text=SEED),  # unchanged
    )  # fmt: skip
    algorithm = apo(optimizer, max_steps=4, beam_width=1, branch_factor=1)  # one proposal a step
    history = trainer(algorithm, model, tmp_path).fit(prompted, TRAIN, VAL)

    reasons = sorted(c["reason"] for c in read(tmp_path, "candidates.json") if c["status"] == "rejected")
    assert reasons == [
        "it adds {user}, which the agent does not fill; keep every placeholder",
        "it drops the placeholder {q}, which the agent fills; keep every placeholder",
        "it is not a valid f-string template (expected '}' before end of string)",
        "the editor returned the prompt unchanged",
    ]
    assert [m["candidates_rejected"] for m in history] == [1, 1, 1, 1]
    assert algorithm.resources(tmp_path)["prompt_template"] == PromptTemplate(template=SEED)


def test_an_optimiser_that_errors_or_times_out_ends_the_step_with_what_it_has(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    optimizer.fail_next(3, status=503)  # the first call's every try
    algorithm = apo(optimizer, max_steps=2, optimizer_retries=2, beam_width=1, branch_factor=1)
    history = trainer(algorithm, model, tmp_path).fit(prompted, TRAIN, VAL)

    assert history[0]["optimizer_failures"] == 1
    assert history[0]["proposals_failed"] == 1
    assert history[0]["candidates"] == 0
    assert history[1]["candidates"] == 1  # the next step tries again, and the endpoint is back
    assert history[1]["best_score"] == pytest.approx(1 / 3)
    rollouts, _ = asyncio.run(stored(tmp_path))
    failed = [r for r, _ in rollouts if r.metadata.get("apo") == "critic" and r.status == "failed"]
    assert [r.metadata["try"] for r in failed] == [1, 2, 3]
    assert history[-1]["optimizer_calls_total"] == 3 + 2


def test_a_slow_optimiser_is_given_up_on_after_its_timeout(
    model: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    with ScriptedOpenAIServer(responder=optimizer_reply, delay_seconds=5.0) as slow:
        algorithm = apo(
            slow,
            max_steps=1,
            beam_width=1,
            branch_factor=1,
            optimizer_timeout_seconds=0.5,
            optimizer_retries=1,
        )
        history = trainer(algorithm, model, tmp_path).fit(prompted, TRAIN, VAL)
    assert history[0]["optimizer_failures"] == 1
    rollouts, _ = asyncio.run(stored(tmp_path))
    errors = [r for r, _ in rollouts if r.metadata.get("apo") == "critic"]
    assert [r.status for r in errors] == ["failed", "failed"]


def test_a_budget_ends_the_search(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    algorithm = apo(optimizer, search="pareto", max_steps=10, max_optimizer_calls=6)
    history = trainer(algorithm, model, tmp_path).fit(prompted, TRAIN, VAL)
    assert len(history) == 1  # 4 proposals of 2 calls do not fit in 6: three run, then it stops
    assert history[0]["optimizer_calls_total"] == 6
    assert history[0]["proposals_skipped"] == 1


def test_a_resumed_search_continues_after_its_last_step(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    first = trainer(apo(optimizer, max_steps=1), model, tmp_path).fit(prompted, TRAIN, VAL)
    seen = {c["id"] for c in read(tmp_path, "candidates.json")}
    second = apo(optimizer, max_steps=2)
    history = trainer(second, model, tmp_path).fit(prompted, TRAIN, VAL)

    assert [m["step"] for m in history] == [2]
    assert history[0]["best_score"] == pytest.approx(2 / 3)
    assert seen < {c["id"] for c in read(tmp_path, "candidates.json")}
    # Nothing is measured twice: the seed's scores and the first step's come from state.json.
    assert history[0]["rollouts_total"] == first[0]["rollouts_total"] + history[0]["rollouts"]
    again = trainer(apo(optimizer, max_steps=2), model, tmp_path).fit(prompted, TRAIN, VAL)
    assert again == []


def test_evaluate_runs_with_the_best_prompts_of_the_run(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    trainer(apo(optimizer), model, tmp_path).fit(prompted, TRAIN, VAL)
    fresh = APO(prompts={"prompt_template": SEED})  # no optimiser: it only runs the agent
    assert trainer(fresh, model, tmp_path).evaluate(prompted, VAL)["val_accuracy"] == 1.0
    assert trainer(fresh, model, tmp_path / "other").evaluate(prompted, VAL)["val_accuracy"] == 0.0


def test_bad_setups_are_refused_before_anything_runs(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="takes no parameter named 'prompt_template'"):
        trainer(apo(optimizer), model, tmp_path).fit(unprompted, TRAIN, VAL)
    with pytest.raises(ConfigError, match="pass val_dataset"):
        trainer(apo(optimizer), model, tmp_path).fit(prompted, TRAIN)
    assert not (tmp_path / "store.sqlite").exists()
    with pytest.raises(ConfigError, match="needs a model for its critic"):
        trainer(APO(prompts={"prompt_template": SEED}), model, tmp_path).fit(prompted, TRAIN, VAL)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_report_shows_each_steps_candidates_and_diffs(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from fulgor.training.run_report import write_run_report

    trainer(apo(optimizer), model, tmp_path).fit(prompted, TRAIN, VAL)
    page = write_run_report(tmp_path).read_text()
    assert "<h2>Prompt search</h2>" in page
    assert "<h3>Step 3</h3>" in page
    assert "<del>- Answer question {q}.</del>" in page
    assert "<ins>+ Answer question {q}. Be brief.</ins>" in page
    assert "rejected: its prompts are those of" in page


def test_the_search_runs_on_the_local_engine_and_records_its_token_ids(
    optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.models import init_model

    model_dir = init_model(tmp_path / "tiny", "tiny", seed=0)
    engine = EngineConfig(model=model_dir, device="cpu", max_model_len=256, seed=0)
    algorithm = apo(optimizer, max_steps=1, beam_width=1, branch_factor=1, gradient_batch_size=2)
    run = Trainer(algorithm=algorithm, engine=engine, run_dir=tmp_path / "run", n_runners=1, progress=False)
    history = run.fit(prompted, TRAIN[:2], VAL[:2])

    assert history[0]["candidates"] == 1
    assert not (tmp_path / "run" / "checkpoints").exists()  # prompts change, weights do not
    rollouts, _ = asyncio.run(stored(tmp_path / "run"))
    agent_calls = [call for r, spans in rollouts if "apo" not in r.metadata for _, call in model_calls(spans)]
    assert len(agent_calls) == 2 + 2 + 2  # seed on validation, parent on its minibatch, child on validation
    assert all(call.response_token_ids and not call.token_ids_missing for call in agent_calls)


def test_the_critic_and_the_editor_may_be_models_apart(model: ScriptedOpenAIServer, tmp_path: Path) -> None:
    with (
        ScriptedOpenAIServer(responder=optimizer_reply, model="critic-sim") as critic,
        ScriptedOpenAIServer(responder=optimizer_reply, model="editor-sim") as editor,
    ):
        algorithm = APO(
            prompts={"prompt_template": SEED},
            critic=LLM(endpoint=critic.url, model="critic-sim"),
            editor=LLM(endpoint=editor.url, model="editor-sim", api_key="sk-editor"),
            max_steps=1, beam_width=1, branch_factor=1,
        )  # fmt: skip
        history = trainer(algorithm, model, tmp_path).fit(prompted, TRAIN, VAL)
    assert history[0]["best_score"] == pytest.approx(1 / 3)
    assert [r["model"] for r in critic.requests] == ["critic-sim"]
    assert [r["model"] for r in editor.requests] == ["editor-sim"]
    assert "<critique>" in editor.requests[0]["messages"][-1]["content"]
    assert editor.request_headers[0]["authorization"] == "Bearer sk-editor"  # its key, not the run's
    assert "authorization" not in critic.request_headers[0]


def test_the_same_seed_gives_the_same_search(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    runs = []
    for run in ("first", "second"):
        trainer(apo(optimizer, search="pareto", max_steps=2), model, tmp_path / run).fit(prompted, TRAIN, VAL)
        candidates = read(tmp_path / run, "candidates.json")
        runs.append([(c["id"], c["parent"], c["status"], c["reason"], c["prompts"]) for c in candidates])
    assert runs[0] == runs[1]
    assert len(runs[0]) > 4


def test_pareto_starts_a_proposal_only_when_scoring_its_child_fits_and_stops_at_the_target(
    model: ScriptedOpenAIServer, optimizer: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    # The seed's validation (6) leaves 20: one proposal (2 x 4 on its minibatch + 6 to score its
    # child) fits, a second does not.
    algorithm = apo(optimizer, search="pareto", max_steps=10, max_rollouts=6 + 20)
    history = trainer(algorithm, model, tmp_path / "budget").fit(prompted, TRAIN, VAL)
    assert len(history) == 1
    assert history[0]["proposals_skipped"] == 3
    assert history[0]["rollouts_total"] == 6 + 8 + 6
    assert all(len(c["val_scores"]) in (0, len(VAL)) for c in read(tmp_path / "budget", "candidates.json"))

    reached = apo(optimizer, search="pareto", max_steps=10, target_score=0.6)
    history = trainer(reached, model, tmp_path / "target").fit(prompted, TRAIN, VAL)
    assert [m["best_score"] for m in history] == pytest.approx([1 / 3, 2 / 3])
