"""The environment the project's own tests and benchmarks run in: loopback only.

Every test, benchmark and CI run may send traffic only to loopback (127.0.0.0/8 and ::1) and look
up no name in DNS. :func:`go_offline` sets, in this process's environment (and so in every process
it starts), each library's documented switch against phoning home (Ray's node address and usage
stats, vLLM's usage stats, the Hugging Face hub, LiteLLM's model cost map, CrewAI's telemetry and
version check, W&B, the OpenAI Agents SDK's trace export) and HTTP proxies on a loopback port where
nothing listens, loopback exempt: a request a library makes to the internet on its own (Ray's
dashboard asks the cloud metadata servers at every start, usage stats on or off) is refused on
this machine, its host never looked up. Installs need the network: :func:`online` is an
environment with the proxies it had before instead, for pip.

The test session applies it in ``tests/loopback_guard.py``; each benchmark at the start of its
``main``. Nothing here imports pytest.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping

__all__ = ["LOOPBACK_NAMES", "OFFLINE_ENVIRONMENT", "go_offline", "offline_part", "online"]

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
"""The switches every test and benchmark process runs with (the proxies are added by go_offline)."""


def closed_loopback_port() -> socket.socket:
    """A loopback port bound and never listened on, held for the session: a connection to it is
    refused at once, and no other process can take it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def proxy_environment(port: int) -> dict[str, str]:
    """HTTP proxies on ``port`` of loopback for every scheme, loopback itself exempt."""
    proxy = f"http://127.0.0.1:{port}"
    names = ("http_proxy", "https_proxy", "all_proxy")
    return {
        **{name: proxy for name in names},
        **{name.upper(): proxy for name in names},
        "no_proxy": NO_PROXY,
        "NO_PROXY": NO_PROXY,
    }


_PROXIES = frozenset(proxy_environment(0))
_SAVED = "FULGOR_OFFLINE_SAVED_PROXIES"  # the proxies the environment had before go_offline, as JSON


def go_offline() -> socket.socket:
    """Set the offline environment in this process's ``os.environ``, for it and every process it
    starts; the socket holding the closed proxy port, which the caller keeps while it runs."""
    closed = closed_loopback_port()
    if _SAVED not in os.environ:
        saved = {name: value for name, value in os.environ.items() if name in _PROXIES}
        os.environ[_SAVED] = json.dumps(saved)
    os.environ.update({**OFFLINE_ENVIRONMENT, **proxy_environment(closed.getsockname()[1])})
    return closed


def online(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` with the proxies it had before :func:`go_offline` instead of the closed
    ones: for an install, which needs the network (through the user's own proxy, if any)."""
    kept = {name: value for name, value in environment.items() if name not in _PROXIES and name != _SAVED}
    return {**kept, **json.loads(environment.get(_SAVED, "{}"))}


def offline_part(environment: Mapping[str, str]) -> dict[str, str]:
    """The offline switches and proxies of ``environment``: for a process started with an
    environment of its own choosing (a few variables), so that it stays offline too."""
    names = {*OFFLINE_ENVIRONMENT, *_PROXIES}
    return {name: value for name, value in environment.items() if name in names}
