"""``fulgor train --algorithm apo``: a prompt search from the command line, on an upstream model.

The agent and the simulations are tests/integration/sample_agents/prompt_agent.py's (a model that follows
the rules its prompt states, a critic and an editor that add them), served on loopback here; the
command runs as a user runs it, in a process of its own, without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sample_agents.prompt_agent import RULES, SEED, model_reply, optimizer_reply

from fulgor.cli.main import main
from fulgor.testing import ScriptedOpenAIServer

ROOT = Path(__file__).resolve().parents[2]

AGENT = "sample_agents.prompt_agent:prompted"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"q": i}) + "\n" for i in range(6)))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps({"q": 10 + i}) + "\n" for i in range(4)))
    (tmp_path / "prompt.txt").write_text(SEED + "\n")
    return tmp_path


def fulgor(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; sys.modules['torch'] = None\nfrom fulgor.cli.main import main\n"
    code += "sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tests' / 'integration'}:{ROOT}"}
    return subprocess.run(
        [sys.executable, "-c", code, "train", "--agent", AGENT, *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_apo_on_an_upstream_prints_the_best_prompt_then_evaluates_with_it(folder: Path) -> None:
    with (
        ScriptedOpenAIServer(responder=model_reply, supports_token_ids=False) as model,
        ScriptedOpenAIServer(responder=optimizer_reply) as optimizer,
    ):
        upstream = ["--upstream", model.url, "--no-token-ids", "--prompt", "prompt_template=prompt.txt"]
        trained = fulgor(
            folder, *upstream, "--algorithm", "apo", "--train", "train.jsonl", "--val", "val.jsonl",
            "--optimizer-url", optimizer.url, "--optimizer-model", "scripted-model", "--steps", "3",
            "--beam-width", "2", "--branch-factor", "2", "--val-batch-size", "4", "--n-runners", "1",
            "--run-dir", "run",
        )  # fmt: skip
        assert trained.returncode == 0, trained.stderr
        measured = fulgor(
            folder, *upstream, "--algorithm", "apo", "--val", "val.jsonl", "--evaluate", "--run-dir", "run"
        )
    assert "best prompts (candidate c" in trained.stdout
    assert "validation score 1.000" in trained.stdout
    best = folder / "run" / "apo" / "best" / "prompt_template.txt"
    assert f"--- prompt_template: {best.relative_to(folder)}" in trained.stdout
    assert all(rule in best.read_text() for rule in RULES)
    assert best.read_text() in trained.stdout
    assert "prompt search history" in trained.stdout
    assert "<h2>Prompt search</h2>" in (folder / "run" / "report.html").read_text()
    assert measured.returncode == 0, measured.stderr
    assert json.loads(measured.stdout.splitlines()[0])["val_accuracy"] == 1.0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--val", "val.jsonl"], "optimises the prompts of --prompt NAME=FILE"),
        (["--val", "val.jsonl", "--prompt", "p=prompt.txt", "--prompt", "p=prompt.txt"],
         "names a prompt twice"),
        (["--val", "val.jsonl", "--prompt", "p=prompt.txt"], "needs its critic and editor: --optimizer-url"),
        (["--prompt", "p=prompt.txt", "--optimizer-url", "http://127.0.0.1:9/v1", "--optimizer-model", "m"],
         "scores its candidate prompts on --val FILE"),
        (["--val", "val.jsonl", "--prompt", "p=missing.txt", "--optimizer-url", "http://127.0.0.1:9/v1",
          "--optimizer-model", "m"], "--prompt p=missing.txt: cannot read it"),
    ],
)  # fmt: skip
def test_bad_apo_input_is_one_clear_error_before_anything_starts(
    folder: Path,
    args: list[str],
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(folder)
    argv = ["train", "--agent", AGENT, "--algorithm", "apo", "--train", "train.jsonl", "--run-dir", "run"]
    assert main([*argv, "--upstream", "http://127.0.0.1:9/v1", *args]) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert says in error
    assert not (folder / "run").exists()


def test_a_prompt_entry_must_be_name_equals_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--agent", AGENT, "--algorithm", "apo", "--prompt", "prompt.txt"])
    assert "is not NAME=FILE" in capsys.readouterr().err


def test_a_prompt_file_ending_in_j2_or_jinja_is_a_jinja_template(tmp_path: Path) -> None:
    from fulgor.cli._apo import _read_prompts

    (tmp_path / "a.j2").write_text("Solve {{ q }}.\n")
    (tmp_path / "b.jinja").write_text("Then {{ q }}.")
    (tmp_path / "c.txt").write_text("Answer {q}.")
    prompts = _read_prompts(
        [("a", tmp_path / "a.j2"), ("b", tmp_path / "b.jinja"), ("c", tmp_path / "c.txt")]
    )
    assert [(p.engine, p.template) for p in prompts.values()] == [
        ("jinja", "Solve {{ q }}."),
        ("jinja", "Then {{ q }}."),
        ("f-string", "Answer {q}."),
    ]
