"""``fulgor doctor``: the installation checklist, and the store, gateway, engine and model it is
pointed at (real servers on loopback, started as users start them)."""

from __future__ import annotations

import contextlib
import doctest
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from fulgor.cli import doctor
from fulgor.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
CLI = (sys.executable, "-m", "fulgor.cli.main")
STATUSES = ("OK", "MISSING", "FAIL")


def lines_of(out: str) -> dict[str, str]:
    """The checklist as {check name: its line}, the last line of a name winning."""
    found = {}
    for line in out.splitlines():
        if line.startswith(STATUSES):
            found[line.split(None, 1)[1].split(":", 1)[0]] = line
    return found


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def start(*args: str) -> Iterator[str]:
    """A fulgor server as its own process, and the URL it prints first; stopped afterwards."""
    process = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    try:
        if not url:
            process.wait(30)
            raise AssertionError(process.stderr.read() if process.stderr else "no URL printed")
        yield url
    finally:
        process.terminate()
        process.wait(30)


def test_the_installation_checklist(tmp_path: Path) -> None:
    # As its own process: which heavy packages it imports is part of what is checked.
    code = (
        "import sys\nfrom fulgor.cli.main import main\nstatus = main(['doctor'])\n"
        "print(sorted(m for m in ('transformers', 'vllm', 'ray', 'fastapi', 'openai') if m in sys.modules), "
        "file=sys.stderr)\nsys.exit(status)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == "[]"  # nothing loaded but to read its version
    checks = lines_of(result.stdout)
    for name in ("python", "fulgor", "dependencies", "sqlite", "sqlite wal", "loopback"):
        assert checks[name].startswith("OK "), checks[name]
    assert "every required check passed" in result.stdout
    # Every extra has its line; one not installed says how to install it, and fails nothing.
    for extra in doctor.EXTRAS:
        line = checks[f"fulgor[{extra}]"]
        assert line.startswith(("OK ", "MISSING ")), line
        if line.startswith("MISSING"):
            assert line.endswith(f"-> pip install 'fulgor[{extra}]'")
    assert str(tmp_path) in checks["sqlite wal"]  # where runs/ go by default
    assert list(tmp_path.iterdir()) == []  # and nothing left there
    if shutil.which("nvidia-smi") is None:
        assert "no GPU visible" in checks["cuda"]


def test_the_extras_it_checks_are_the_ones_pyproject_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {name: tuple(reqs) for name, reqs in project["optional-dependencies"].items() if name != "dev"}
    assert declared == doctor.EXTRAS
    assert tuple(project["dependencies"]) == doctor.CORE_REQUIREMENTS


def test_requirements_missing_or_too_old() -> None:
    missing_extra = doctor.check_requirements("fulgor[x]", ("no-such-package-anywhere>=1",), extra="x")
    assert (missing_extra.status, missing_extra.remedy) == ("MISSING", "pip install 'fulgor[x]'")
    missing_core = doctor.check_requirements("dependencies", ("no-such-package-anywhere>=1",), extra=None)
    assert missing_core.status == "FAIL"
    too_old = doctor.check_requirements("fulgor[x]", ("pydantic>=999",), extra="x")
    assert too_old.status == "FAIL"
    assert "needs >=999" in too_old.detail
    assert "--upgrade" in too_old.remedy
    other_platform = doctor.check_requirements(
        "x", ("no-such-package-anywhere; sys_platform == 'os2'",), extra="x"
    )
    assert other_platform.status == "OK"


def test_version_comparison_examples() -> None:
    result = doctest.testmod(doctor)
    assert result.attempted > 0
    assert result.failed == 0


def test_an_unreachable_or_missing_store_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["doctor", "--store", url]) == 1
    out = capsys.readouterr().out
    line = lines_of(out)["store"]
    assert line.startswith("FAIL")
    assert f"nothing answers at {url}" in line
    assert "-> start it: fulgor serve" in line
    assert "1 check(s) failed" in out

    assert main(["doctor", "--store", f"sqlite:///{tmp_path}/none.sqlite"]) == 1
    line = lines_of(capsys.readouterr().out)["store"]
    assert line.startswith("FAIL")
    assert "no store at" in line
    assert not (tmp_path / "none.sqlite").exists()  # looked at, not created


