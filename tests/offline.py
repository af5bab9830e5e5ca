"""The environment the project's own tests and benchmarks run in: loopback only.

Every test, benchmark and CI run may send traffic only to loopback (127.0.0.0/8 and ::1) and look
up no name in DNS. :func:`go_offline` sets, in this process's environment (and so in every process
it starts), each library's documented switch against phoning home (Ray's node address and usage
stats, vLLM's usage stats, the Hugging Face hub, LiteLLM's model cost map, CrewAI's telemetry and
version check, W&B, the OpenAI Agents SDK's trace export).

One thing has no switch: Ray's dashboard process asks the cloud metadata servers which cloud it runs
on at every start, usage stats on or off. :func:`closed_proxies` sets HTTP proxies on a loopback
port where nothing listens, loopback exempt, for the processes started meanwhile (the tests that
start Ray take it as the ``ray_offline`` fixture): the probe is refused on this machine, its host
never looked up. Only there: every HTTP client made under proxies costs more (httpx builds a
transport per proxy), which slows agents that make a client per call.

The test session applies :func:`go_offline` in ``tests/loopback_guard.py``; each benchmark at the
start of its ``main``. Nothing here imports pytest.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping

__all__ = ["LOOPBACK_NAMES", "OFFLINE_ENVIRONMENT", "closed_proxies", "go_offline", "offline_part"]

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
"""Names that resolve from /etc/hosts to loopback, never through DNS."""

NO_PROXY = "localhost,127.0.0.1,127.0.0.2,::1"
"""Where clients go without the closed proxy: every loopback address a test uses (httpx matches
addresses exactly, not by network)."""

OFFLINE_ENVIRONMENT = {
    # Ray: its switch that makes the node address loopback (Ray's processes otherwise take the
    # address of the default route, and listen on every address), and no usage report.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # vLLM's usage stats (vllm/usage/usage_lib.py), and every tool that honours DO_NOT_TRACK.
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # The Hugging Face hub (transformers, tokenizers, datasets, huggingface_hub).
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # LiteLLM fetches its model cost map at import unless told to use the copy it ships, and other
    # catalogs and tokenizers unless in offline mode.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    # CrewAI's telemetry, trace upload and PyPI version check; Chroma's (which CrewAI's memory
    # brings) telemetry.
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
    "ANONYMIZED_TELEMETRY": "false",
    # W&B never syncs.
    "WANDB_MODE": "offline",
    # The OpenAI Agents SDK exports its traces to OpenAI's servers unless this is set.
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
}
"""The switches every test and benchmark process runs with."""


def go_offline() -> None:
    """Set the offline switches in this process's ``os.environ``, for it and every process it starts."""
    os.environ.update(OFFLINE_ENVIRONMENT)


def offline_part(environment: Mapping[str, str]) -> dict[str, str]:
    """The offline switches of ``environment``: for a process started with an environment of its
    own choosing (a few variables), so that it stays offline too."""
    return {name: value for name, value in environment.items() if name in OFFLINE_ENVIRONMENT}


@contextlib.contextmanager
def closed_proxies() -> Iterator[None]:
    """HTTP proxies for every scheme on a loopback port bound and never listened on (a connection
    there is refused at once, and no other process can take the port), loopback exempt, in
    ``os.environ`` while the block runs; the environment as it was after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
        names = ("http_proxy", "https_proxy", "all_proxy")
        proxies = {
            **{name: proxy for name in names},
            **{name.upper(): proxy for name in names},
            "no_proxy": NO_PROXY,
            "NO_PROXY": NO_PROXY,
        }
        before = {name: os.environ.get(name) for name in proxies}
        os.environ.update(proxies)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
