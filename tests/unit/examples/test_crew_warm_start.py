"""The crew's warm start: a model built on its corpus learns a few steps of its conversations, each
rendered faithfully for the engine (else the warm start refuses to run), and is saved whole."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from examples.calc.dataset import make_splits
from examples.crew.warm_start import WarmStartConfig, corpus, solver_conversation, warm_start
from fulgor.engine.models import init_model


def test_a_short_warm_start_saves_a_model_that_knows_the_crews_words(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tasks = make_splits(seed=0, sizes=(16, 0, 0))["train"]
    base = init_model(tmp_path / "base", "tiny", seed=0, corpus=corpus(tasks))
    out = warm_start(base, tmp_path / "warm", tasks, WarmStartConfig(tool_steps=2, steps=3, batch_size=4))
    assert (out / "config.json").is_file()
    assert not (tmp_path / ".warm.partial").exists()
    # The tokenizer fitted to the corpus keeps CrewAI's frame short: the solver's opening messages
    # (without the tool's definition) take about 80 tokens, where their text is over 250 characters.
    tokenizer = AutoTokenizer.from_pretrained(out)
    opening = solver_conversation(tasks[0], use_tool=False)[:2]
    ids = tokenizer.apply_chat_template(opening, tokenize=True, return_dict=True)["input_ids"]
    assert sum(len(m["content"]) for m in opening) > 250
    assert len(ids) < 100
