"""A training run for the Ctrl+C tests: ``Trainer.fit`` on an agent that hangs, interrupted by the test.

Run as ``python -c "from tests.integration.interrupted_fit import main; main()" MODEL RUN_DIR
MARKERS cooperative|stubborn GRACE_SECONDS``. When ``fit`` raises KeyboardInterrupt, it prints one
line, ``left when fit raised: {"processes": [...], "listening": [...]}``: the command lines of the
processes still running below it and the service URLs still accepting connections at that
moment, then exits 130.

The agent, :func:`hangs`, makes one model call, writes ``<rollout id>.running`` (its process id)
into ``task["markers"]`` and hangs; asked to stop (its task cancelled), it writes
``<rollout id>.stopping``. A stubborn one ignores that request, and every later one, and hangs on:
only the runner pool stopping now (it kills what does not end) ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from openai import AsyncOpenAI
from tests.process_support import command_line, descendants

from fulgor import GRPO, LLM, Trainer, rollout, semconv
from fulgor.engine.local import EngineConfig
from fulgor.store import SqliteStore
from fulgor.types import AttemptedRollout, ModelCall

REPORT = "left when fit raised: "
PROMPTS = ("Say a word.", "Name a colour.")


@rollout
async def hangs(task: dict[str, Any], llm: LLM, rollout: AttemptedRollout) -> float:
    markers = Path(task["markers"])
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "fulgor", max_retries=0)
    try:
        await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": task["prompt"]}],
            **llm.sampling_parameters,
        )
    finally:
        await client.close()
    (markers / f"{rollout.rollout_id}.running").write_text(str(os.getpid()))
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        (markers / f"{rollout.rollout_id}.stopping").write_text(str(os.getpid()))
        if not task["stubborn"]:
            raise
    while True:  # stubborn: every later request to stop is ignored too; only a kill ends it
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(600)


def main() -> None:
    model_dir, run_dir, markers, kind, grace_seconds = sys.argv[1:]
    trainer = Trainer(
        algorithm=GRPO(group_size=2, batch_tasks=2, max_steps=2, max_tokens=8, val_before_training=False),
        engine=EngineConfig(model=Path(model_dir), device="cpu", max_model_len=256, seed=0),
        run_dir=run_dir,
        n_runners=2,
        max_concurrency=2,
        torch_threads=1,
        progress=False,
    )
    trainer.runner_config = dataclasses.replace(
        trainer.runner_config, shutdown_grace_seconds=float(grace_seconds)
    )
    tasks = [{"prompt": prompt, "markers": markers, "stubborn": kind == "stubborn"} for prompt in PROMPTS]
    try:
        trainer.fit(hangs, tasks)
    except KeyboardInterrupt:
        print(REPORT + json.dumps(what_is_left(Path(run_dir))), flush=True)
        sys.exit(130)
    sys.exit("fit returned, though its agent never finishes a rollout")


def what_is_left(run_dir: Path) -> dict[str, list[str]]:
    """Processes below this one, and the run's service URLs that still accept connections."""
    processes = sorted(command_line(pid) or f"pid {pid}" for pid in descendants(os.getpid()))
    return {"processes": processes, "listening": [url for url in service_urls(run_dir) if accepts(url)]}


def service_urls(run_dir: Path) -> list[str]:
    """The store server and gateway (the LLM resource's endpoint) and every engine a call went to."""

    async def read() -> list[str]:
        store = SqliteStore(run_dir / "store.sqlite")
        try:
            latest = await store.get_resources()
            llm = None if latest is None else latest.resources["llm"]
            urls = [llm.endpoint] if isinstance(llm, LLM) else []
            for each in await store.query_rollouts():
                for span in await store.query_spans(each.rollout_id, name=semconv.SPAN_MODEL_CALL):
                    call = ModelCall.model_validate(span.attributes[semconv.ATTR_MODEL_CALL])
                    urls += [call.engine_replica] if call.engine_replica else []
        finally:
            await store.close()
        return sorted(set(urls))

    return asyncio.run(read())


def accepts(url: str) -> bool:
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "", parts.port or 0), timeout=1).close()
    except OSError:
        return False
    return True
