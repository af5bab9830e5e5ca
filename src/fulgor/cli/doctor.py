"""``fulgor doctor``: the checklist to run when something does not work.

Each line is ``OK``, ``MISSING`` (an optional extra that is not installed: not a failure) or
``FAIL``, and says what to do about anything not OK. Always checked: Python, fulgor, its
dependencies and each extra (versions read from package metadata, so nothing heavy is imported;
torch only, when installed, to tell whether CUDA works), SQLite and its WAL journal, and a loopback
port. On request: a store (``--store``), a gateway (``--gateway``), an engine (``--engine``) and a
local model directory (``--model``). Exit status 0 when every required check passes, 1 when one
fails, 2 when the command cannot run its checks (a ``--token-file`` it cannot read or that is empty).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import importlib.metadata
import json
import operator
import re
import socket
import sqlite3
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from fulgor.errors import FulgorError

__all__ = ["CORE_REQUIREMENTS", "EXTRAS", "Check", "check_requirements", "register"]

Status = Literal["OK", "MISSING", "FAIL"]

# fulgor's dependencies and extras as pyproject.toml declares them (a test keeps the two equal).
CORE_REQUIREMENTS = ("pydantic>=2.7,<3", "jinja2>=3.1")
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": (
        "torch>=2.4",
        "transformers>=4.46",
        "tokenizers>=0.20",
        "safetensors>=0.4",
        "peft>=0.13",
        "tqdm>=4.66",
        "gguf>=0.10",
    ),
    "server": (
        "fastapi>=0.110",
        "uvicorn>=0.30",
        "httpx>=0.27",
        "orjson>=3.9",
        "httptools>=0.6",
        "uvloop>=0.19; sys_platform != 'win32'",
        "opentelemetry-proto>=1.27",
    ),
    "frameworks": (
        "openai>=1.50",
        "anthropic>=0.40",
        "langchain-openai>=0.2",
        "langgraph>=1.0",
        "opentelemetry-instrumentation-langchain>=0.47",
        "openai-agents>=0.24",
        "mcp>=2,<3",
        "opentelemetry-sdk>=1.27",
        "opentelemetry-exporter-otlp-proto-http>=1.27",
    ),
    "report": ("matplotlib>=3.8",),
    "tracking": ("tensorboard>=2.16", "wandb>=0.18"),
    "ray": ("ray>=2.30",),
    "kubernetes": ("kubernetes>=31",),
    "postgres": ("psycopg[binary]>=3.2", "psycopg-pool>=3.2"),
    "vllm": ("vllm==0.32.0",),
}
MIN_PYTHON = (3, 11)
MIN_SQLITE = (3, 35, 0)  # RETURNING, which the SQLite store's claims use
HTTP_TIMEOUT_SECONDS = 5.0

_REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*([^;]*?)\s*(?:;\s*(.*))?")
_CLAUSE = re.compile(r"(>=|<=|==|!=|>|<)\s*([0-9][0-9.]*)")
_COMPARE = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Check:
    """One line of the checklist."""

    name: str
    status: Status
    detail: str
    remedy: str = ""

    def line(self) -> str:
        text = f"{self.status:<7} {self.name}: {self.detail}"
        return f"{text} -> {self.remedy}" if self.remedy else text


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the installation and, on request, a store, gateway, engine or model",
        description="A checklist: Python, fulgor, each extra, SQLite, a loopback port; and with the "
        "options, whether a store, gateway or engine answers and whether a model directory loads. "
        "Each line is OK, MISSING (an optional extra: not a failure) or FAIL with what to do. "
        "Exit status 0 when every required check passes, 1 when one fails, 2 for a bad --token-file.",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="a store URL to open: sqlite:///PATH, postgresql://..., or fulgor serve's http://HOST:PORT",
    )
    parser.add_argument(
        "--gateway",
        metavar="URL",
        help="a gateway's URL (fulgor gateway's, or fulgor serve's "
        "started with --upstream): it answers, and so do its upstreams' /v1/models",
    )
    parser.add_argument(
        "--engine", metavar="URL", help="an engine's URL (fulgor engine's, vLLM's): /v1/models answers"
    )
    parser.add_argument(
        "--model",
        type=Path,
        metavar="DIR",
        help="a local model directory: architecture, parameters, context, tokenizer, chat template, tool "
        "support and the tool-call format detected",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help="with --model: check this template (a Jinja file, or chatml-tools) in place of the model's own",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="file holding the token of --store and --gateway (else $FULGOR_TOKEN)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from fulgor.cli.serve import resolve_token

    try:
        token = resolve_token(args.token_file)
    except FulgorError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 2
    sections = [_installation(), _machine()]
    if args.store:
        sections.append(_store(args.store, token))
    if args.gateway:
        sections.append(_gateway(args.gateway, token))
    if args.engine:
        sections.append(_engine(args.engine))
    if args.model:
        sections.append(_model(args.model, args.chat_template))
    checks = []
    for section in sections:
        for check in section:  # each line as soon as it is known: some checks wait on the network
            print(check.line(), flush=True)
            checks.append(check)
    failed = sum(1 for check in checks if check.status == "FAIL")
    missing = sum(1 for check in checks if check.status == "MISSING")
    extras = f"; {missing} optional extra(s) not installed" if missing else ""
    if failed:
        print(f"\n{failed} check(s) failed{extras}")
        return 1
    print(f"\nevery required check passed{extras}")
    return 0


# -- the installation ------------------------------------------------------------------------------


def _installation() -> Iterator[Check]:
    import fulgor

    version = ".".join(str(part) for part in sys.version_info[:3])
    if sys.version_info[:2] >= MIN_PYTHON:
        yield Check("python", "OK", f"{version} ({sys.executable})")
    else:
        wanted = ".".join(map(str, MIN_PYTHON))
        yield Check("python", "FAIL", f"{version} is too old", f"use Python {wanted} or newer")
    yield Check("fulgor", "OK", f"{fulgor.__version__} ({Path(fulgor.__file__).parent})")
    yield check_requirements("dependencies", CORE_REQUIREMENTS, extra=None)
    for extra, requirements in EXTRAS.items():
        check = check_requirements(f"fulgor[{extra}]", requirements, extra=extra)
        yield check
        if extra == "torch" and _installed_version("torch") is not None:
            yield _cuda()


def check_requirements(name: str, requirements: tuple[str, ...], *, extra: str | None) -> Check:
    """Whether the packages of ``requirements`` are installed in versions they allow.

    A missing package of an ``extra`` is MISSING (optional); a missing dependency, or a version
    outside a requirement, is FAIL.
    """
    install = f"pip install 'fulgor[{extra}]'" if extra else "pip install --force-reinstall fulgor"
    found, missing, wrong = [], [], []
    for requirement in requirements:
        match = _REQUIREMENT.fullmatch(requirement.strip())
        if match is None:
            raise ValueError(f"cannot read the requirement {requirement!r}")
        package, specifier, marker = match.groups()
        if not _applies(marker):
            continue
        version = _installed_version(package)
        if version is None:
            missing.append(package)
        elif not _satisfies(version, specifier):
            wrong.append(f"{package} {version} (needs {specifier})")
        else:
            found.append(f"{package} {version}")
    if wrong:
        upgrade = f"pip install --upgrade 'fulgor[{extra}]'" if extra else "pip install --upgrade fulgor"
        return Check(name, "FAIL", ", ".join(wrong), upgrade)
    if missing:
        status: Status = "MISSING" if extra else "FAIL"
        return Check(name, status, f"not installed: {', '.join(missing)}", install)
    return Check(name, "OK", ", ".join(found))


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _applies(marker: str | None) -> bool:
    """The only environment marker fulgor's requirements use: ``sys_platform != '...'`` (or ``==``)."""
    if not marker:
        return True
    match = re.fullmatch(r"sys_platform\s*(==|!=)\s*['\"]([^'\"]+)['\"]", marker.strip())
    if match is None:
        return True
    return (sys.platform == match[2]) == (match[1] == "==")


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match[0].split(".")) if match else (0,)


