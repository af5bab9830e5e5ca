"""Entry point of the trainer's runner processes: ``python -m fulgor.training._pool SPEC URL CONFIG FD``.

Runs a :class:`~fulgor.runner.pool.RunnerPool` in a fresh interpreter (never a fork or spawn of the
trainer, which would re-run the user's script), with the trainer's :class:`RunnerConfig` given as
JSON, so every setting (claim long-poll, heartbeat, grace period) reaches the runners. ``FD`` is the
read end of a pipe whose write end only the trainer holds: when it reads end-of-file the trainer
is gone, however it ended, and the pool stops its runners at once (nobody is left to take their
rollouts' outcomes, or to wait for them) and exits instead of outliving it.

``python -m fulgor.training._pool --check SPEC`` loads the agent and prints fulgor's version: what
the trainer asks of a runner Python other than its own before starting the pool on it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading

from fulgor.runner.pool import PoolConfig, RunnerPool
from fulgor.runner.worker import RunnerConfig

__all__ = ["CHECK", "command_line", "main"]

logger = logging.getLogger(__name__)

CHECK = "--check"


def command_line(
    spec: str, store_url: str, config: PoolConfig, parent_fd: int, python: str = sys.executable
) -> list[str]:
    """The command that runs ``config.n_runners`` runners of ``spec`` against ``store_url`` on
    ``python``."""
    # The operator key stays off the command line (``ps`` shows it): ProcessRunners passes it as
    # $FULGOR_TOKEN, which the runners fall back to.
    runner = dataclasses.replace(config.runner, operator_key=None)
    settings = {"n_runners": config.n_runners, "runner": dataclasses.asdict(runner)}
    return [python, "-m", __name__, spec, store_url, json.dumps(settings), str(parent_fd)]


def main(argv: list[str]) -> int:
    if argv[:1] == [CHECK]:
        return _check(argv[1])
    spec, store_url, settings, parent_fd = argv
    options = json.loads(settings)
    config = PoolConfig(n_runners=options["n_runners"], runner=RunnerConfig(**options["runner"]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pool %(levelname)s %(name)s: %(message)s")
    pool = RunnerPool(spec, store_url, config)
    watcher = threading.Thread(target=_stop_when_parent_exits, args=(int(parent_fd), pool), daemon=True)
    watcher.start()
    return pool.run()


def _check(spec: str) -> int:
    """Load the agent as a runner would; print fulgor's version, or the error (exit status 2)."""
    from fulgor.errors import ConfigError
    from fulgor.runner.pool import load_agent
    from fulgor.version import __version__

    try:
        load_agent(spec)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    print(__version__)
    return 0


def _stop_when_parent_exits(fd: int, pool: RunnerPool) -> None:
    while os.read(fd, 4096):
        pass
    logger.warning("the runner pool's parent process is gone; stopping its runners now")
    pool.stop_now()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
