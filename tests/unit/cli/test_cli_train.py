"""``fulgor train`` and ``fulgor demo``: what they refuse before anything starts, and real runs of an
agent module written into a folder of its own, on a tiny model built here."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.process_support import running_in, take_sigint

from fulgor.cli.main import main
from fulgor.errors import ConfigError
from fulgor.store import SqliteStore
from fulgor.training.run_report import read_metrics
from fulgor.types import Rollout

ROOT = Path(__file__).resolve().parents[3]
# The installed script, as users run it: it imports the agent from the current directory.
FULGOR = Path(sys.executable).with_name("fulgor")

AGENT = '''
import asyncio

from openai import AsyncOpenAI

from fulgor import LLM, rollout


@rollout
async def solve(task, llm: LLM) -> float:
    """One chat call; the reward is whether the reply holds the task's letter."""
    if task.get("fail"):
        raise RuntimeError("this task fails on purpose")
    if task.get("hang"):  # says it started, then runs until stopped
        open(task["hang"], "w").close()
        await asyncio.sleep(600)
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=3)
    try:
        reply = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            **llm.sampling_parameters,
        )
    finally:
        await client.close()
    return 1.0 if task["letter"] in (reply.choices[0].message.content or "") else 0.0


not_an_agent = 3
'''
TASKS = [
    {"prompt": "Say a word.", "letter": "e"},
    {"prompt": "Name a colour.", "letter": "a"},
    {"prompt": "Count to three.", "letter": "o"},
]


def write_tasks(path: Path, tasks: list[object]) -> Path:
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder: an agent module, task files, a model directory (only its config.json: nothing
    loads it before the inputs are refused). The command runs from it."""
    module = f"agent_{tmp_path.name.replace('-', '_')}"  # a module name no other test imports
    (tmp_path / f"{module}.py").write_text(AGENT)
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "fine"}\n\n{"prompt": oops}\n')
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    (tmp_path / "latin1.jsonl").write_bytes(b'"caf\xe9"\n')
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "no-config").mkdir()
    checkpoint = tmp_path / "old-run" / "checkpoints" / "step-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    adapter = tmp_path / "lora-run" / "checkpoints" / "step-2"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (tmp_path / "module.txt").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the agent's folder is added to it
    return tmp_path


# (arguments after `fulgor train`, text the one error line must hold); {agent} is the folder's module.
REFUSED = {
    "train file missing": (["--train", "none.jsonl"], "--train none.jsonl does not exist"),
    "train file a folder": (["--train", "model"], "--train model is a directory"),
    "malformed line": (["--train", "bad.jsonl"], "--train bad.jsonl, line 3: not JSON"),
    "no tasks": (["--train", "blank.jsonl"], "--train blank.jsonl holds no tasks"),
    "not UTF-8": (["--train", "latin1.jsonl"], "is not UTF-8"),
    "bad val file": (["--train", "tasks.jsonl", "--val", "bad.jsonl"], "--val bad.jsonl, line 3"),
    "no train file": ([], "pass --train"),
    "dev without train file": (
        ["--dev", "--val", "tasks.jsonl"],
        "--dev runs the agent on the tasks of --train",
    ),
    "evaluate without val file": (["--evaluate", "--train", "tasks.jsonl"], "pass --val"),
    "model folder missing": (
        ["--train", "tasks.jsonl", "--model", "nowhere"],
        "--model nowhere is not a directory",
    ),
    "model without config.json": (
        ["--train", "tasks.jsonl", "--model", "no-config"],
        "--model no-config has no config.json",
    ),
    "group of one": (["--train", "tasks.jsonl", "--group-size", "1"], "--group-size must be 2 or more"),
    "negative checkpoint count": (
        ["--train", "tasks.jsonl", "--keep-checkpoints", "-1"],
        "--keep-checkpoints -1 is negative; pass 0 to keep every checkpoint",
    ),
    "checkpoints and --no-resume": (
        ["--train", "tasks.jsonl", "--run-dir", "old-run", "--no-resume"],
        "old-run already holds checkpoints up to step 3",
    ),
    "LoRA checkpoints, all weights asked": (
        ["--train", "tasks.jsonl", "--run-dir", "lora-run"],
        "lora-run trained a LoRA adapter (checkpoints up to step 2) and this command trains all weights; "
        "pick a new --run-dir, or continue it as it trained (with --lora-rank R)",
    ),
    "full checkpoints, LoRA asked": (
        ["--train", "tasks.jsonl", "--run-dir", "old-run", "--lora-rank", "4"],
        "old-run trained all weights (checkpoints up to step 3) and this command trains a LoRA adapter",
    ),
    "LoRA adapter as the model, no rank": (
        ["--train", "tasks.jsonl", "--model", "lora-run/checkpoints/step-2"],
        "--model lora-run/checkpoints/step-2 is a LoRA adapter: pass --lora-rank",
    ),
    "LoRA shape without a rank": (
        ["--train", "tasks.jsonl", "--lora-alpha", "8"],
        "--lora-alpha, --lora-dropout and --lora-target-modules shape the adapter of --lora-rank R",
    ),
    "LoRA across processes": (
        ["--train", "tasks.jsonl", "--lora-rank", "4", "--nproc", "2"],
        "a LoRA adapter trains in one process: drop --nproc",
    ),
    "LoRA on prompts": (
        ["--train", "tasks.jsonl", "--algorithm", "apo", "--lora-rank", "4"],
        "--algorithm apo trains prompts: drop --lora-rank",
    ),
    "run dir below a file": (
        ["--train", "tasks.jsonl", "--run-dir", "module.txt/run"],
        "module.txt is a file",
    ),
    "unknown device": (["--train", "tasks.jsonl", "--device", "bogus"], "--device bogus is not a device"),
    "device index": (["--train", "tasks.jsonl", "--device", "cuda:x"], "pass auto, cpu, mps, cuda or cuda:N"),
    "agent spec without object": (["--train", "tasks.jsonl", "--agent", "{agent}"], "module:object"),
    "agent module missing": (["--train", "tasks.jsonl", "--agent", "no_such_module:solve"], "cannot import"),
    "agent object missing": (["--train", "tasks.jsonl", "--agent", "{agent}:nothing"], "has no attribute"),
    "unknown algorithm": (
        ["--train", "tasks.jsonl", "--algorithm", "ppo"],
        "--algorithm ppo does not exist; pass one of grpo, sft, apo",
    ),
    "sft without a rule": (
        ["--train", "tasks.jsonl", "--algorithm", "sft"],
        "--algorithm sft needs to know what to imitate: --min-reward R",
    ),
    "sft top-k above the group": (
        ["--train", "tasks.jsonl", "--algorithm", "sft", "--top-k", "9"],
        "--top-k 9 is more than --group-size 8",
    ),
    "teacher run without a store": (
        ["--train", "tasks.jsonl", "--algorithm", "sft", "--from-run", "old-run"],
        "--from-run old-run holds no store.sqlite",
    ),
    "sft options with grpo": (
        ["--train", "tasks.jsonl", "--min-reward", "1"],
        "--min-reward go with --algorithm sft",
    ),
    "model and upstream": (
        ["--train", "tasks.jsonl", "--dev", "--upstream", "http://127.0.0.1:9/v1"],
        "pass --model DIR (a local model to train) or --upstream URL",
    ),
    "upstream options without upstream": (
        ["--train", "tasks.jsonl", "--upstream-model", "gpt"],
        "--upstream-model, --upstream-key-env and --no-token-ids go with --upstream URL",
    ),
    "chat template that does not exist": (
        ["--train", "tasks.jsonl", "--chat-template", "missing.jinja"],
        "--chat-template missing.jinja: no such file, and not a template fulgor ships",
    ),
    "ray address without ray runners": (
        ["--train", "tasks.jsonl", "--ray-address", "auto"],
        "--ray-address names the Ray cluster of --runners ray",
    ),
    "ray runners on another python": (
        ["--train", "tasks.jsonl", "--runners", "ray", "--runner-python", sys.executable],
        "pass one of --runners ray and --runner-python",
    ),
    "agent object not an agent": (
        ["--train", "tasks.jsonl", "--agent", "{agent}:not_an_agent"],
        "not an agent",
    ),
}


@pytest.mark.parametrize(("args", "says"), list(REFUSED.values()), ids=list(REFUSED))
def test_bad_input_is_one_clear_error_before_anything_starts(
    folder: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--model", "model", "--run-dir", "run", *args]
    status = main([arg.replace("{agent}", module) for arg in argv])
    out, err = capsys.readouterr()
    assert status == 2, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert says in errors[0]
    assert "Traceback" not in err
    assert out == ""
    assert not (folder / "run").exists()  # nothing started


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--steps", "0", "0 is too small; pass 1 or more"),
        ("--batch-tasks", "two", "'two' is not a whole number"),
        ("--learning-rate", "0", "'0' must be greater than 0"),
        ("--max-seconds", "nan", "'nan' is not a finite number"),
        ("--temperature", "-1", "'-1' must be 0 or more"),
    ],
)
def test_bad_settings_are_usage_errors(
    capsys: pytest.CaptureFixture[str], option: str, value: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--agent", "m:f", "--train", "t.jsonl", "--model", "m", option, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {says}" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--train", "tasks.jsonl"], "--algorithm grpo changes the model's weights, and --upstream"),
        (
            ["--train", "tasks.jsonl", "--algorithm", "sft", "--top-k", "1"],
            "--algorithm sft changes the model's",
        ),
        (["--train", "tasks.jsonl", "--dev", "--upstream-key-env", "FULGOR_TEST_UNSET"], "is not set"),
        (
            ["--train", "tasks.jsonl", "--dev", "--chat-template", "chatml-tools"],
            "--chat-template go with the engine fulgor starts on --model",
        ),
    ],
)
def test_training_on_an_upstream_is_refused_before_anything_starts(
    folder: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    says: str,
) -> None:
    monkeypatch.delenv("FULGOR_TEST_UNSET", raising=False)
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--upstream", "http://127.0.0.1:9/v1", "--run-dir", "run"]
    assert main([*argv, *args]) == 2
    out, err = capsys.readouterr()
    [error] = err.splitlines()
    assert says in error
    assert out == ""
    assert not (folder / "run").exists()


def test_evaluate_needs_the_run_dir_it_measures(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--model", "model", "--val", "tasks.jsonl", "--evaluate"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    [error] = err.splitlines()
    assert error.startswith("error: --evaluate measures the weights of a run")
    assert "pass its --run-dir" in error
    assert out == ""
    assert not (folder / "runs").exists()  # no new, empty run measured with the base model


@pytest.mark.parametrize(
    ("args", "kept"), [([], 2), (["--keep-checkpoints", "5"], 5), (["--keep-checkpoints", "0"], 0)]
)
def test_keep_checkpoints_reaches_the_trainer(
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    kept: int,
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("openai")
    from fulgor import Trainer

    given: list[int] = []

    def fit(self: Trainer, agent: object, train: object, val: object = ()) -> None:
        given.append(self.keep_checkpoints)
        raise ConfigError("stopped before training")

    monkeypatch.setattr(Trainer, "fit", fit)
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--model", "model", "--train", "tasks.jsonl"]
    assert main(["-v", *argv, "--run-dir", "run", "--device", "cpu", *args]) == 1
    assert given == [kept]
    assert "error: stopped before training" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "mps"])
def test_a_device_this_machine_lacks_is_refused_before_anything_starts(
    folder: Path, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() if device.startswith("cuda") else torch.backends.mps.is_available():
        pytest.skip(f"this machine has {device}")
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--model", "model", "--train", "tasks.jsonl"]
    assert main([*argv, "--run-dir", "run", "--device", device]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert f"device {device!r} was asked for but" in errors[0]
    assert "use --device cpu" in errors[0]
    assert "Traceback" not in err
    assert not (folder / "run").exists()  # nothing started


def test_a_missing_torch_names_the_extra(folder: Path) -> None:
    module = (folder / "module.txt").read_text()
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from fulgor.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    )
    command = ["train", "--agent", f"{module}:solve", "--train", "tasks.jsonl", "--model", "model"]
    result = subprocess.run(
        [sys.executable, "-c", code, *command], cwd=folder, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert "pip install 'fulgor[torch]'" in error
    assert not list(folder.glob("runs"))


def test_every_option_reaches_grpo_and_the_trainer(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from fulgor import Trainer
    from fulgor.training.reports import DevReport

    built: list[tuple[Trainer, str, list[object]]] = []

    def dev(self: Trainer, agent: Any, tasks: Any) -> DevReport:  # the trainer as built, not run
        built.append((self, agent.name, list(tasks)))
        return DevReport(rollouts=[])

    monkeypatch.setattr(Trainer, "dev", dev)
    module = (folder / "module.txt").read_text()
    options = {
        "--steps": "7", "--max-seconds": "90", "--group-size": "3", "--batch-tasks": "5",
        "--learning-rate": "2e-4", "--temperature": "0.7", "--max-tokens": "33", "--val-every": "4",
        "--seed": "11", "--n-runners": "3", "--max-concurrency": "6", "--device": "cpu",
        "--agent-match": "write|rewrite",
    }  # fmt: skip
    argv = ["train", "--agent", f"{module}:solve", "--train", "tasks.jsonl", "--model", "model"]
    argv += ["--run-dir", "run", "--dev", *(part for pair in options.items() for part in pair)]
    assert main(argv) == 0, capsys.readouterr().err

    [(trainer, agent_name, tasks)] = built
    grpo = trainer.algorithm
    assert (grpo.max_steps, grpo.max_seconds, grpo.group_size, grpo.batch_tasks) == (7, 90.0, 3, 5)
    assert (grpo.config.learning_rate, grpo.temperature, grpo.max_tokens) == (2e-4, 0.7, 33)
    assert (grpo.val_every, grpo.seed, grpo.agent_match) == (4, 11, "write|rewrite")
    assert (trainer.n_runners, trainer.runner_config.max_concurrency) == (3, 6)
    assert (trainer.engine.model, trainer.engine.device, trainer.engine.seed) == (Path("model"), "cpu", 11)
    assert trainer.run_dir == Path("run")
    assert (agent_name, tasks) == ("solve", TASKS)

    # Without --run-dir, --dev too starts a new run directory.
    argv.remove("--run-dir")
    argv.remove("run")
    assert main(argv) == 0, capsys.readouterr().err
    assert re.fullmatch(r"runs/train-\d{8}-\d{6}", built[-1][0].run_dir.as_posix())


def test_recording_on_an_upstream_needs_no_torch(folder: Path) -> None:
    """--dev on an upstream runs the whole system (store, gateway, runners) without torch installed."""
    from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply

    module = (folder / "module.txt").read_text()
    code = "import sys; sys.modules['torch'] = None\nfrom fulgor.cli.main import main\n"
    code += "sys.exit(main(sys.argv[1:]))"
    replies = [ScriptedReply(text=f"with {task['letter']}") for task in TASKS]
    with ScriptedOpenAIServer(replies, supports_token_ids=False) as server:
        command = [
            "train",
            "--agent",
            f"{module}:solve",
            "--train",
            "tasks.jsonl",
            "--dev",
            "--n-runners",
            "1",
        ]
        command += ["--upstream", server.url, "--no-token-ids", "--run-dir", "teacher"]
        result = subprocess.run(
            [sys.executable, "-c", code, *command], cwd=folder, capture_output=True, text=True, timeout=120
        )
    assert result.returncode == 0, result.stderr
    assert "3 rollouts, 3 succeeded" in result.stdout
    assert (folder / "teacher" / "store.sqlite").is_file()


def test_sft_and_upstream_options_reach_the_trainer(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from fulgor import SFT, Trainer
    from fulgor.training.reports import DevReport

    built: list[Trainer] = []

    def dev(self: Trainer, agent: Any, tasks: Any) -> DevReport:
        built.append(self)
        return DevReport(rollouts=[])

    monkeypatch.setattr(Trainer, "dev", dev)
    module = (folder / "module.txt").read_text()
    common = ["train", "--agent", f"{module}:solve", "--train", "tasks.jsonl"]
    teacher = folder / "teacher"
    teacher.mkdir()
    (teacher / "store.sqlite").write_bytes(b"")
    argv = [*common, "--model", "model", "--run-dir", "run", "--algorithm", "sft", "--min-reward", "0.5"]
    argv += ["--top-k", "2", "--group-size", "4", "--from-run", "teacher", "--batch-size", "5", "--dev"]
    assert main(argv) == 0, capsys.readouterr().err
    sft = built[-1].algorithm
    assert isinstance(sft, SFT)
    assert (sft.min_reward, sft.top_k, sft.group_size, sft.from_run, sft.batch_size) == (
        0.5, 2, 4, Path("teacher"), 5,
    )  # fmt: skip
    assert sft.config.learning_rate == 1e-3  # SFT's own default

    monkeypatch.setenv("FULGOR_TEST_KEY", "sk-test")
    argv = [*common, "--upstream", "http://127.0.0.1:9/v1", "--upstream-model", "big", "--dev"]
    argv += ["--upstream-key-env", "FULGOR_TEST_KEY", "--no-token-ids", "--run-dir", "teacher-run"]
    assert main(argv) == 0, capsys.readouterr().err
    trainer = built[-1]
    assert trainer.engine is None
    assert trainer.upstream is not None
    assert (trainer.upstream.url, trainer.upstream.api_key) == ("http://127.0.0.1:9/v1", "sk-test")
    assert (trainer.upstream.request_token_ids, trainer.model) == (False, "big")


def test_a_task_is_any_json_value_and_reaches_the_agent_as_written(tmp_path: Path) -> None:
    from fulgor.cli.train import read_tasks

    lines = ['{"question": "2+2", "answer": 4}', '"a plain string"', "[1, 2.5, null]", "42", "", "null"]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    tasks = read_tasks(tmp_path / "tasks.jsonl")
    assert tasks == [{"question": "2+2", "answer": 4}, "a plain string", [1, 2.5, None], 42, None]


# -- real runs on a tiny model ---------------------------------------------------------------------


@pytest.mark.parametrize(("args", "address"), [([], None), (["--ray-address", "auto"], "auto")])
def test_ray_runners_reach_the_trainer(
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    address: str | None,
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("ray", reason="the ray extra is installed by make test")
    from fulgor import RayRunners, Trainer
    from fulgor.training.reports import DevReport

    built: list[Trainer] = []

    def dev(self: Trainer, agent: Any, tasks: Any) -> DevReport:  # the trainer as built, not run
        built.append(self)
        return DevReport(rollouts=[])

    monkeypatch.setattr(Trainer, "dev", dev)
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--train", "tasks.jsonl", "--model", "model", "--dev"]
    assert main([*argv, "--runners", "ray", *args]) == 0, capsys.readouterr().err
    assert built[0].runners == RayRunners(address=address)
    assert main(argv) == 0, capsys.readouterr().err
    assert built[1].runners is None  # runner processes by default


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("openai")
    from fulgor.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("train-cli") / "tiny", "tiny", seed=0)


def fulgor_train(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fulgor train`` as a user runs it, from the agent's folder."""
    command = [str(FULGOR)] if FULGOR.exists() else [sys.executable, "-m", "fulgor.cli.main"]
    return subprocess.run([*command, "train", *args], cwd=folder, capture_output=True, text=True, timeout=240)


def test_dev_runs_the_agent_once_per_task_and_reports_each_rollout(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "calls.py").write_text(AGENT)
    write_tasks(tmp_path / "tasks.jsonl", [*TASKS, {"fail": True}, {"prompt": "left out", "letter": "x"}])
    result = fulgor_train(
        tmp_path,
        *("--agent", "calls:solve", "--train", "tasks.jsonl", "--model", str(tiny_model)),
        *("--run-dir", "run", "--dev", "--limit", "4", "--max-tokens", "8", "--device", "cpu"),
        *("--n-runners", "1"),
    )
    assert "Traceback" not in result.stderr
    # The failing task fails its rollout; the others run through engine, gateway and store.
    assert result.returncode == 1, result.stderr
    assert "4 rollouts, 3 succeeded" in result.stdout
    assert result.stdout.count(" succeeded ") == 3
    assert "this task fails on purpose" in result.stdout
    assert "this task fails on purpose" not in result.stderr  # the table once, on stdout
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "1 of 4 rollouts did not succeed" in error
    assert f"sqlite:///{Path('run') / 'store.sqlite'}" in result.stdout
    assert f"fulgor dashboard {Path('run')}" in result.stdout
    assert (tmp_path / "run" / "store.sqlite").is_file()
    assert not (tmp_path / "run" / "checkpoints").exists()  # no training


def test_train_one_step_then_evaluate_the_run(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "calls.py").write_text(AGENT)
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    write_tasks(tmp_path / "val.jsonl", TASKS[:2])
    common = ("--agent", "calls:solve", "--model", str(tiny_model), "--device", "cpu")
    sizes = ("--max-tokens", "8", "--n-runners", "1", "--max-concurrency", "4")
    result = fulgor_train(  # without --run-dir: a new one under runs/
        tmp_path,
        *common,
        *sizes,
        *("--train", "tasks.jsonl", "--val", "val.jsonl", "--steps", "1", "--group-size", "2"),
        *("--batch-tasks", "2", "--learning-rate", "1e-3"),
    )
    assert result.returncode == 0, result.stderr
    [run] = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"train-\d{8}-\d{6}", run.name)
    shown = Path("runs") / run.name
    [hint] = [line for line in result.stdout.splitlines() if "continue:" in line]
    assert f"the same command with --run-dir {shown} and a larger --steps" in hint
    history = read_metrics(run)
    assert [m["step"] for m in history] == [0, 1]
    assert history[1]["rollouts"] == 4
    assert history[1]["rollouts_failed"] == 0
    assert history[0]["val_rollouts_failed"] == 0
    assert (run / "checkpoints" / "step-1" / "config.json").is_file()
    for label, path in [
        ("report", "report.html"),
        ("metrics per step", "metrics.jsonl"),
        ("store (rollouts, spans)", "store.sqlite"),
        ("checkpoints", "checkpoints"),
    ]:
        assert f"{label:<24} {shown / path}" in result.stdout
    assert "step  reward  val acc" in result.stdout  # the curve, as text

    evaluated = fulgor_train(
        tmp_path, *common, *sizes, "--run-dir", str(shown), "--val", "val.jsonl", "--evaluate"
    )
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout.splitlines()[0])
    assert set(metrics) == {
        "val_accuracy",
        "val_tool_call_rate",
        "val_tool_calls",
        "val_rollouts_failed",
        "tasks",
        "step",
    }
    assert (metrics["tasks"], metrics["val_rollouts_failed"], metrics["step"]) == (2, 0, 1)
    assert "step-1" in evaluated.stderr  # with the weights the run trained
    assert [m["step"] for m in read_metrics(run)] == [0, 1]  # evaluating trains nothing
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run.name]


def test_record_a_teacher_on_an_upstream_then_distil_it_and_train_with_rejection_sampling(
    tmp_path: Path, tiny_model: Path
) -> None:
    from fulgor.testing.openai_server import ScriptedOpenAIServer, ScriptedReply

    (tmp_path / "calls.py").write_text(AGENT)
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    common = ("--agent", "calls:solve", "--train", "tasks.jsonl", "--n-runners", "1", "--max-tokens", "8")
    # The teacher: a simulated hosted API (real HTTP) whose replies hold each task's letter.
    replies = [ScriptedReply(text=f"a word with {task['letter']} in it") for task in TASKS]
    with ScriptedOpenAIServer(replies, supports_token_ids=False) as server:
        recorded = fulgor_train(
            tmp_path, *common, "--upstream", server.url, "--no-token-ids", "--dev", "--run-dir", "teacher"
        )
    assert recorded.returncode == 0, recorded.stderr
    assert "3 rollouts, 3 succeeded" in recorded.stdout

    local = ("--model", str(tiny_model), "--device", "cpu", "--steps", "1")
    distilled = fulgor_train(
        tmp_path, *common, *local, "--algorithm", "sft", "--from-run", "teacher", "--batch-size", "3",
        "--run-dir", "student",
    )  # fmt: skip
    assert distilled.returncode == 0, distilled.stderr
    [step] = read_metrics(tmp_path / "student")
    assert (step["rollouts"], step["rows_tokenised"], step["transcripts"]) == (0, 3.0, 3.0)
    assert (tmp_path / "student" / "checkpoints" / "step-1" / "config.json").is_file()

    sampled = fulgor_train(
        tmp_path, *common, *local, "--algorithm", "sft", "--top-k", "1", "--group-size", "2",
        "--batch-tasks", "2", "--run-dir", "own",
    )  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr
    [step] = read_metrics(tmp_path / "own")
    assert (step["rollouts"], step["rollouts_selected"], step["rollouts_not_selected"]) == (4, 2.0, 2.0)


def test_evaluate_fails_when_a_rollout_fails(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "calls.py").write_text(AGENT)
    write_tasks(tmp_path / "val.jsonl", [TASKS[0], {"fail": True}])
    result = fulgor_train(
        tmp_path,
        *("--agent", "calls:solve", "--model", str(tiny_model), "--run-dir", "run", "--device", "cpu"),
        *("--val", "val.jsonl", "--evaluate", "--max-tokens", "8", "--n-runners", "1"),
    )
    assert "Traceback" not in result.stderr
    assert result.returncode == 1, result.stderr
    metrics = json.loads(result.stdout.splitlines()[0])  # still measured and printed
    assert (metrics["tasks"], metrics["val_rollouts_failed"]) == (2, 1)
    assert metrics["step"] == 0  # a run without checkpoints: the weights of --model, and it says so
    assert f"{Path('run')} has no checkpoint yet, so this measures the weights of --model" in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "1 of 2 rollouts did not succeed" in error
    assert str(Path("run") / "logs" / "runners.log") in error


def interrupt_a_training_run(folder: Path, tiny_model: Path) -> tuple[int, str, Path]:
    """``fulgor train`` in ``folder``, sent Ctrl+C once a rollout runs; its exit status, its stderr
    and the run directory it made."""
    (folder / "calls.py").write_text(AGENT)
    started = folder / "started"
    write_tasks(folder / "tasks.jsonl", [{"hang": str(started)}])
    command = [str(FULGOR)] if FULGOR.exists() else [sys.executable, "-m", "fulgor.cli.main"]
    command += ["train", "--agent", "calls:solve", "--model", str(tiny_model), "--train", "tasks.jsonl"]
    command += ["--device", "cpu", "--group-size", "2", "--n-runners", "1", "--max-tokens", "8"]
    # A session of its own, as a terminal's foreground job: Ctrl+C is SIGINT to its process group.
    process = subprocess.Popen(
        command,
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=take_sigint,
    )
    try:
        deadline = time.monotonic() + 180
        while not started.exists():  # a rollout runs: every service is up
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no rollout started"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    [run] = (folder / "runs").iterdir()
    return process.returncode, err, run


def test_ctrl_c_stops_the_run_and_says_how_to_continue(tmp_path: Path, tiny_model: Path) -> None:
    returncode, err, run = interrupt_a_training_run(tmp_path, tiny_model)
    assert returncode == 130, err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("interrupted:")]
    shown = Path("runs") / run.name
    assert line == (
        f"interrupted: {shown} keeps every finished step; to continue, run the same command with "
        f"--run-dir {shown}"
    )


def test_ctrl_c_stops_every_service_before_the_command_exits(tmp_path: Path, tiny_model: Path) -> None:
    returncode, err, run = interrupt_a_training_run(tmp_path, tiny_model)
    left_at_exit = running_in(tmp_path)  # runner processes, agents: anything started from the folder
    deadline = time.monotonic() + 60
    while running_in(tmp_path) and time.monotonic() < deadline:  # leave nothing to later tests
        time.sleep(0.2)
    assert returncode == 130, err
    assert left_at_exit == set()
    # The rollouts the run had not finished are cancelled: none stays queued for a later run.
    assert {rollout.status for rollout in asyncio.run(_rollouts(run / "store.sqlite"))} == {"cancelled"}


async def _rollouts(path: Path) -> list[Rollout]:
    store = SqliteStore(path)
    try:
        return await store.query_rollouts()
    finally:
        await store.close()


# -- fulgor demo -----------------------------------------------------------------------------------


def test_demo_outside_a_checkout_says_where_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "ships with fulgor's source checkout" in err
    assert "run `make demo` or `fulgor demo` from the fulgor source directory" in err
    assert not (tmp_path / "runs").exists()


def test_demo_in_a_checkout_runs_the_calc_demo_with_the_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("openai")
    import examples.calc.train

    ran: list[list[str]] = []

    def record(argv: list[str]) -> int:  # what the command hands the demo, instead of five minutes of it
        ran.append(argv)
        return 0

    monkeypatch.setattr(examples.calc.train, "main", record)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the checkout first
    monkeypatch.chdir(ROOT)
    assert main(["demo", "--run-dir", str(tmp_path / "calc"), "--seed", "3", "--steps", "7"]) == 0
    assert ran == [["--seed", "3", "--steps", "7", "--run-dir", str(tmp_path / "calc")]]


def test_demo_refuses_a_step_count_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--steps", "0"])
    assert exit_info.value.code == 2
    assert "argument --steps: 0 is too small; pass 1 or more" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("raised", "status", "says"),
    [
        (ConfigError("the demo could not build its model"), 1, "error: the demo could not build its model"),
        (KeyboardInterrupt(), 130, "interrupted: the demo stopped"),
    ],
)
def test_demo_failing_or_interrupted_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: BaseException,
    status: int,
    says: str,
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("openai")
    import examples.calc.train

    def fail(argv: list[str]) -> int:
        raise raised

    monkeypatch.setattr(examples.calc.train, "main", fail)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(ROOT)
    assert main(["demo", "--steps", "1"]) == status
    err = capsys.readouterr().err
    assert says in err.strip().splitlines()[-1]
    assert "Traceback" not in err


@pytest.mark.slow(minutes=5)
def test_demo_runs_from_the_checkout(tmp_path: Path) -> None:
    command = [str(FULGOR)] if FULGOR.exists() else [sys.executable, "-m", "fulgor.cli.main"]
    result = subprocess.run(
        [*command, "demo", "--run-dir", str(tmp_path / "calc"), "--steps", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    assert "held-out test accuracy" in result.stdout
    assert [m["step"] for m in read_metrics(tmp_path / "calc" / "grpo")] == [0, 1]


def test_lora_from_the_command_line_trains_an_adapter_and_keeps_one_optimiser_state(
    tmp_path: Path, tiny_model: Path
) -> None:
    """--lora-rank: each checkpoint is an adapter, only the newest holds the optimiser state, and the
    run continues as it trained."""
    (tmp_path / "calls.py").write_text(AGENT)
    write_tasks(tmp_path / "tasks.jsonl", TASKS)
    run = tmp_path / "run"
    argv = ["--agent", "calls:solve", "--model", str(tiny_model), "--device", "cpu", "--run-dir", str(run)]
    argv += ["--train", "tasks.jsonl", "--group-size", "2", "--batch-tasks", "2", "--max-tokens", "8"]
    argv += ["--n-runners", "1", "--lora-rank", "4", "--lora-target-modules", "q_proj", "v_proj"]
    argv += ["--keep-checkpoints", "0"]
    result = fulgor_train(tmp_path, *argv, "--steps", "2")
    assert result.returncode == 0, result.stderr
    steps = sorted((run / "checkpoints").iterdir())
    assert [p.name for p in steps] == ["step-1", "step-2"]
    for checkpoint in steps:
        config = json.loads((checkpoint / "adapter_config.json").read_text())
        assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (
            4,
            8,
            ["q_proj", "v_proj"],
        )
        assert not (checkpoint / "model.safetensors").exists()  # the adapter only
    assert not (steps[0] / "training_state.pt").exists()
    assert (steps[1] / "training_state.pt").is_file()

    resumed = fulgor_train(tmp_path, *argv, "--steps", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
    assert not (run / "checkpoints" / "step-2" / "training_state.pt").exists()
    assert (run / "checkpoints" / "step-3" / "training_state.pt").is_file()

    # An adapter (a warm start's, another run's checkpoint) is a --model to train further.
    adapter, further = run / "checkpoints" / "step-3", tmp_path / "further"
    argv[argv.index(str(tiny_model))], argv[argv.index(str(run))] = str(adapter), str(further)
    continued = fulgor_train(tmp_path, *argv, "--steps", "1")
    assert continued.returncode == 0, continued.stderr
    config = json.loads((further / "checkpoints" / "step-1" / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == tiny_model.resolve()