def _satisfies(version: str, specifier: str) -> bool:
    """Whether ``version``'s release numbers meet every clause of ``specifier`` (``>=2.7,<3``).

    >>> _satisfies("2.13.0+cpu", ">=2.4"), _satisfies("3.0.1", ">=2.7,<3"), _satisfies("4.45.2", ">=4.46")
    (True, False, False)
    """
    have = _release(version)
    for clause in filter(None, (part.strip() for part in specifier.split(","))):
        match = _CLAUSE.fullmatch(clause)
        if match is None:
            continue
        wanted = _release(match[2])
        width = max(len(have), len(wanted))
        left, right = have + (0,) * (width - len(have)), wanted + (0,) * (width - len(wanted))
        if not _COMPARE[match[1]](left, right):
            return False
    return True


def _cuda() -> Check:
    try:
        import torch
    except Exception as error:  # a broken install raises anything from its native libraries
        return Check(
            "cuda",
            "FAIL",
            f"torch is installed but does not import: {error}",
            "reinstall it: pip install --force-reinstall torch",
        )
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        count = torch.cuda.device_count()
        return Check("cuda", "OK", f"CUDA {torch.version.cuda}, {count} GPU(s): {', '.join(names)}")
    build = f"torch built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build of torch"
    return Check("cuda", "OK", f"no GPU visible ({build}); the engine and training run on the CPU")


