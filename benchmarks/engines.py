"""fulgor's local engine against vLLM: generated tokens/s at 1, 16 and 64 concurrent requests, and
the time to publish new weights, on the same locally built models, in one run.

For each model size, builds the model and a copy with every weight moved (new weights to publish),
then, for each engine in turn (never both at once):

* serves the model over HTTP (the local engine on a thread; vLLM as its supervisor launches it,
  from the virtual environment ``make .frameworks/vllm/.installed`` builds);
* sends chat requests at concurrency 1 (8 requests one after another), 16 and 64 (that many at
  once), each generating exactly ``--max-tokens`` tokens (EOS ignored), after one warm-up request;
* publishes the moved weights and the original ones in turn, ``--publishes`` times: the local
  engine's ``swap_weights``, vLLM's in-place reload (``VLLMServer.reload_weights``); the time is
  from the call until the new weights serve.

vLLM's CPU build refuses a head size of 16 (``tiny``: it starts, then answers 500); such a row says
why instead of numbers. ``--model DIR`` measures a model directory too (a real pretrained model,
such as SmolLM2-135M-Instruct made from its GGUF file by ``fulgor model import``), served in
float32 by both engines; ``--sizes`` with no size measures that model alone.
Prints a table and ends with one ``RESULT name=value ...`` line.

    .venv/bin/python benchmarks/engines.py [--sizes tiny small] [--model DIR] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from _offline import go_offline
from fulgor.engine.app import create_app
from fulgor.engine.errors import VLLMError
from fulgor.engine.local import EngineConfig, LocalEngine
from fulgor.engine.models import init_model
from fulgor.engine.vllm import VLLMConfig, VLLMServer
from fulgor.net.asgi import ServerThread

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 16, 64)
SEQUENTIAL_REQUESTS = 8
QUESTIONS = [
    "What is 17 + 25?",
    "Name a river in a country you like.",
    "Please compute 12 times 9 and explain.",
    "Which city has the most books?",
    "Tell me about apples and oranges.",
    "What is the total cost of three items?",
    "How do you search a table for a value?",
    "Give me one number between one and ten.",
]


class NotServedError(Exception):
    """The engine answered a request with an error."""


@dataclass
class Row:
    engine: str
    size: str
    tokens_per_second: dict[int, float] = field(default_factory=dict)
    publish_seconds: list[float] = field(default_factory=list)
    startup_seconds: float | None = None
    refused: str | None = None


def moved_copy(model: Path, out: Path) -> Path:
    """``model`` with every weight moved by Gaussian noise: weights a training step could publish."""
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in weights.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    weights.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model / name).is_file():
            shutil.copy(model / name, out / name)
    return out


async def _tokens_per_second(
    url: str, model: str, concurrency: int, max_tokens: int, sequential: int = SEQUENTIAL_REQUESTS
) -> float:
    requests = sequential if concurrency == 1 else concurrency
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=max(concurrency, *CONCURRENCY))
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:

        async def one(i: int) -> int:
            content = f"{QUESTIONS[i % len(QUESTIONS)]} (request {i})"
            body = {
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
            async with semaphore:
                response = await client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                raise NotServedError(f"{response.status_code} {response.text[:300]}")
            tokens: int = response.json()["usage"]["completion_tokens"]
            return tokens

        await one(0)  # warm-up
        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(requests))))
        return tokens / (time.perf_counter() - started)


def measure_serving(
    row: Row,
    url: str,
    model: str,
    max_tokens: int,
    concurrency_levels: tuple[int, ...] = CONCURRENCY,
    sequential: int = SEQUENTIAL_REQUESTS,
) -> None:
    """Generated tokens/s at each concurrency into ``row`` (at 1: ``sequential`` requests in turn)."""
    for concurrency in concurrency_levels:
        tps = asyncio.run(_tokens_per_second(url, model, concurrency, max_tokens, sequential))
        row.tokens_per_second[concurrency] = tps
        print(f"  {row.engine} {row.size} c={concurrency}: {tps:.0f} tok/s", flush=True)


def _time_publishes(publish: Callable[[Path], object], checkpoints: list[Path], times: int) -> list[float]:
    seconds = []
    for i in range(times):
        started = time.perf_counter()
        publish(checkpoints[i % 2])
        seconds.append(time.perf_counter() - started)
    return seconds


def measure_local(size: str, model: Path, moved: Path, args: argparse.Namespace) -> Row:
    row = Row("local", size)
    started = time.perf_counter()
    engine = LocalEngine.from_config(EngineConfig(model=model, device="cpu", seed=0, admin_token="bench"))
    with ServerThread(create_app(engine)) as server:
        row.startup_seconds = time.perf_counter() - started
        measure_serving(row, server.url, engine.model_name, args.max_tokens)

        def publish(checkpoint: Path) -> None:  # over HTTP, as vLLM's reload is
            body = {"path": str(checkpoint)}
            headers = {"Authorization": "Bearer bench"}
            httpx.post(
                f"{server.url}/admin/weights", json=body, headers=headers, timeout=600
            ).raise_for_status()

        row.publish_seconds = _time_publishes(publish, [moved, model], args.publishes)
    engine.close()
    return row


def _reason(log: str, otherwise: str) -> str:
    """vLLM's own words for refusing the model (its CPU attention's), else ``otherwise``."""
    for line in reversed(log.splitlines()):
        if "Unsupported" in line:
            return line[line.index("Unsupported") :].split("'")[0].strip()[:100]
    return otherwise[:100]


def measure_vllm(size: str, model: Path, moved: Path, args: argparse.Namespace, log_dir: Path) -> Row:
    row = Row("vllm", size)
    config = VLLMConfig(
        model=model,
        port=0,
        command=(str(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server"),
        # The CPU build: its OpenMP threads unpinned (a shared machine), as many as the local engine's.
        env={
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(torch.get_num_threads()),
            "VLLM_CPU_KVCACHE_SPACE": "2",
        },
        max_model_len=1024,
        dtype="float32",
        seed=0,
        log_path=log_dir / f"vllm-{size}.log",
        startup_timeout_seconds=900,
    )
    server = VLLMServer(config)
    started = time.perf_counter()
    try:
        server.start()
    except VLLMError as error:
        row.refused = _reason(error.message, "vLLM did not start")
        server.stop()
        return row
    try:
        row.startup_seconds = time.perf_counter() - started
        measure_serving(row, server.url, server.model_name, args.max_tokens)
        row.publish_seconds = _time_publishes(server.reload_weights, [moved, model], args.publishes)
    except NotServedError as error:
        log = config.log_path.read_text(errors="replace") if config.log_path else ""
        row.refused = _reason(log, str(error))
    finally:
        server.stop()
    return row


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"\n{args.max_tokens} tokens per request, {torch.get_num_threads()} threads per engine, "
        f"{os.cpu_count()} cores; publish: median of {args.publishes}"
    )
    header = (
        f"{'engine':<6} | {'model':<8} | {'c=1 tok/s':>9} | {'c=16 tok/s':>10} | {'c=64 tok/s':>10} | "
        f"{'publish s':>9} | {'start s':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if row.refused:
            print(f"{row.engine:<6} | {row.size:<8} | not served: {row.refused}")
            continue
        tps = " | ".join(
            f"{row.tokens_per_second[c]:>{w}.0f}" for c, w in zip(CONCURRENCY, (9, 10, 10), strict=True)
        )
        print(
            f"{row.engine:<6} | {row.size:<8} | {tps} | {statistics.median(row.publish_seconds):>9.3f} | "
            f"{row.startup_seconds or 0:>7.1f}"
        )


def result_line(rows: list[Row]) -> str:
    fields = []
    for row in rows:
        prefix = f"{row.engine}_{row.size}"
        if row.refused:
            fields.append(f"{prefix}=not_served")
            continue
        fields += [f"{prefix}_c{c}_tps={row.tokens_per_second[c]:.0f}" for c in CONCURRENCY]
        fields.append(f"{prefix}_publish_s={statistics.median(row.publish_seconds):.3f}")
        fields.append(f"{prefix}_startup_s={row.startup_seconds or 0:.1f}")
    return "RESULT " + " ".join(fields)


def main() -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="*", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--model", type=Path, help="also a model directory (its name labels its rows)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--publishes", type=int, default=3)
    # One by default: on 2 cores shared with other jobs, vLLM with 2 OpenMP threads generated
    # under 1 token/s (its threads spin-wait for each other), where one thread serves normally.
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of each engine")
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".frameworks" / "vllm" / "bin" / "python")
    args = parser.parse_args()
    if not args.vllm_python.is_file():
        parser.error(f"{args.vllm_python} is missing: make .frameworks/vllm/.installed builds it")
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fulgor-bench-") as tmp:
        root = Path(tmp)
        models = [(size, init_model(root / size, size, seed=0)) for size in args.sizes]  # type: ignore[arg-type]
        if args.model is not None:
            models.append((args.model.name, args.model))
        for size, model in models:
            moved = moved_copy(model, root / f"{size}-moved")
            rows.append(measure_local(size, model, moved, args))
            rows.append(measure_vllm(size, model, moved, args, root))
    print_table(rows, args)
    print(result_line(rows))


if __name__ == "__main__":
    main()
