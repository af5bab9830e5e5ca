"""``fulgor model init`` and ``fulgor engine`` as users run them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from fulgor.cli.main import main

RUN_CLI = "import sys; from fulgor.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "tiny-model"
    assert main(["model", "init", "--out", str(out), "--size", "tiny", "--arch", "qwen2"]) == 0
    return out


def test_model_init_builds_a_hugging_face_model(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert (
        "chat_template" in (model_dir / "tokenizer_config.json").read_text()
        or (model_dir / "chat_template.jinja").is_file()
    )
    assert main(["model", "init", "--out", str(model_dir)]) == 1
    assert "already holds a model" in capsys.readouterr().err


def test_model_init_learns_the_tokenizer_from_a_corpus_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Compute the sum of the invoices.\n" * 100)
    assert main(["model", "init", "--out", str(tmp_path / "m"), "--corpus", str(corpus)]) == 0
    tokens = json.loads((tmp_path / "m" / "tokenizer.json").read_text())["model"]["vocab"]
    assert "Ġinvoices" in tokens
    assert main(["model", "init", "--out", str(tmp_path / "n"), "--corpus", str(tmp_path / "none")]) == 1
    assert "cannot read --corpus" in capsys.readouterr().err


@pytest.fixture(scope="module")
def served(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    token_file = tmp_path_factory.mktemp("token") / "admin-token"
    token_file.write_text("letmein\n")
    command = [
        sys.executable,
        "-c",
        RUN_CLI,
        "engine",
        "--model",
        str(model_dir),
        "--port",
        "0",
        "--threads",
        "1",
    ]
    command += ["--admin-token-file", str(token_file)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    yield url, process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_engine_prints_its_url_serves_and_stops_on_sigterm(
    served: tuple[str, subprocess.Popen[str]], model_dir: Path
) -> None:
    url, process = served
    assert url.startswith("http://127.0.0.1:")
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == model_dir.name
    body = {"model": model_dir.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    assert response["usage"]["completion_tokens"] >= 1
    swap = httpx.post(
        f"{url}/admin/weights",
        json={"path": str(model_dir)},
        headers={"Authorization": "Bearer letmein"},
        timeout=60,
    )
    assert swap.json()["model_version"] == 1
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_a_taken_port_is_named(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["engine", "--model", str(model_dir), "--port", str(port)]) == 1
    error = capsys.readouterr().err
    assert f"port {port}" in error
    assert "already in use" in error


def test_a_missing_model_says_how_to_build_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine", "--model", str(tmp_path / "none"), "--port", "0"]) == 1
    assert "fulgor model init" in capsys.readouterr().err


def test_cli_stays_light() -> None:
    modules = "fulgor.engine, fulgor.engine.vllm, fulgor.cli.engine, fulgor.cli.model"
    heavy = "('torch', 'transformers', 'fastapi', 'tokenizers')"
    code = f"import sys, {modules}; print(sorted(m for m in {heavy} if m in sys.modules))"
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True
    )
    assert output.stdout.strip() == "[]"


def test_a_chat_template_or_parser_that_is_wrong_fails_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The model does not even exist: the template and parser are checked first.
    nowhere = str(tmp_path / "none")
    assert main(["engine", "--model", nowhere, "--port", "0", "--chat-template", "missing.jinja"]) == 1
    assert "no such file, and not a template fulgor ships (chatml-tools" in capsys.readouterr().err
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% if messages %}")
    assert main(["engine", "--model", nowhere, "--port", "0", "--chat-template", str(broken)]) == 1
    assert "does not parse: line 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["engine", "--model", nowhere, "--tool-call-parser", "granite"])
    assert usage.value.code == 2
    assert "(choose from 'hermes', 'llama3_json', 'mistral', 'pythonic')" in capsys.readouterr().err
    for backend in ("local", "vllm"):
        assert main(["engine", "--model", nowhere, "--backend", backend, "--chat-template", "nope"]) == 1
        assert "--chat-template nope" in capsys.readouterr().err