# -- the machine -----------------------------------------------------------------------------------


def _machine() -> Iterator[Check]:
    yield from _sqlite()
    yield _loopback()


def _sqlite() -> Iterator[Check]:
    version = sqlite3.sqlite_version
    if _release(version) < MIN_SQLITE:
        wanted = ".".join(map(str, MIN_SQLITE))
        yield Check(
            "sqlite",
            "FAIL",
            f"{version} is older than {wanted}, which the SQLite store needs",
            "use a Python built with a newer SQLite, or --store postgresql://...",
        )
        return
    yield Check("sqlite", "OK", version)
    try:
        where = tempfile.TemporaryDirectory(prefix=".fulgor-doctor-", dir=Path.cwd())
    except OSError:  # runs/ cannot go here; the check still says whether WAL works on this machine
        where = tempfile.TemporaryDirectory(prefix="fulgor-doctor-")
    with where as folder:
        yield _wal(Path(folder))


def _wal(folder: Path) -> Check:
    """Two connections, one writing in WAL mode and one reading: what the SQLite store relies on."""
    path = folder / "check.sqlite"
    remedy = "put the run directory on a local disk (--run-dir), or use --store postgresql://..."
    try:
        with contextlib.closing(sqlite3.connect(path)) as writer:
            mode = writer.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                return Check(
                    "sqlite wal", "FAIL", f"{folder.parent} keeps SQLite in {mode} mode, not WAL", remedy
                )
            writer.execute("CREATE TABLE t (x INTEGER)")
            writer.execute("INSERT INTO t VALUES (1)")
            writer.commit()
            with contextlib.closing(sqlite3.connect(path)) as reader:
                rows = reader.execute("SELECT x FROM t").fetchall()
    except sqlite3.Error as error:
        return Check("sqlite wal", "FAIL", f"in {folder.parent}: {error}", remedy)
    if rows != [(1,)]:
        return Check("sqlite wal", "FAIL", f"in {folder.parent} a second connection read {rows}", remedy)
    return Check("sqlite wal", "OK", f"WAL journal works in {folder.parent}")


def _loopback() -> Check:
    from fulgor.net.sockets import bind_socket

    remedy = "bring up the loopback interface (127.0.0.1): fulgor's services talk over it"
    try:
        with bind_socket("127.0.0.1", 0) as server:
            port = server.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port), timeout=HTTP_TIMEOUT_SECONDS):
                server.accept()[0].close()
    except (OSError, FulgorError) as error:
        return Check("loopback", "FAIL", f"cannot listen and connect on 127.0.0.1: {error}", remedy)
    return Check("loopback", "OK", f"127.0.0.1:{port} accepts connections")


# -- services --------------------------------------------------------------------------------------


class _Unreachable(Exception):
    """Nothing answered at a URL, or something that does not speak HTTP; ``remedy`` replaces the
    check's own advice (to start the service) when starting it is not the fix."""

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.remedy = remedy


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    """``GET url`` (no proxy, as fulgor's own clients): the status and the JSON body (None if not JSON)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        try:
            with opener.open(
                urllib.request.Request(url, headers=headers), timeout=HTTP_TIMEOUT_SECONDS
            ) as reply:
                return reply.status, _json(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, _json(error.read())
    except http.client.HTTPException as error:  # a malformed status line, a body cut short
        said = " ".join(str(error).split())[:80]  # what it sent, on one line
        shown = f"{type(error).__name__}: {said}" if said else type(error).__name__
        raise _Unreachable(
            f"{_origin(url)} answers, but not HTTP ({shown})",
            "another program listens on that port: pass the URL the service printed when it started",
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise _Unreachable(f"nothing answers at {url} ({reason})") from None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _message(status: int, body: Any) -> str:
    """The error message of a fulgor or OpenAI-style error body, else the status."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


