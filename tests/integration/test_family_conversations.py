"""Each model family's own format through the whole system: a small model on the family's real
tokenizer and template is taught (fulgor's SFT update) to call the calculator in that family's
format and then answer; the unchanged openai-SDK calc agent then runs it through the gateway and
fulgor's engine (``Trainer.dev``). Every call must be parsed from the family's format, recorded
with the engine's ids, and merged into one token row: the merge breaks the trajectory adapter
counts are the table in the README."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("openai")

from tests.real_models import SMOLLM2_GGUF, fetched, tokenizer_dir

from examples.calc.agent import calc_agent
from examples.calc.calculator import CALCULATOR_TOOL, SYSTEM_PROMPT
from fulgor import GRPO, Trainer
from fulgor.adapters.trajectory import TrajectoryRow
from fulgor.algorithms.sft.update import SFTConfig, SFTUpdater
from fulgor.engine.chat_format import ChatFormat, read_chat_template, write_tool_calls
from fulgor.engine.local import EngineConfig
from fulgor.engine.models import init_model
from fulgor.weights.loading import load_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TASK = {"question": "What is 2 + 3?", "answer": 5}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}},
}
# family: (template served, None for the tokenizer's own; parser expected; thinking before the call)
FAMILIES = {
    "smollm2": ("chatml-tools", "hermes", None),
    "llama3_1": ("llama3-json-tools", "llama3_json", None),
    "qwen3": (None, "hermes", None),
    "qwen3-thinking": (None, "hermes", "Add them."),
    "gemma3": ("gemma3-pythonic-tools", "pythonic", None),
}


def family_tokenizer(family: str, folder: Path) -> Path:
    if not family.startswith("smollm2"):
        return tokenizer_dir(family.split("-")[0])
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    gguf = fetched(SMOLLM2_GGUF)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


def taught_model(family: str, root: Path) -> Path:
    """A tiny model on the family's tokenizer and template that answers the task's two turns as the
    family would: a calculator call in its format, then the answer."""
    template, _, thinking = FAMILIES[family]
    model_dir = init_model(
        root / "model", "tiny", seed=0, tokenizer=family_tokenizer(family, root / "tokenizer")
    )
    loaded = load_model(model_dir, device="cpu")
    tokenizer, model = loaded.tokenizer, loaded.model
    if template is not None:
        tokenizer.chat_template = read_chat_template(template)
        tokenizer.save_pretrained(model_dir)
    chat_format = ChatFormat.own(tokenizer)
    question = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": TASK["question"]}]
    call_turn: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    call = write_tool_calls(chat_format.tool_parser, [CALL])
    if thinking:
        call_turn["reasoning_content"] = thinking
        call = f"<think>\n{thinking}\n</think>\n\n{call}"
    after_tool = [*question, call_turn, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    rows = []
    for prompt, answer in ((question, call), (after_tool, "Answer: 5")):
        prompt_ids = tokenizer.encode(
            chat_format.render(tokenizer, prompt, [CALCULATOR_TOOL]), add_special_tokens=False
        )
        answer_ids = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
        ids = prompt_ids + answer_ids
        rows.append(TrajectoryRow(ids, [0] * len(prompt_ids) + [1] * len(answer_ids), [0.0] * len(ids)))
    model.train()
    updater = SFTUpdater(model, SFTConfig(learning_rate=1e-2))
    for _ in range(400):
        if updater.step_rows(rows)["loss"] < 0.002:
            break
    model.save_pretrained(model_dir)
    return model_dir


@pytest.mark.slow(minutes=2)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_familys_tool_calls_go_through_the_gateway_into_one_token_row(family: str, tmp_path: Path) -> None:
    model_dir = taught_model(family, tmp_path)
    engine = EngineConfig(model=model_dir, device="cpu", max_model_len=1024, seed=0)
    trainer = Trainer(
        algorithm=GRPO(group_size=2, temperature=0.0, max_tokens=96),
        engine=engine,
        run_dir=tmp_path / "run",
        n_runners=1,
        torch_threads=1,
    )
    report = trainer.dev(calc_agent, [TASK])
    [rollout] = report.rollouts
    # The call parsed from the family's format, the calculator answered, the model answered right.
    assert (rollout.status, rollout.reward, rollout.model_calls) == ("succeeded", 1.0, 2), str(report)
    drift = rollout.drift
    assert (drift["calls_total"], drift["calls_trained"]) == (2, 2), drift
    assert drift["merge_breaks"] == 0, drift  # both calls in one row
    assert drift["id_mismatches"] == 0, drift
