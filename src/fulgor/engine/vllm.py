"""Launching and supervising vLLM as fulgor's engine (the fast path on GPUs; vLLM's CPU build too).

``VLLMServer`` starts vLLM with the flags training needs (logprobs, token ids, Hermes tool calls,
request-controlled sampling), waits until ``/health`` answers, restarts the process when it exits or
stops answering, and reloads weights without a restart: full weights in place through vLLM's
``POST /collective_rpc`` (``reload_weights``, then ``/reset_prefix_cache`` so no prompt is served
from a cache the old weights computed), a LoRA adapter through vLLM's runtime adapter loading
(clients then use the adapter's model name, and the adapter it replaces is unloaded). Each reload
makes ``model_version`` N+1. Both admin routes exist only when vLLM runs with
``VLLM_SERVER_DEV_MODE=1`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which the supervisor
sets; they let any client that reaches the port change the weights, so vLLM listens on loopback
unless ``host`` says otherwise (its own processes then meet on loopback too, ``VLLM_HOST_IP``), and
it sends no usage stats unless the environment says ``VLLM_NO_USAGE_STATS=0``. Given ``url``, the
server is one that runs already (started with those two variables): nothing is launched or
stopped, it must list the model name clients send
(``GET /v1/models``), and it is made to serve ``model`` through its admin routes before anything
else (a checkpoint directory reloaded in place, an adapter loaded), so a resumed run's calls are
served by its newest weights whatever the server held before; reloads go to the same routes.

Clients ask for token ids per request with ``"return_token_ids": true`` (vLLM >= 0.10.2). Streamed
chat with a tool or reasoning parser (the Hermes tool parser is on here) lost the ids and logprobs
of the deltas the parser held back, so their lengths still agree (vLLM issue #27482, fixed by PR
#29074). The gateway guards every version: it compares the ids with ``usage.completion_tokens``
and flags a call whose counts differ ``token_ids_missing``, so it is never trained on. vLLM itself
is never imported here: ``command`` runs it (``vllm serve`` on PATH by default; a virtual
environment's ``python -m vllm.entrypoints.openai.api_server`` works too, and gets ``--model``).

vLLM runs in a session of its own (a terminal's Ctrl+C reaches only its supervisor, which stops it
in order), under :mod:`fulgor.engine._orphan_guard`, which stops it should the supervisor's process
end without doing so (SIGKILL, an abort): no vLLM outlives the process that started it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fulgor.engine import _orphan_guard as orphan_guard
from fulgor.engine._vllm_weights import reload_view
from fulgor.engine.chat_format import choose_parsers, model_chat_template, read_chat_template
from fulgor.engine.errors import VLLMError
from fulgor.net.sockets import bind_socket, is_loopback
from fulgor.weights.errors import ModelLoadError
from fulgor.weights.lora import AdapterSet, adapter_base, adapter_set

__all__ = ["VLLMConfig", "VLLMServer", "build_command"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VLLMConfig:
    """How to launch and supervise vLLM; also the Trainer's engine config (``Trainer(engine=...)``).

    ``model`` is the model directory vLLM serves first (and the Trainer trains from), served as
    version ``model_version``; ``device`` is where the Trainer trains its own copy of the weights
    (vLLM serves on its own device). ``url`` names a running vLLM server to use instead of
    launching one.
    """

    model: str | Path
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_model_len: int | None = None
    seed: int | None = None
    max_logprobs: int = 20
    enable_lora: bool = False
    max_lora_rank: int = 64
    max_loras: int = 1
    """Adapters vLLM keeps loaded at once: one per agent with one LoRA adapter per agent."""
    gpu_memory_utilization: float | None = None
    dtype: str | None = None
    url: str | None = None
    device: str = "auto"
    model_version: int = 0
    extra_args: tuple[str, ...] = ()
    chat_template: str | None = None
    """A Jinja file, or the name of a template fulgor ships, in place of the model's own template."""
    tool_call_parser: str | None = None
    """vLLM's ``--tool-call-parser`` (default: detected from the template, else ``hermes``)."""
    reasoning_parser: str | None = None
    """vLLM's ``--reasoning-parser`` (default: detected from the template, else none)."""
    api_key: str | None = field(default=None, repr=False)
    command: tuple[str, ...] = ("vllm", "serve")
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    startup_timeout_seconds: float = 900.0
    health_interval_seconds: float = 5.0
    unhealthy_checks_before_restart: int = 3
    max_restarts: int = 5

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).name