def _refused(name: str, status: int, body: Any, started_with: str) -> Check:
    """A 401 or 403 from a fulgor server, said as what to do about the token."""
    if status == 401:
        return Check(
            name,
            "FAIL",
            f"it needs a token ({_message(status, body)})",
            f"pass --token-file FILE or set FULGOR_TOKEN to the token {started_with} was started with",
        )
    return Check(
        name,
        "FAIL",
        f"it refused the token ({_message(status, body)})",
        f"use the token {started_with} was started with (--token-file or FULGOR_TOKEN)",
    )


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _store(url: str, token: str | None) -> Iterator[Check]:
    if url.startswith(("http://", "https://")):
        yield _store_server(url.rstrip("/"), token)
        return
    from fulgor.store.sync import open_store

    shown = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)  # never a password

    async def stats() -> Any:
        store = open_store(url, create=False)
        try:
            return await store.stats()
        finally:
            await store.close()

    try:
        counts = asyncio.run(stats())
    except FulgorError as error:  # its message says what to do
        yield Check("store", "FAIL", f"{shown}: {error.message}")
        return
    except Exception as error:  # the check's boundary: whatever the backend raised, said plainly
        detail = f"{shown}: {type(error).__name__}: {error}"
        yield Check("store", "FAIL", detail, "check the --store URL, and that the database is up")
        return
    rollouts = sum(counts.rollouts.values())
    yield Check("store", "OK", f"{shown} opens; {rollouts} rollouts, {counts.spans} spans")


def _store_server(url: str, token: str | None) -> Check:
    import fulgor
    from fulgor.store import http_api as api

    try:
        status, body = _get(f"{url}/healthz")
        if status != 200 or not isinstance(body, dict) or body.get("status") != "ok":
            return Check(
                "store",
                "FAIL",
                f"{url} answers, but not as fulgor serve (/healthz: HTTP {status})",
                "pass the URL `fulgor serve` printed",
            )
        status, stats = _get(f"{url}{api.PREFIX}/stats", token)
    except _Unreachable as error:
        return Check(
            "store",
            "FAIL",
            str(error),
            error.remedy
            or "start it: fulgor serve --store sqlite:///runs/NAME/store.sqlite (it prints its URL)",
        )
    if status in (401, 403):
        return _refused("store", status, stats, "fulgor serve")
    if status != 200 or not isinstance(stats, dict):
        return Check("store", "FAIL", f"{url}: {_message(status, stats)}", "see fulgor serve's log")
    version = body.get("version")
    note = "" if version == fulgor.__version__ else f" (this fulgor is {fulgor.__version__})"
    rollouts = sum((stats.get("rollouts") or {}).values())
    return Check("store", "OK", f"fulgor serve {version}{note} at {url}; {rollouts} rollouts")


def _gateway(url: str, token: str | None) -> Iterator[Check]:
    origin = _origin(url)
    start = "start one: fulgor gateway --store URL --upstream ENGINE_URL/v1, or fulgor serve --upstream ..."
    try:
        status, state = _get(f"{origin}/gateway/state", token)
    except _Unreachable as error:
        yield Check("gateway", "FAIL", str(error), error.remedy or start)
        return
    if status in (401, 403):
        yield _refused("gateway", status, state, "the gateway (or fulgor serve)")
        return
    if status != 200 or not isinstance(state, dict):
        yield Check(
            "gateway", "FAIL", f"{origin} answers, but serves no gateway ({_message(status, state)})", start
        )
        return
    upstreams = [str(u) for u in state.get("upstreams") or []]
    paused = " (paused: a weight swap is in progress)" if state.get("paused") else ""
    yield Check("gateway", "OK", f"{origin}{paused}; {len(upstreams)} upstream(s)")
    for upstream in upstreams:
        yield _models(
            "gateway upstream",
            upstream,
            "start the engine the gateway forwards to",
            "the upstream's API key, which the gateway sends when started with --upstream-api-key",
        )


def _engine(url: str) -> Iterator[Check]:
    base = url.rstrip("/")
    base = base if base.endswith("/v1") else f"{base}/v1"
    yield _models(
        "engine",
        base,
        "start it: fulgor engine --model DIR --port P (it prints its URL)",
        "its API key, which agents (or the gateway's --upstream-api-key) must send",
    )


