"""``fulgor engine``: serve a local model over the OpenAI API, on fulgor's engine or on vLLM."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fulgor.cli._options import add_chat_arguments, port_number
from fulgor.cli._stopping import StopRequests
from fulgor.errors import ConfigError, FulgorError

__all__ = ["register"]

logger = logging.getLogger(__name__)

ADMIN_TOKEN_ENV = "FULGOR_ENGINE_ADMIN_TOKEN"
# Flags only fulgor's own engine uses; their default is None so that --backend vllm can refuse them.
LOCAL_ONLY_FLAGS = ("admin_token_file", "device", "dtype", "threads", "max_batch_size")


def _admin_token(args: argparse.Namespace) -> str | None:
    if args.admin_token_file:
        token = Path(args.admin_token_file).read_text().strip()
        if not token:
            raise ValueError(f"the admin token file {args.admin_token_file} is empty")
        return token
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def _serve_local(args: argparse.Namespace, stopping: StopRequests) -> int:
    if args.vllm_arg:
        raise ConfigError("--vllm-arg only applies to --backend vllm; drop it, or add --backend vllm")
    from fulgor.weights.loading import require_torch

    torch = require_torch()  # its ImportError names the extra to install

    from fulgor.engine.app import create_app
    from fulgor.engine.local import EngineConfig, LocalEngine
    from fulgor.net.asgi import ServerThread
    from fulgor.net.sockets import bind_socket

    admin_token = _admin_token(args)
    sock = bind_socket(args.host, args.port)  # fail on a taken port before loading the model
    if args.threads:
        torch.set_num_threads(args.threads)
    # Flags left out keep EngineConfig's defaults (None marks them unset, see _serve_vllm).
    options = {name: getattr(args, name) for name in ("device", "dtype", "max_batch_size")}
    config = EngineConfig(
        model=Path(args.model),
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        seed=args.seed,
        model_version=args.model_version,
        admin_token=admin_token,
        chat_template=args.chat_template,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        **{name: value for name, value in options.items() if value is not None},
    )
    try:
        engine = LocalEngine.from_config(config)
    except BaseException:
        sock.close()
        raise
    server = ServerThread(create_app(engine), sock=sock)

    def stop() -> None:
        # The generation first: requests in flight end now (a stream with an error event, a whole
        # answer with 503) rather than generating on while the server waits for them to finish.
        engine.close()
        server.stop()
        if server.running:
            logger.error("the server did not stop within its timeout")
        else:
            logger.info("stopped: the server is closed and the generation thread has ended")

    _run_until_stopped(server.start, lambda: server.running, stop, stopping)
    return 0


def _serve_vllm(args: argparse.Namespace, stopping: StopRequests) -> int:
    from fulgor.engine.vllm import VLLMConfig, VLLMServer

    given = [f"--{name.replace('_', '-')}" for name in LOCAL_ONLY_FLAGS if getattr(args, name) is not None]
    if given:
        raise ConfigError(
            f"{', '.join(given)} only apply to --backend local; drop them, and pass vLLM's own flags "
            "with --vllm-arg=--FLAG (repeatable)"
        )
    config = VLLMConfig(
        model=args.model,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        seed=args.seed,
        extra_args=tuple(args.vllm_arg),
        chat_template=args.chat_template,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
    )
    server = VLLMServer(config)
    _run_until_stopped(server.start, lambda: server.running, server.stop, stopping)
    return 0


def _run_until_stopped(
    start: Callable[[], str], running: Callable[[], bool], stop: Callable[[], None], stopping: StopRequests
) -> None:
    """Start, print the URL, serve until a stop is requested or the server ends; stop in every case,
    even when the request comes while starting (vLLM runs in a session of its own, so the
    terminal's Ctrl+C never reaches it)."""
    try:
        url = start()
        stopping.serving()
        print(url, flush=True)
        stopping.wait(running)
    except KeyboardInterrupt:
        pass  # a request while starting: StopRequests logged it
    finally:
        stop()


def _engine(args: argparse.Namespace) -> int:
    # Installed before anything loads: SIGINT or SIGTERM at any moment is a clean stop and status 0.
    with StopRequests(args.parent_fd) as stopping:
        try:
            if args.backend == "vllm":
                return _serve_vllm(args, stopping)
            return _serve_local(args, stopping)
        except KeyboardInterrupt:
            logger.info("stopped before serving")
            return 0
        except (FulgorError, ValueError, OSError, ImportError) as exc:
            print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
            return 1


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "engine",
        help="serve a model over the OpenAI API with token ids and logprobs",
        description="Serve a Hugging Face model directory at /v1/chat/completions, /v1/completions and "
        "/v1/models. Prints http://HOST:PORT once it serves.",
    )
    parser.add_argument(
        "--model", required=True, help="Hugging Face model directory (or a LoRA adapter directory)"
    )
    parser.add_argument(
        "--backend", choices=("local", "vllm"), default="local", help="fulgor's engine or vLLM"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8000, help="0 picks a free port")
    parser.add_argument("--served-model-name", help="model name clients send (default: the directory name)")
    parser.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    parser.add_argument(
        "--dtype", help="auto (default: float32 on CPU, bfloat16 on GPU), float32, bfloat16 or float16"
    )
    parser.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    parser.add_argument("--max-batch-size", type=int, help="sequences decoded together (default 64)")
    parser.add_argument("--seed", type=int, help="seed for requests that bring none")
    add_chat_arguments(parser)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--model-version", type=int, default=0, help="version number of the initial weights")
    parser.add_argument(
        "--admin-token-file",
        help=f"file holding the token for POST /admin/weights (or set {ADMIN_TOKEN_ENV}); without one, "
        "weight swaps are disabled",
    )
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="extra argument for `vllm serve` (repeatable)"
    )
    parser.add_argument(
        "--parent-fd",
        type=int,
        metavar="FD",
        help="the read end of a pipe whose write end only the parent holds: the engine stops when "
        "it reads end-of-file (the parent is gone, however it ended)",
    )
    parser.set_defaults(handler=_engine)
