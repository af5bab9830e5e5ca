"""Local engine throughput: generated tokens/s at concurrency 1 and 16, beside plain ``generate()``.

For each model size, builds the model locally, then times on the same 16 chat prompts:

* ``generate()``: plain sequential ``transformers`` generation, one prompt at a time;
* the engine at concurrency 1: the 16 requests over HTTP, one after another;
* the engine at concurrency 16: the 16 requests over HTTP at once (batched by the engine).

Every request generates exactly ``--max-tokens`` tokens (EOS ignored), so the token counts match.
Prints a table and ends with one ``RESULT name=value ...`` line. Target: concurrency 16 reaches at
least 3x the tokens/s of concurrency 1 and of sequential ``generate()``.

    .venv/bin/python benchmarks/engine.py [--max-tokens 64] [--sizes tiny small] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from _offline import go_offline
from fulgor.engine.app import create_app
from fulgor.engine.local import EngineConfig, LocalEngine
from fulgor.engine.models import init_model
from fulgor.net.asgi import ServerThread

TARGET_SPEEDUP = 3.0
REQUESTS = 16
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


@dataclass
class Row:
    size: str
    generate_tps: float
    engine_c1_tps: float
    engine_c16_tps: float

    @property
    def speedup_vs_c1(self) -> float:
        return self.engine_c16_tps / self.engine_c1_tps

    @property
    def speedup_vs_generate(self) -> float:
        return self.engine_c16_tps / self.generate_tps


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (request {i})"}]


def time_generate(engine: LocalEngine, max_tokens: int) -> float:
    """Tokens/s of plain sequential ``model.generate()`` on the benchmark prompts."""
    model, tokenizer = engine.model.model, engine.tokenizer
    prompts = [
        tokenizer.apply_chat_template(
            _messages(i), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        for i in range(REQUESTS)
    ]
    options: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "min_new_tokens": max_tokens,
        "do_sample": True,
        "pad_token_id": engine.model.pad_token_id,
    }
    with torch.inference_mode():
        model.generate(**prompts[0], **options)  # warm-up
        started = time.perf_counter()
        tokens = 0
        for prompt in prompts:
            output = model.generate(**prompt, **options)
            tokens += output.shape[1] - prompt["input_ids"].shape[1]
    return tokens / (time.perf_counter() - started)


async def _requests(url: str, model: str, concurrency: int, max_tokens: int) -> float:
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(i: int) -> int:
            body = {"model": model, "messages": _messages(i), "max_tokens": max_tokens, "ignore_eos": True}
            async with semaphore:
                response = await client.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            tokens: int = response.json()["usage"]["completion_tokens"]
            return tokens

        await one(0)  # warm-up
        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(REQUESTS))))
        return tokens / (time.perf_counter() - started)


def measure(size: str, root: Path, max_tokens: int) -> Row:
    model_dir = init_model(root / size, size, seed=0)  # type: ignore[arg-type]
    engine = LocalEngine.from_config(EngineConfig(model=model_dir, device="cpu", seed=0))
    generate_tps = time_generate(engine, max_tokens)
    with ServerThread(create_app(engine)) as server:
        c1 = asyncio.run(_requests(server.url, engine.model_name, 1, max_tokens))
        c16 = asyncio.run(_requests(server.url, engine.model_name, REQUESTS, max_tokens))
    return Row(size, generate_tps, c1, c16)


def print_table(rows: list[Row], max_tokens: int) -> None:
    threads = torch.get_num_threads()
    print(f"\nlocal engine, {REQUESTS} chat requests x {max_tokens} tokens, torch threads {threads}")
    header = (
        f"{'model':<6} | {'generate() seq tok/s':>20} | {'engine c=1 tok/s':>16} | "
        f"{'engine c=16 tok/s':>17} | {'c16/c1':>6} | {'c16/generate':>12}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row.size:<6} | {row.generate_tps:>20.0f} | {row.engine_c1_tps:>16.0f} | "
            f"{row.engine_c16_tps:>17.0f} | {row.speedup_vs_c1:>5.1f}x | {row.speedup_vs_generate:>11.1f}x"
        )


def result_line(rows: list[Row]) -> str:
    fields = []
    for row in rows:
        fields += [
            f"{row.size}_generate_tps={row.generate_tps:.0f}",
            f"{row.size}_engine_c1_tps={row.engine_c1_tps:.0f}",
            f"{row.size}_engine_c16_tps={row.engine_c16_tps:.0f}",
            f"{row.size}_c16_vs_c1={row.speedup_vs_c1:.2f}",
            f"{row.size}_c16_vs_generate={row.speedup_vs_generate:.2f}",
        ]
    met = all(min(r.speedup_vs_c1, r.speedup_vs_generate) >= TARGET_SPEEDUP for r in rows)
    fields.append(f"target_met={str(met).lower()}")
    return "RESULT " + " ".join(fields)


def main() -> None:
    go_offline()  # loopback only, for this run and every process it starts
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="fulgor-bench-") as root:
        rows = [measure(size, Path(root), args.max_tokens) for size in args.sizes]
    print_table(rows, args.max_tokens)
    print(result_line(rows))


if __name__ == "__main__":
    main()