def test_a_store_file_opens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fulgor.store import SqliteStore, SyncStore
    from fulgor.types import RolloutRequest

    with SyncStore(SqliteStore(tmp_path / "store.sqlite")) as store:
        store.enqueue([RolloutRequest(input=1), RolloutRequest(input=2)])
    assert main(["doctor", "--store", f"sqlite:///{tmp_path}/store.sqlite"]) == 0
    line = lines_of(capsys.readouterr().out)["store"]
    assert line.startswith("OK")
    assert "2 rollouts" in line


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``fulgor serve --port 0`` with a token; its URL."""
    (tmp_path / "token").write_text("the-token\n")
    store = f"sqlite:///{tmp_path}/s.sqlite"
    with start("serve", "--port", "0", "--store", store, "--token-file", str(tmp_path / "token")) as url:
        yield url


def test_a_healthy_fulgor_serve_and_its_token(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FULGOR_TOKEN", raising=False)
    assert main(["doctor", "--store", served, "--token-file", str(tmp_path / "token")]) == 0
    line = lines_of(capsys.readouterr().out)["store"]
    assert line.startswith("OK")
    assert f"fulgor serve 0.1.0 at {served}; 0 rollouts" in line

    assert main(["doctor", "--store", served]) == 1
    line = lines_of(capsys.readouterr().out)["store"]
    assert line.startswith("FAIL")
    assert "needs a token" in line
    assert "--token-file FILE or set FULGOR_TOKEN" in line

    monkeypatch.setenv("FULGOR_TOKEN", "not-the-token")
    assert main(["doctor", "--store", served]) == 1
    assert "refused the token" in lines_of(capsys.readouterr().out)["store"]

    # fulgor serve without --upstream serves no gateway.
    monkeypatch.setenv("FULGOR_TOKEN", "the-token")
    assert main(["doctor", "--gateway", served]) == 1
    line = lines_of(capsys.readouterr().out)["gateway"]
    assert line.startswith("FAIL")
    assert "serves no gateway" in line
    assert "--upstream" in line


@contextlib.contextmanager
def answering(reply: bytes) -> Iterator[str]:
    """A TCP server on loopback that answers every connection with ``reply`` and closes it; its URL."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(5)
                with contextlib.suppress(OSError):
                    connection.recv(65536)
                    connection.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        server.close()


