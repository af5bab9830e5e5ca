"""Bad command lines, as users type them: one ``error:`` line that says what to do, no traceback,
the documented exit status, and nothing left open."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from fulgor.store import SqliteStore

# The CLI, with every SqliteStore it opens and closes noted on stderr.
RUN_CLI = """
import sys
from fulgor.store.sqlite import SqliteStore
opened, closed = SqliteStore.__init__, SqliteStore.close
def noting_init(self, *args, **kwargs):
    opened(self, *args, **kwargs)
    print("store opened", file=sys.stderr)
async def noting_close(self):
    print("store closed", file=sys.stderr)
    await closed(self)
SqliteStore.__init__, SqliteStore.close = noting_init, noting_close
from fulgor.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
# torch unimportable, as on a machine without the fulgor[torch] extra.
RUN_CLI_WITHOUT_TORCH = f"import sys; sys.modules['torch'] = None\n{RUN_CLI}"
UPSTREAM = "http://127.0.0.1:1/v1"
needs_torch = pytest.mark.skipif(find_spec("torch") is None, reason="needs torch")

# (arguments, exit status, text the error must hold); {tmp} is a folder holding store.sqlite (an
# empty store), notes.txt (text, not a database) and an empty folder dir/; {busy} a port in use.
BAD_INPUTS = {
    "serve port too high": (["serve", "--store", "memory://", "--port", "70000"], 2, "0 to 65535"),
    "serve port negative": (["serve", "--store", "memory://", "--port", "-1"], 2, "0 to 65535"),
    "gateway port too high": (
        ["gateway", "--store", "memory://", "--upstream", UPSTREAM, "--port", "70000"],
        2,
        "0 to 65535",
    ),
    "engine port too high": (["engine", "--model", "{tmp}/dir", "--port", "70000"], 2, "0 to 65535"),
    "serve upstream port too high": (
        ["serve", "--store", "sqlite:///{tmp}/s.sqlite", "--port", "0", "--upstream", "http://h:99999/v1"],
        2,
        "'http://h:99999/v1'",
    ),
    "serve model map without a model": (
        ["serve", "--store", "memory://", "--port", "0", "--upstream", UPSTREAM, "--model-map", "gpt-4.1"],
        2,
        "is not NAME=MODEL",
    ),
    "gateway upstream port not a number": (
        ["gateway", "--store", "sqlite:///{tmp}/s.sqlite", "--port", "0", "--upstream", "http://h:abc/v1"],
        2,
        "'http://h:abc/v1'",
    ),
    "serve store not a database": (
        ["serve", "--store", "sqlite:///{tmp}/notes.txt", "--port", "0"],
        2,
        "notes.txt",
    ),
    "serve store a folder": (["serve", "--store", "sqlite:///{tmp}/dir", "--port", "0"], 2, "sqlite:///PATH"),
    "serve store another server": (
        ["serve", "--store", "http://127.0.0.1:1", "--port", "0"],
        2,
        "postgresql://",
    ),
    "store stats not a database": (
        ["store", "stats", "--store", "sqlite:///{tmp}/notes.txt"],
        2,
        "fulgor SQLite store",
    ),
    "store rollouts status typo": (
        ["store", "rollouts", "--store", "sqlite:///{tmp}/store.sqlite", "--status", "succeded"],
        2,
        "'succeeded'",
    ),
    "serve port in use": (
        ["serve", "--store", "sqlite:///{tmp}/s.sqlite", "--port", "{busy}", "--upstream", UPSTREAM],
        2,
        "already in use",
    ),
    "gateway port in use": (
        ["gateway", "--store", "sqlite:///{tmp}/s.sqlite", "--port", "{busy}", "--upstream", UPSTREAM],
        2,
        "already in use",
    ),
    "vllm with local-only flags": (
        ["engine", "--backend", "vllm", "--model", "m", "--device", "cpu", "--threads", "2"],
        1,
        "--device, --threads only apply to --backend local",
    ),
    "local engine with a vllm flag": (
        ["engine", "--model", "{tmp}/dir", "--port", "0", "--vllm-arg=--enforce-eager"],
        1,
        "--vllm-arg only applies to --backend vllm",
    ),
    "model init out is a file": pytest.param(
        ["model", "init", "--out", "{tmp}/notes.txt"], 1, "--out", marks=needs_torch
    ),
    "model init out under a file": pytest.param(
        ["model", "init", "--out", "{tmp}/notes.txt/model"], 1, "--out", marks=needs_torch
    ),
}
WITHOUT_TORCH = {
    "engine": (["engine", "--model", "{tmp}/dir", "--port", "0"], 1, "pip install 'fulgor[torch]'"),
    "model init": (["model", "init", "--out", "{tmp}/model"], 1, "pip install 'fulgor[torch]'"),
}


def run_cli(code: str, args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    asyncio.run(SqliteStore(tmp / "store.sqlite").close())
    (tmp / "notes.txt").write_text("not a database\n" * 100)
    (tmp / "dir").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        argv = [arg.replace("{tmp}", str(tmp)).replace("{busy}", port) for arg in args]
        return subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120
        )


def assert_one_clear_error(result: subprocess.CompletedProcess[str], status: int, says: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert says in errors[0]
    assert result.returncode == status, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines.count("store closed") == lines.count("store opened"), "a store was left open"


@pytest.mark.parametrize(("args", "status", "says"), list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_gets_one_clear_error(tmp_path: Path, args: list[str], status: int, says: str) -> None:
    assert_one_clear_error(run_cli(RUN_CLI, args, tmp_path), status, says)
    assert (tmp_path / "notes.txt").read_text() == "not a database\n" * 100


@pytest.mark.parametrize(("args", "status", "says"), list(WITHOUT_TORCH.values()), ids=list(WITHOUT_TORCH))
def test_a_missing_torch_names_the_extra(tmp_path: Path, args: list[str], status: int, says: str) -> None:
    assert_one_clear_error(run_cli(RUN_CLI_WITHOUT_TORCH, args, tmp_path), status, says)
    assert not (tmp_path / "model").exists()