def build_command(config: VLLMConfig, model: str, port: int) -> list[str]:
    """The command line serving ``model`` on ``port``: ``vllm serve`` takes the model first, vLLM's
    ``api_server`` module as ``--model``."""
    where = [model] if config.command[-1] == "serve" else ["--model", model]
    command = [*config.command, *where, "--host", config.host, "--port", str(port)]
    command += ["--served-model-name", config.model_name]
    command += ["--max-logprobs", str(config.max_logprobs), "--return-tokens-as-token-ids"]
    # Sampling follows the request alone, not defaults from the model's generation_config.json.
    command += ["--generation-config", "vllm"]
    command += _chat_arguments(config, model)
    if config.max_model_len is not None:
        command += ["--max-model-len", str(config.max_model_len)]
    if config.seed is not None:
        command += ["--seed", str(config.seed)]
    if config.enable_lora:
        command += ["--enable-lora", "--max-lora-rank", str(config.max_lora_rank)]
        command += ["--max-loras", str(config.max_loras)]
    if config.gpu_memory_utilization is not None:
        command += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.dtype is not None:
        command += ["--dtype", config.dtype]
    if config.api_key:
        command += ["--api-key", config.api_key]
    return command + list(config.extra_args)


def _chat_arguments(config: VLLMConfig, model: str) -> list[str]:
    """The template and parsers, as fulgor's own engine chooses them (:mod:`fulgor.engine.chat_format`):
    named, else detected from the template; vLLM reads a template given as text."""
    template = read_chat_template(config.chat_template) if config.chat_template else None
    shown = template or model_chat_template(model)
    parser, reasoning = choose_parsers(shown, config.tool_call_parser, config.reasoning_parser)
    arguments = ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if template is not None:
        arguments += ["--chat-template", template]
    if reasoning is not None:
        arguments += ["--reasoning-parser", reasoning]
    return arguments


def _environment(config: VLLMConfig) -> dict[str, str]:
    env = {**os.environ, **config.env}
    # /collective_rpc (full weights in place) and /reset_prefix_cache exist only in dev mode.
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if config.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    # No usage report to vLLM's servers unless the user chose one (VLLM_NO_USAGE_STATS=0); vLLM
    # itself also honours DO_NOT_TRACK=1, which reaches it with the rest of the environment.
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    if is_loopback(config.host):
        # vLLM's processes meet at VLLM_HOST_IP, else at the address of the default route, where
        # they listen: a server on loopback keeps them there too.
        env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    return env


def _free_port(host: str) -> int:
    sock = bind_socket(host, 0)
    port = int(sock.getsockname()[1])
    sock.close()
    return port