@pytest.mark.parametrize(
    "reply",
    [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ncut short"],
    ids=["not HTTP", "cut short"],
)
def test_a_server_that_does_not_speak_http_fails_its_check(
    reply: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    with answering(reply) as url:
        assert main(["doctor", "--store", url, "--gateway", url, "--engine", url]) == 1
    checks = lines_of(capsys.readouterr().out)
    for name in ("store", "gateway", "engine"):
        assert checks[name].startswith("FAIL"), checks[name]
        assert f"{url}" in checks[name]
        assert "answers, but not HTTP" in checks[name]
        assert "-> another program listens on that port" in checks[name]


class NeedsKey(BaseHTTPRequestHandler):
    """An OpenAI-compatible API that lists its models only with its key, as hosted ones do."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") == "Bearer upstream-key":
            status, body = 200, {"object": "list", "data": [{"id": "hosted-model", "object": "model"}]}
        else:
            error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
            status, body = 401, {"error": {**error, "code": "invalid_api_key"}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_gateway_whose_upstream_needs_a_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), NeedsKey)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{upstream.server_address[1]}/v1"
    store = f"sqlite:///{tmp_path}/s.sqlite"
    try:
        with start(
            "serve", "--port", "0", "--store", store, "--upstream", base, "--upstream-api-key", "upstream-key"
        ) as gateway:
            assert main(["doctor", "--gateway", gateway, "--engine", base]) == 0
    finally:
        upstream.shutdown()
        upstream.server_close()
    checks = lines_of(capsys.readouterr().out)
    assert checks["gateway"].startswith("OK")
    line = checks["gateway upstream"]
    assert line.startswith("OK"), line
    assert f"{base} answers, but lists its models only with the upstream's API key" in line
    assert "HTTP 401: Incorrect API key provided" in line
    assert "--upstream-api-key" in line
    assert "base URL" not in line
    engine = checks["engine"]
    assert engine.startswith("OK"), engine
    assert f"{base} answers, but lists its models only with its API key" in engine


def test_an_empty_token_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "token").write_text("")
    assert main(["doctor", "--store", "http://127.0.0.1:1", "--token-file", str(tmp_path / "token")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ")
    assert "is empty" in err


def test_a_token_file_that_cannot_be_read_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-token"
    assert main(["doctor", "--store", "http://127.0.0.1:1", "--token-file", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ")
    assert str(missing) in err


@pytest.mark.postgres
def test_a_postgresql_store_opens_and_its_password_is_not_shown(capsys: pytest.CaptureFixture[str]) -> None:
    url = os.environ.get("FULGOR_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("FULGOR_TEST_POSTGRES_URL is not set")
    import asyncio

    import psycopg
    from psycopg import sql

    from fulgor.store.postgres import PostgresStore
    from fulgor.types import RolloutRequest

    schema = f"test_doctor_{uuid.uuid4().hex[:12]}"

    async def fill() -> None:
        store = PostgresStore(url, schema=schema)
        await store.open()
        await store.enqueue([RolloutRequest(input=1)])
        await store.close()

    try:
        asyncio.run(fill())
        store_url = f"{url}{'&' if '?' in url else '?'}schema={schema}"
        assert main(["doctor", "--store", store_url]) == 0
        line = lines_of(capsys.readouterr().out)["store"]
        assert line.startswith("OK")
        assert "opens; 1 rollouts" in line
        password = urlsplit(store_url).password
        assert password
        assert f":{password}@" not in line
        assert f"{store_url.replace(f':{password}@', ':***@')} opens" in line
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# -- a model, its engine, and a gateway in front of it ---------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from fulgor.engine.models import init_model

    return init_model(tmp_path_factory.mktemp("doctor") / "tiny", "tiny", seed=0)


def test_a_model_directory(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--model", str(tiny_model)]) == 0
    checks = lines_of(capsys.readouterr().out)
    assert checks["model"].startswith("OK")
    assert (
        "LlamaForCausalLM (llama), 645K parameters, 2048-token context, float32, model.safetensors"
        in (checks["model"])
    )
    assert checks["tokenizer"].startswith("OK")
    assert checks["chat template"] == (
        "OK      chat template: the model's own template renders chat; it renders tool definitions; "
        "tool calls parsed as hermes"
    )

    # Without its chat template, chat calls cannot work: the line says what to do.
    bare = shutil.copytree(tiny_model, tmp_path / "bare")
    (bare / "chat_template.jinja").unlink()
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["doctor", "--model", str(bare)]) == 1
    line = lines_of(capsys.readouterr().out)["chat template"]
    assert line.startswith("FAIL")
    assert "no chat template" in line
    assert "add a chat_template" in line

    (tmp_path / "empty").mkdir()
    assert main(["doctor", "--model", str(tmp_path / "empty")]) == 1
    line = lines_of(capsys.readouterr().out)["model"]
    assert line.startswith("FAIL")
    assert "config.json" in line


def test_a_chat_template_that_refuses_tools_still_serves_chat(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = shutil.copytree(tiny_model, tmp_path / "no-tools")
    template = model / "chat_template.jinja"
    refuse = "{%- if tools %}{{ raise_exception('this model takes no tools') }}{%- endif %}"
    template.write_text(refuse + template.read_text())
    assert main(["doctor", "--model", str(model)]) == 0
    line = lines_of(capsys.readouterr().out)["chat template"]
    assert line.startswith("OK")
    assert "renders chat, but leaves tool definitions out: requests with tools are refused" in line
    assert "serve it with --chat-template FILE" in line

    # The template a user would serve it with instead is checked with the same option.
    assert main(["doctor", "--model", str(model), "--chat-template", "chatml-tools"]) == 0
    line = lines_of(capsys.readouterr().out)["chat template"]
    assert line.startswith(
        "OK      chat template: --chat-template chatml-tools renders chat; it renders tool"
    )
    assert main(["doctor", "--model", str(model), "--chat-template", str(tmp_path / "missing.jinja")]) == 1
    assert lines_of(capsys.readouterr().out)["chat template"].startswith("FAIL")


def test_a_lora_adapter_is_checked_with_its_base(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny_model)}))
    assert main(["doctor", "--model", str(adapter)]) == 0
    out = capsys.readouterr().out
    assert f"OK      model: {adapter} is a LoRA adapter over {tiny_model}" in out
    assert lines_of(out)["chat template"].startswith("OK")

    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/hub-name"}))
    assert main(["doctor", "--model", str(adapter)]) == 1
    line = lines_of(capsys.readouterr().out)["model"]
    assert line.startswith("FAIL")
    assert "names base model 'org/hub-name', which is not a local directory" in line


def test_an_engine_and_a_gateway_in_front_of_it(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FULGOR_TOKEN", raising=False)
    store = f"sqlite:///{tmp_path}/s.sqlite"
    with start(
        "engine", "--model", str(tiny_model), "--port", "0", "--device", "cpu", "--threads", "1"
    ) as engine:
        with start("serve", "--port", "0", "--store", store, "--upstream", f"{engine}/v1") as gateway:
            assert main(["doctor", "--engine", engine, "--gateway", gateway]) == 0
            checks = lines_of(capsys.readouterr().out)
            assert checks["engine"] == f"OK      engine: {engine}/v1 serves tiny"
            assert checks["gateway"] == f"OK      gateway: {gateway}; 1 upstream(s)"
            assert checks["gateway upstream"] == f"OK      gateway upstream: {engine}/v1 serves tiny"
        # The gateway is gone: its line fails, and so does the command.
        assert main(["doctor", "--gateway", gateway, "--engine", f"{engine}/v1/"]) == 1
        checks = lines_of(capsys.readouterr().out)
        assert checks["gateway"].startswith("FAIL")
        assert "nothing answers" in checks["gateway"]
        assert checks["engine"].startswith("OK")