def _models(name: str, base: str, start: str, key: str) -> Check:
    """Whether ``base/models`` (an OpenAI-compatible API) answers with a list of models.

    A 401 or 403 is an API that answers but wants ``key`` (a hosted one): reachable, so OK.
    """
    try:
        status, body = _get(f"{base.rstrip('/')}/models")
    except _Unreachable as error:
        return Check(name, "FAIL", str(error), error.remedy or start)
    if status in (401, 403):
        return Check(
            name, "OK", f"{base} answers, but lists its models only with {key} ({_message(status, body)})"
        )
    data = body.get("data") if isinstance(body, dict) else None
    if status != 200 or not isinstance(data, list):
        return Check(
            name,
            "FAIL",
            f"{base}/models: {_message(status, body)}",
            "pass the engine's base URL (http://HOST:PORT or http://HOST:PORT/v1)",
        )
    models = ", ".join(str(m.get("id")) for m in data if isinstance(m, dict)) or "no model"
    return Check(name, "OK", f"{base} serves {models}")


# -- a model directory -----------------------------------------------------------------------------


def _model(path: Path, chat_template: str | None) -> Iterator[Check]:
    from fulgor.weights.errors import ModelLoadError
    from fulgor.weights.loading import checkpoint_kind
    from fulgor.weights.lora import adapter_base

    try:
        kind = checkpoint_kind(path)
    except ModelLoadError as error:
        yield Check("model", "FAIL", error.message, "pass a Hugging Face model directory (with config.json)")
        return
    if kind == "lora":
        try:
            base = adapter_base(path)
        except ModelLoadError as error:
            yield Check(
                "model",
                "FAIL",
                error.message,
                "pass the base model's directory (the engine serves the base, then swaps the adapter in)",
            )
            return
        yield Check("model", "OK", f"{path} is a LoRA adapter over {base}")
        path = base
    try:
        from fulgor.weights.loading import require_transformers

        transformers = require_transformers()
    except ImportError as error:
        yield Check("model", "FAIL", f"cannot load {path}: {error}", "pip install 'fulgor[torch]'")
        return
    yield from _model_files(path, transformers, chat_template)


def _model_files(path: Path, transformers: Any, chat_template: str | None) -> Iterator[Check]:
    from fulgor.weights.errors import ModelLoadError
    from fulgor.weights.importing import describe_model

    try:
        facts = describe_model(path)
        transformers.AutoConfig.from_pretrained(path)
    except ModelLoadError as error:
        yield Check(
            "model",
            "FAIL",
            error.message,
            "pass a Hugging Face model directory, or make one with `fulgor model import SOURCE --out DIR`",
        )
        return
    except Exception as error:  # transformers raises many kinds for a bad config
        yield Check(
            "model",
            "FAIL",
            f"{path}/config.json does not load: {error}",
            "fix or replace config.json (a model's Hugging Face config)",
        )
        return
    yield Check("model", "OK", f"{path}: {facts.summary()}")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except Exception as error:  # as above
        yield Check(
            "tokenizer",
            "FAIL",
            f"does not load from {path}: {error}",
            "copy the model's tokenizer files (tokenizer.json, tokenizer_config.json) into it",
        )
        return
    yield Check("tokenizer", "OK", f"{type(tokenizer).__name__}, {len(tokenizer)} tokens")
    yield _chat_template(tokenizer, chat_template)


def _chat_template(tokenizer: Any, chat_template: str | None) -> Check:
    from fulgor.engine.chat_format import ChatFormat, read_chat_template
    from fulgor.engine.errors import EngineError
    from fulgor.errors import ConfigError

    try:
        template = read_chat_template(chat_template) if chat_template else None
    except ConfigError as error:
        return Check("chat template", "FAIL", error.message, "pass a Jinja file that parses")
    chat_format = ChatFormat.of(tokenizer, template)
    source = f"--chat-template {chat_template}" if chat_template else "the model's own template"
    try:  # chat decides the check; tools are a note on it
        chat_format.render(tokenizer, [{"role": "user", "content": "What is 2 + 3?"}], None)
    except EngineError as error:
        return Check(
            "chat template",
            "FAIL",
            error.message,
            "add a chat_template to the tokenizer files, or pass --chat-template FILE",
        )
    if not chat_format.renders_tools:
        return Check(
            "chat template",
            "OK",
            f"{source} renders chat, but {chat_format.tool_support}",
            "for agents with tools, serve it with --chat-template FILE (a tool-aware template; "
            "chatml-tools for a ChatML model) and check it here with the same option",
        )
    return Check("chat template", "OK", f"{source} renders chat; it {chat_format.tool_support}")