class VLLMServer:
    """One supervised vLLM process: start, health checks, restart on crash, weight reloads, stop."""

    def __init__(self, config: VLLMConfig) -> None:
        self.config = config
        self.port = config.port or (0 if config.url else _free_port(config.host))
        self.model_version = config.model_version
        self.restarts = 0
        self._model = str(config.model)
        self._served_name = config.model_name
        self.adapter_names: dict[str, str] = {}
        """With one LoRA adapter per agent: the name vLLM serves each under now, by adapter name."""
        self._adapters_loaded: dict[str, str] = {}
        """The LoRA adapters loaded now (served name: path), loaded again after a restart."""
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.RLock()
        self._monitor: threading.Thread | None = None
        self._failure: str | None = None
        self._log_path = config.log_path or Path(tempfile.mkdtemp(prefix="fulgor-vllm-")) / "vllm.log"
        self._scratch: Path | None = None
        """Where reloads write what vLLM reads besides the checkpoint (:mod:`._vllm_weights`)."""
        # The orphan guard's pipe (fulgor.engine._orphan_guard): only this process holds the write
        # end, so vLLM is stopped when this process ends without stopping it. Made at the first launch.
        self._guard_pipe: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        if self.config.url:
            return self.config.url.rstrip("/")
        return f"http://{self.config.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process leading vLLM's session (its process group); None before a launch, and for a
        server given by ``url``."""
        return None if self._process is None else self._process.pid

    @property
    def model_name(self) -> str:
        """The model name clients send; a LoRA reload changes it to the adapter's name."""
        return self._served_name

    @property
    def failure(self) -> str | None:
        """Why supervision gave up, once it has."""
        return self._failure

    def start(self) -> str:
        """Launch vLLM and wait until it is healthy; returns its base URL. A LoRA adapter as
        ``model`` launches its base and loads the adapter as version ``model_version`` (a resumed
        run's newest checkpoint). Given ``url``, attaches to the running server instead
        (:meth:`_attach`)."""
        if self.config.url:
            self._attach()
            return self.url
        adapter = Path(self._model)
        if (adapter / "adapter_config.json").is_file():
            try:
                self._model = str(adapter_base(adapter))
            except ModelLoadError as exc:
                raise VLLMError(exc.message) from exc
        with self._lock:
            self._launch()
            self._wait_healthy()
            if str(adapter) != self._model:
                try:
                    self._load_adapter(adapter, self.model_version)
                except VLLMError:
                    self._terminate()
                    raise
        self._monitor = threading.Thread(target=self._supervise, name="fulgor-vllm-supervisor", daemon=True)
        self._monitor.start()
        return self.url

    def _attach(self) -> None:
        """The server at ``url`` answers, serves the model name clients send, and then serves
        ``model`` as version ``model_version``: a checkpoint directory is reloaded in place, an
        adapter loaded under its version's name; a name that is no directory (a model vLLM was
        started with by name) is taken as what the server serves."""
        if not self.healthy():
            raise VLLMError(
                f"no vLLM answers at {self.url}/health; start it (with VLLM_SERVER_DEV_MODE=1 for "
                "weight reloads) or fix VLLMConfig(url=...)"
            )
        served = self.served_models()
        if self.config.model_name not in served:
            raise VLLMError(
                f"the vLLM at {self.url} serves {', '.join(served) or 'no model'}, not "
                f"{self.config.model_name!r}, the name the agent's calls will ask for: set "
                "VLLMConfig(served_model_name=...) to the --served-model-name it was started with"
            )
        source = Path(self._model)
        with self._lock:
            if (source / "adapter_config.json").is_file():
                self._load_adapter(source, self.model_version)
            elif (source / "config.json").is_file():
                self._reload_in_place(source)
        logger.info("vLLM at %s serves %s as version %d", self.url, self._model, self.model_version)

    def served_models(self) -> list[str]:
        """The model names the server lists (``GET /v1/models``): its own and its loaded adapters'."""
        request = urllib.request.Request(f"{self.url}/v1/models", headers=self._auth_header())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                listed = json.load(response)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise VLLMError(f"cannot list the models at {self.url}/v1/models: {exc}") from exc
        return [str(model.get("id")) for model in listed.get("data", []) if isinstance(model, dict)]

    def _launch(self) -> None:
        command = build_command(self.config, self._model, self.port)
        if shutil.which(command[0]) is None:
            raise VLLMError(
                f"cannot run {command[0]!r}: install vLLM (pip install 'fulgor[vllm]') on this machine"
            )
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting vLLM: %s (log: %s)", " ".join(command), self._log_path)
        if self._guard_pipe is None:
            self._guard_pipe = os.pipe()
        guard_read = self._guard_pipe[0]
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(
                orphan_guard.command_line(guard_read, command),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_environment(self.config),
                pass_fds=(guard_read,),
                start_new_session=True,
            )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def healthy(self) -> bool:
        """True when vLLM answers ``GET /health`` with 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_seconds
        process = self._process
        assert process is not None
        # vLLM offers no readiness signal other than its health endpoint.
        while not self.healthy():
            if process.poll() is not None:
                raise VLLMError(
                    f"vLLM exited with code {process.returncode} while starting:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self._terminate()
                limit = self.config.startup_timeout_seconds
                raise VLLMError(f"vLLM was not healthy after {limit:.0f} s:\n{self._log_tail()}")
            time.sleep(0.5)
        logger.info("vLLM serves %s at %s", self._model, self.url)

    def _supervise(self) -> None:
        failed_checks = 0
        while not self._stopping.is_set():
            process = self._process
            assert process is not None
            try:
                code: int | None = process.wait(timeout=self.config.health_interval_seconds)
            except subprocess.TimeoutExpired:
                failed_checks = 0 if self.healthy() else failed_checks + 1
                if failed_checks < self.config.unhealthy_checks_before_restart:
                    continue
                logger.warning("vLLM failed %d health checks in a row; restarting it", failed_checks)
                with self._lock:
                    if self._process is process:
                        self._terminate()
                code = None
            failed_checks = 0
            if not self._restart_after_exit(process, code):
                break
        self._stopped.set()

    def _restart_after_exit(self, process: subprocess.Popen[bytes], code: int | None) -> bool:
        """Relaunch after ``process`` ended; False when supervision should end."""
        with self._lock:
            if self._stopping.is_set():
                return False
            if self.restarts >= self.config.max_restarts:
                self._failure = (
                    f"vLLM stopped (exit code {code}) and was restarted {self.restarts} times already"
                )
                logger.error("%s; giving up:\n%s", self._failure, self._log_tail())
                return False
            self.restarts += 1
            logger.warning("vLLM exited with code %s; restart %d", code, self.restarts)
            try:
                self._launch()
                self._wait_healthy()
                for name, source in self._adapters_loaded.items():
                    self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": source})
            except VLLMError as exc:
                logger.error("restarting vLLM failed: %s", exc.message)
            return True

    def _post(self, path: str, payload: dict[str, object]) -> None:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", **self._auth_header()},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=600):
                return
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise VLLMError(f"vLLM refused {path} ({exc.code}): {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise VLLMError(f"cannot reach vLLM at {self.url}{path}: {exc}") from exc

    def _auth_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    def reload_weights(self, path: str | Path) -> int:
        """Serve the checkpoint at ``path`` as version N+1; returns the new version.

        A LoRA adapter (a directory with ``adapter_config.json``) loads at runtime and clients use
        :attr:`model_name` afterwards; one adapter per agent (a directory with ``adapters.json``)
        loads each at runtime, under the names :attr:`adapter_names` gives; full weights load in
        place (a restart after a crash starts on them). Pause traffic first (the gateway drains
        before it reloads): a call running across the reload may see both versions.
        """
        source = Path(path)
        with self._lock:
            adapters = adapter_set(source)
            if adapters is not None:
                self._load_adapters(adapters)
            elif (source / "adapter_config.json").is_file():
                self._load_adapter(source, self.model_version + 1)
            elif (source / "config.json").is_file():
                self._reload_in_place(source)
            else:
                raise VLLMError(f"no checkpoint at {source}: expected config.json or adapter_config.json")
            self.model_version += 1
            logger.info("vLLM now serves version %d from %s", self.model_version, source)
            return self.model_version

    def _load_adapter(self, source: Path, version: int) -> None:
        if not self.config.enable_lora:
            raise VLLMError("LoRA adapters need VLLMConfig(enable_lora=True)")
        name = f"{self.config.model_name}-v{version}"
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(source)})
        self._unload_adapters()
        self._adapters_loaded[name] = str(source)
        self._served_name = name

    def _unload_adapters(self) -> None:
        """Unload the adapters the ones just loaded replace (vLLM would keep them in memory)."""
        for name in list(self._adapters_loaded):
            self._post("/v1/unload_lora_adapter", {"lora_name": name})
            del self._adapters_loaded[name]

    def _load_adapters(self, adapters: AdapterSet) -> None:
        """One adapter per agent: each loads under ``MODEL-NAME-vN`` (vLLM keeps an adapter's name
        for its first weights), which :attr:`adapter_names` gives the gateway's ``agent_models``."""
        if not self.config.enable_lora or self.config.max_loras < len(adapters.adapters):
            raise VLLMError(
                f"{len(adapters.adapters)} adapters need VLLMConfig(enable_lora=True, "
                f"max_loras={len(adapters.adapters)}) or more"
            )
        names = {}
        for name, source in adapters.adapters.items():
            names[name] = f"{self.config.model_name}-{name}-v{self.model_version + 1}"
            self._post("/v1/load_lora_adapter", {"lora_name": names[name], "lora_path": str(source)})
        self._unload_adapters()
        self._adapters_loaded = {names[name]: str(source) for name, source in adapters.adapters.items()}
        self.adapter_names = names

    def _reload_in_place(self, source: Path) -> None:
        """Load full weights into the running vLLM, then drop the prefix cache the old ones filled."""
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="fulgor-vllm-weights-"))
        try:
            weights = reload_view(source, self._scratch / "weights")
        except (OSError, ValueError, KeyError) as exc:
            raise VLLMError(f"cannot read the checkpoint at {source}: {exc}") from exc
        self._post(
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(weights.resolve())}},
        )
        self._post("/reset_prefix_cache", {})
        self._model = str(source)  # a restart after a crash starts on these weights
        self._unload_adapters()
        self._served_name = self.config.model_name

    def _terminate(self, timeout_seconds: float = 30.0) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    @property
    def running(self) -> bool:
        """Whether supervision goes on (until ``stop()`` or too many restarts)."""
        return not self._stopped.is_set()

    def wait(self) -> None:
        """Block until supervision ends (``stop()`` or too many restarts)."""
        while not self._stopped.wait(timeout=0.5):
            pass

    def stop(self) -> None:
        """Stop vLLM and its supervision (a server given by ``url`` is left running)."""
        self._stopping.set()
        with self._lock:
            self._terminate()
        if self._monitor is not None:
            self._monitor.join()
        if self._guard_pipe is not None:
            for fd in self._guard_pipe:
                os.close(fd)
            self._guard_pipe = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self._stopped.set()

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
