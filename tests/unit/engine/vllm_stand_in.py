"""A stand-in for ``vllm serve`` in supervision tests: same command line, same health endpoint.

Run as ``python vllm_stand_in.py serve MODEL --port P ...``. It appends one JSON line per launch
and per admin call to the file named by ``STAND_IN_LOG``, answers ``GET /health`` and ``GET
/v1/models`` (its served model name and the adapters loaded), accepts
``POST /v1/load_lora_adapter``, ``/v1/unload_lora_adapter`` and, with ``VLLM_SERVER_DEV_MODE=1``
only, ``/collective_rpc`` and ``/reset_prefix_cache``, and exits with code 3 on ``POST /crash``. With
``STAND_IN_FAIL_START=1`` it exits at once with code 2, like a vLLM that cannot load its model.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _log(entry: dict[str, object]) -> None:
    with open(os.environ["STAND_IN_LOG"], "a") as log:
        log.write(json.dumps(entry) + "\n")


_SERVED = ""  # the --served-model-name, listed by GET /v1/models with the adapters loaded
_ADAPTERS: list[str] = []

# Routes vLLM serves only with VLLM_SERVER_DEV_MODE=1 (404 without, as vLLM answers).
_DEV_ROUTES = ("/collective_rpc", "/reset_prefix_cache")


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return

    def _reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, {})
        elif self.path == "/v1/models":
            names = [_SERVED, *_ADAPTERS]
            self._reply(200, {"object": "list", "data": [{"id": name, "object": "model"} for name in names]})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/crash":
            self._reply(200, {})
            threading.Thread(target=os._exit, args=(3,)).start()
        elif self.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            if self.path == "/v1/load_lora_adapter":
                _ADAPTERS.append(body["lora_name"])
            elif body["lora_name"] in _ADAPTERS:
                _ADAPTERS.remove(body["lora_name"])
            _log(
                {
                    "event": self.path.rsplit("/", 1)[-1],
                    "body": body,
                    "env": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
                }
            )
            self._reply(200, {})
        elif self.path in _DEV_ROUTES and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            _log({"event": self.path.strip("/"), "body": body})
            self._reply(200, {"results": [None]} if self.path == "/collective_rpc" else {})
        else:
            self._reply(404, {"error": "not found"})


def main(argv: list[str]) -> int:
    global _SERVED
    telling = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_HOST_IP")  # what keeps vLLM to itself
    _log({"event": "launch", "argv": argv, "env": {name: os.environ.get(name) for name in telling}})
    _SERVED = argv[argv.index("--served-model-name") + 1]
    if os.environ.get("STAND_IN_FAIL_START") == "1":
        print("cannot load the model", file=sys.stderr)
        return 2
    port = int(argv[argv.index("--port") + 1])
    host = argv[argv.index("--host") + 1]
    ThreadingHTTPServer((host, port), _Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
