"""``fulgor train --nproc N``: what it refuses before anything starts, and a real run of two ranks
under torchrun (gloo, CPU) that trains, checkpoints sharded and continues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.process_support import alive, descendants, take_sigint

from fulgor.cli.main import main
from fulgor.training.run_report import read_metrics
from fulgor.weights.policy import load_training_state

AGENT = '''
from openai import AsyncOpenAI

from fulgor import LLM, rollout


@rollout
async def solve(task, llm: LLM) -> float:
    """One chat call; the reward is whether the reply holds the task's letter."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=3)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}], **llm.sampling_parameters
        )
    finally:
        await client.close()
    return 1.0 if task["letter"] in (reply.choices[0].message.content or "") else 0.0
'''
TASKS = [
    {"prompt": "Say a word.", "letter": "e"},
    {"prompt": "Name a colour.", "letter": "a"},
    {"prompt": "Count to three.", "letter": "o"},
]


def write_tasks(path: Path) -> None:
    path.write_text("".join(json.dumps(task) + "\n" for task in TASKS))


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder with an agent module, tasks and a model directory nothing loads."""
    module = f"agent_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(AGENT)
    (tmp_path / "module.txt").write_text(module)
    write_tasks(tmp_path / "tasks.jsonl")
    (tmp_path / "prompt.txt").write_text("Solve: {task}")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return tmp_path


REFUSED = {
    "dev": (["--nproc", "2", "--dev"], "--dev and --evaluate train nothing"),
    "evaluate": (
        ["--nproc", "2", "--evaluate", "--val", "tasks.jsonl"],
        "--dev and --evaluate train nothing",
    ),
    "apo": (
        [
            "--nproc",
            "2",
            "--algorithm",
            "apo",
            "--prompt",
            "prompt_template=prompt.txt",
            "--val",
            "tasks.jsonl",
            "--optimizer-url",
            "http://127.0.0.1:9/v1",
            "--optimizer-model",
            "critic",
        ],
        "--algorithm apo trains in one process",
    ),
    "sft": (["--nproc", "2", "--algorithm", "sft", "--min-reward", "1"], "--algorithm sft trains in one"),
    "checkpointing with sft": (
        ["--algorithm", "sft", "--min-reward", "1", "--gradient-checkpointing"],
        "pass it with --algorithm grpo",
    ),
    "bfloat16 with apo": (
        [
            "--algorithm",
            "apo",
            "--prompt",
            "prompt_template=prompt.txt",
            "--val",
            "tasks.jsonl",
            "--optimizer-url",
            "http://127.0.0.1:9/v1",
            "--optimizer-model",
            "critic",
            "--compute-dtype",
            "bfloat16",
        ],
        "pass it with --algorithm grpo or sft",
    ),
}


@pytest.mark.parametrize(("args", "says"), REFUSED.values(), ids=REFUSED.keys())
def test_update_options_are_refused_before_anything_starts(
    folder: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--model", "model", "--train", "tasks.jsonl"]
    assert main([*argv, "--run-dir", "run", *args]) == 2
    out, err = capsys.readouterr()
    assert says in err
    assert out == ""
    assert not (folder / "run").exists()


def test_nproc_is_a_count(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--model", "model", "--train", "tasks.jsonl"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--nproc", "0"])
    assert exit_info.value.code == 2
    assert "--nproc" in capsys.readouterr().err


def test_a_torchrun_of_another_size_is_refused(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    module = (folder / "module.txt").read_text()
    argv = ["train", "--agent", f"{module}:solve", "--model", "model", "--train", "tasks.jsonl"]
    assert main([*argv, "--run-dir", "run", "--nproc", "2"]) == 2
    assert "--nproc 2 runs under a torchrun of 3 processes" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("openai")
    from fulgor.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("nproc") / "tiny", "tiny", seed=0)


def fulgor_train(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "fulgor.cli.main", "train", *args]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow(minutes=5)
@pytest.mark.timeout(900)  # two runs, each starting torchrun and three Python processes with torch
def test_two_ranks_train_checkpoint_sharded_and_continue(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "calls.py").write_text(AGENT)
    write_tasks(tmp_path / "tasks.jsonl")
    common = [
        "--agent", "calls:solve", "--model", str(tiny_model), "--device", "cpu", "--train", "tasks.jsonl",
        "--val", "tasks.jsonl", "--max-tokens", "8", "--n-runners", "1", "--max-concurrency", "4",
        "--group-size", "2", "--batch-tasks", "2", "--learning-rate", "1e-3", "--val-every", "2",
        "--nproc", "2", "--gradient-checkpointing", "--compute-dtype", "bfloat16",
    ]  # fmt: skip
    before = descendants(os.getpid())
    result = fulgor_train(tmp_path, *common, "--steps", "2")  # without --run-dir: one for every rank
    assert result.returncode == 0, result.stderr[-4000:]
    [run] = (tmp_path / "runs").iterdir()
    assert [m["step"] for m in read_metrics(run)] == [0, 1, 2]
    assert read_metrics(run)[1]["trained_tokens"] > 0
    checkpoint = run / "checkpoints" / "step-2"
    assert (checkpoint / "config.json").is_file()
    shards = sorted(path.name for path in (checkpoint / "optimizer").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert result.stdout.count("step  reward  val acc") == 1  # rank 0 reports, once
    hyperparameters = json.loads((run / "run.json").read_text())["hyperparameters"]
    assert hyperparameters["config/gradient_checkpointing"] is True
    assert hyperparameters["config/compute_dtype"] == "bfloat16"

    again = fulgor_train(tmp_path, *common, "--steps", "3", "--run-dir", str(run))
    assert again.returncode == 0, again.stderr[-4000:]
    assert [m["step"] for m in read_metrics(run)] == [0, 1, 2, 3]
    state = load_training_state(run / "checkpoints" / "step-3")
    assert state is not None
    assert state["step"] == 3
    assert "resuming from" in again.stderr
    assert descendants(os.getpid()) <= before  # no rank, runner or torchrun left behind


@pytest.mark.slow(minutes=2)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda sig: sig.name)
def test_a_signal_to_the_launcher_stops_every_rank(
    tmp_path: Path, tiny_model: Path, sig: signal.Signals
) -> None:
    """SIGINT (a Ctrl+C) and SIGTERM stop the run in order, and SIGKILL of the launcher leaves no
    torchrun or rank training on."""
    (tmp_path / "calls.py").write_text(AGENT)
    write_tasks(tmp_path / "tasks.jsonl")
    run = tmp_path / "run"
    command = [
        sys.executable, "-m", "fulgor.cli.main", "train", "--agent", "calls:solve",
        "--model", str(tiny_model), "--device", "cpu", "--train", "tasks.jsonl", "--max-tokens", "8",
        "--n-runners", "1", "--max-concurrency", "4", "--group-size", "2", "--batch-tasks", "2",
        "--steps", "10000", "--nproc", "2", "--run-dir", str(run),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as sink:
        launcher = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=sink, preexec_fn=take_sigint
        )
    try:
        deadline = time.monotonic() + 300
        metrics = run / "metrics.jsonl"
        while not (metrics.is_file() and read_metrics(run)[1:]):  # step 1 done: every rank is in the loop
            assert launcher.poll() is None, stderr.read_text()[-4000:]
            assert time.monotonic() < deadline, stderr.read_text()[-4000:]
            time.sleep(0.5)
        started = descendants(launcher.pid)
        assert len(started) >= 4  # torchrun and its wrapper, two ranks (and their runner)
        launcher.send_signal(sig)
        code = launcher.wait(timeout=120)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [pid for pid in started if alive(pid)], stderr.read_text()[-4000:]
    finally:
        for pid in descendants(launcher.pid) | {launcher.pid}:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    said = stderr.read_text()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        assert "the fulgor train --nproc command is gone; stopping its ranks" in said
    else:
        assert code == 130, said[-4000:]
        assert said.count(f"to continue, run the same command with --run-dir {run}") == 1, said[-4000:]
        assert "Traceback" not in said, said[-4000:]
    assert "to continue" in said  # rank 0 stopped in order, whichever signal
