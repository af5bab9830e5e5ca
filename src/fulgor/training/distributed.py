"""The policy update across processes: N ranks under torchrun, one of them the trainer.

Rank 0 is the :class:`~fulgor.training.Trainer` as on one process: it runs the services (store,
gateway, engine, runners) and the rollouts, and leads the update. The other ranks start no server:
they take part in the update only (:func:`follow`). Rank 0 sends them each command over
``torch.distributed`` (an object broadcast), and every rank then runs it together:

- ``load``: every rank loads the weights to start from, shards them with FSDP2
  (:func:`torch.distributed.fsdp.fully_shard`, each decoder layer and the model), and builds the
  GRPO :class:`~fulgor.algorithms.grpo.update.PolicyUpdater` with its
  :class:`~fulgor.algorithms.grpo.update.RowShare`; a resumed run loads the optimiser state too.
- ``step``: the trajectories rank 0 selected; each rank trains its share of their rows, FSDP sums
  the gradients, and the optimiser steps on each rank's shard of the weights.
- ``save``: a checkpoint directory being written: the full weights are gathered on rank 0, which
  writes them as a model directory (what the engine loads), and every rank writes its shard of the
  optimiser state into ``optimizer/`` (``torch.distributed.checkpoint``).
- ``stop``: the run is over.

The backend is gloo on the CPU and NCCL on CUDA GPUs (rank r on ``cuda:LOCAL_RANK``). Ranks on
one machine that ``fulgor train --nproc`` starts (:func:`local_torchrun`) meet without the network:
torchrun's rendezvous and the ranks' process group go through files of a folder
(:class:`torch.distributed.FileStore`), not a TCP store, which listens on every address, and gloo
connects the ranks over the loopback interface (NCCL picks its own, ``NCCL_SOCKET_IFNAME``).

What it does not know: rollouts, services or when to step (the trainer on rank 0 decides).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulgor.adapters.trajectory import Trajectory
from fulgor.errors import ConfigError
from fulgor.training.checkpoints import OPTIMIZER_DIR
from fulgor.weights.loading import no_progress_bars
from fulgor.weights.policy import Policy, load_policy, load_training_state

if TYPE_CHECKING:
    from fulgor.algorithms.base import Algorithm
    from fulgor.algorithms.grpo import GRPO
    from fulgor.algorithms.grpo.update import PolicyUpdater
    from fulgor.engine.local import EngineConfig
    from fulgor.engine.vllm import VLLMConfig

__all__ = [
    "OPTIMIZER_DIR",
    "RANKS_STORE_ENV",
    "Ranks",
    "ShardedUpdater",
    "World",
    "check_shardable",
    "fit_on_ranks",
    "follow",
    "load_optimizer_shards",
    "local_torchrun",
    "process_group",
    "refuse_ranks",
    "resume_unsharded",
    "sharded_trainable",
    "world_from_env",
]

logger = logging.getLogger(__name__)

# How long a rank waits for the next command: rank 0 collects a step's rollouts meanwhile.
COMMAND_TIMEOUT = datetime.timedelta(hours=24)
RANKS_STORE_ENV = "FULGOR_RANKS_STORE"
"""The file of the ranks' :class:`torch.distributed.FileStore`; without it they meet as torchrun
says (``MASTER_ADDR`` and ``MASTER_PORT``: a TCP store)."""


def local_torchrun(nproc: int, folder: Path) -> tuple[list[str], dict[str, str]]:
    """torchrun's options (before the program) and the environment additions for ``nproc`` ranks on
    this machine that keep to loopback: torchrun's rendezvous in a file of ``folder`` (torchrun's
    ``--standalone`` one is a TCP store on every address) with no TCP store shared with the ranks,
    their process group on a file of ``folder`` too (:data:`RANKS_STORE_ENV`), and gloo on the
    loopback interface unless ``GLOO_SOCKET_IFNAME`` says otherwise. ``folder`` must be empty and
    stay until the ranks end."""
    options = [
        "--nnodes=1", f"--nproc-per-node={nproc}", "--local-addr=127.0.0.1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={folder / 'rendezvous'}", "--rdzv-conf=store_type=file",
    ]  # fmt: skip
    environment = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", RANKS_STORE_ENV: str(folder / "ranks")}
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        environment["GLOO_SOCKET_IFNAME"] = _loopback_interface()
    return options, environment


def _loopback_interface() -> str:
    """The name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in names if name in ("lo", "lo0")), "lo")


@dataclass(frozen=True)
class World:
    """This process's place among the ranks torchrun started."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def leader(self) -> bool:
        """Rank 0: the trainer, which runs the services and sends the commands."""
        return self.rank == 0


def world_from_env() -> World | None:
    """This process's place from torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; None when
    it runs alone (no ``WORLD_SIZE``, or 1)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    rank = int(os.environ["RANK"])
    return World(rank, size, int(os.environ.get("LOCAL_RANK", rank)))


def refuse_ranks(what: str) -> None:
    """A ConfigError when this process is one of torchrun's ranks: only training has work for them."""
    if world_from_env() is not None:
        raise ConfigError(
            f"{what} trains nothing, so it has no work for torchrun's ranks; run it in a process of its "
            "own (without torchrun)"
        )


def check_shardable(algorithm: Any) -> None:
    """A ConfigError unless ``algorithm`` is GRPO training all weights (what the ranks shard)."""
    from fulgor.algorithms.grpo import GRPO

    if not isinstance(algorithm, GRPO):
        raise ConfigError(
            f"the update across processes shards GRPO's update; {type(algorithm).__name__} trains in one "
            "process: run it without torchrun (or --nproc 1)"
        )
    if algorithm.lora is not None or algorithm.adapters:
        raise ConfigError(
            "the update across processes shards all the weights; a LoRA adapter trains in one process: "
            "drop lora=/adapters= or run without torchrun (or --nproc 1)"
        )
    names = (algorithm.config.advantage, algorithm.config.policy_loss)
    if any(name.startswith("verl:") for name in names):
        raise ConfigError(
            "the update across processes runs fulgor's own estimators and loss; verl's "
            f"({', '.join(n for n in names if n.startswith('verl:'))}) train in one process: "
            "run without torchrun (or --nproc 1)"
        )


@contextlib.contextmanager
def process_group(world: World, device: str) -> Iterator[str]:
    """``torch.distributed`` set up for ``world`` (NCCL on CUDA, gloo on the CPU) and torn down on
    leaving; yields this rank's device (``cuda:LOCAL_RANK`` on GPUs)."""
    import torch
    import torch.distributed as dist

    from fulgor.weights.loading import resolve_device

    resolved = resolve_device(device)
    if resolved.startswith("cuda"):
        resolved, backend = f"cuda:{world.local_rank}", "nccl"
        torch.cuda.set_device(resolved)
    elif resolved == "cpu":
        backend = "gloo"
    else:
        raise ConfigError(
            f"the update across processes runs on the CPU (gloo) or CUDA GPUs (NCCL), not on {resolved}; "
            "pass --device cpu or cuda"
        )
    store_file = os.environ.get(RANKS_STORE_ENV)
    # torch.distributed re-exports FileStore from its C extension without naming it in __all__.
    store = None if store_file is None else dist.FileStore(store_file, world.world_size)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend, store=store, rank=world.rank, world_size=world.world_size, timeout=COMMAND_TIMEOUT
    )
    try:
        yield resolved
    finally:
        # Objects left in reference cycles (a sharded model's hooks, say) may still hold the group:
        # freed now, while it is whole, not at interpreter exit, where a rank sometimes aborted in
        # gloo's teardown (about 1 two-rank run in 7 before this and the barrier after stop).
        gc.collect()
        dist.destroy_process_group()


@dataclass
class Ranks:
    """The ranks of one run as this process sees them: its place, its device, and whether the ranks
    may be out of step (an error escaped a command midway, so ``stop`` would not be heard)."""

    world: World
    device: str
    out_of_step: bool = False

    def send(self, command: tuple[Any, ...]) -> None:
        """Rank 0: send ``command`` to every other rank."""
        import torch.distributed as dist

        dist.broadcast_object_list([command], src=0)

    def stop(self) -> None:
        """Rank 0: tell the other ranks the run is over. Ranks out of step are left to torchrun,
        which stops them all once rank 0 exits with the error; so are ranks already gone (killed):
        the run ends as ``fit`` did, and the failed send is logged."""
        if not self.world.leader or self.out_of_step:
            return
        try:
            self.send(("stop",))
            self.barrier()
        except RuntimeError as error:  # gloo's or NCCL's "connection closed by peer"
            logger.warning("the other ranks did not hear the stop (%s); torchrun stops them", error)

    def barrier(self) -> None:
        """Wait for every rank (after ``stop``): each then tears down its process group with none of
        its peers' messages still on the way, which gloo would answer with an abort."""
        import torch.distributed as dist

        dist.barrier()

    @contextlib.contextmanager
    def command(self, command: tuple[Any, ...]) -> Iterator[None]:
        """Run a command's part on this rank: rank 0 sends ``command`` first."""
        try:
            if self.world.leader:
                self.send(command)
            yield
        except BaseException:
            self.out_of_step = True
            raise


def _receive() -> tuple[Any, ...]:
    import torch.distributed as dist

    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    command: tuple[Any, ...] = box[0]
    return command


def _shard(model: Any) -> None:
    """FSDP2 over ``model``: each decoder layer is one unit (its weights gathered for its own forward
    and backward only), the rest (embeddings, final norm, head) the root's."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ConfigError(
            f"{type(model).__name__} has no model.layers (a decoder's layers, as transformers' causal LMs "
            "have); the update across processes cannot shard it"
        )
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


class ShardedUpdater:
    """One rank's part of the update across processes (the :class:`~fulgor.algorithms.base.Updater`
    protocol): on rank 0, ``step`` and ``save`` first send the command that makes the other ranks do
    theirs. ``save`` is the policy's ``write_weights``."""

    def __init__(self, updater: PolicyUpdater, ranks: Ranks) -> None:
        self.updater = updater
        self.ranks = ranks

    @property
    def model(self) -> Any:
        return self.updater.model

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        with self.ranks.command(("step", trajectories)):
            return self.updater.step(trajectories)

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's random state; the optimiser state is in the checkpoint's ``optimizer/`` shards."""
        import torch

        return {"torch_rng": torch.get_rng_state(), "optimizer_shards": OPTIMIZER_DIR}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        torch.set_rng_state(state["torch_rng"])

    def save(self, directory: Path) -> None:
        """Write the full weights (rank 0, as a model directory) and this rank's optimiser shard into
        ``directory``; every rank calls it (rank 0 first sends the command)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )
        from torch.distributed.checkpoint.state_dict_saver import save

        with self.ranks.command(("save", str(directory))):
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            weights = get_model_state_dict(self.model, options=options)  # every rank gathers, rank 0 keeps
            if self.ranks.world.leader:
                with no_progress_bars():
                    self.model.save_pretrained(directory, state_dict=weights)
            optimizer = get_optimizer_state_dict(self.model, self.updater.optimizer)
            save({"optimizer": optimizer}, checkpoint_id=directory / OPTIMIZER_DIR)


def load_optimizer_shards(model: Any, optimizer: Any, checkpoint: Path) -> None:
    """Load ``checkpoint/optimizer`` (written by :meth:`ShardedUpdater.save` under any number of
    ranks) into ``optimizer``: each rank reads its shard of it, or one process all of it."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    saved = FileSystemReader(str(checkpoint / OPTIMIZER_DIR)).read_metadata().state_dict_metadata
    if not any(key.startswith("optimizer.state.") for key in saved):
        # The optimiser had not stepped yet (every update so far taught nothing and was skipped):
        # it has no state to load, and this fresh one is the same. Asking a fresh optimiser for its
        # state dict would give it one (a step of zeros), which the checkpoint does not hold.
        logger.info("%s: the optimiser had not stepped; it continues fresh", checkpoint)
        return
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    load(state, checkpoint_id=checkpoint / OPTIMIZER_DIR)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def resume_unsharded(updater: Any, model: Any, checkpoint: Path, saved: dict[str, Any]) -> None:
    """One process continuing a checkpoint that several ranks saved: ``updater``'s optimiser from the
    checkpoint's shards, and the random state rank 0 saved."""
    import torch

    load_optimizer_shards(model, updater.optimizer, checkpoint)
    torch.set_rng_state(saved["torch_rng"])


def _load_full_optimizer(model: Any, optimizer: Any, saved: dict[str, Any]) -> None:
    """Load a one-process checkpoint's optimiser state (``optimizer.state_dict()``: by parameter
    index) into a sharded ``optimizer``: the indices become parameter names, and each rank keeps its
    shard of each tensor."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    full: dict[str, Any] = {
        "state": {names[index]: value for index, value in saved["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in saved["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def sharded_trainable(
    algorithm: Algorithm, model_dir: Path, reference_dir: Path, step: int, ranks: Ranks
) -> tuple[Policy, ShardedUpdater]:
    """Every rank (rank 0 first sends the command): the weights of ``model_dir`` sharded, and the
    updater over them (from a checkpoint, ``step`` > 0, with its optimiser state, saved under any
    number of ranks or by one process)."""
    from fulgor.algorithms.grpo import GRPO

    assert isinstance(algorithm, GRPO)  # check_shardable
    with ranks.command(("load", str(model_dir), step)):
        return _trainable(algorithm, model_dir, reference_dir, step, ranks)


def _trainable(
    algorithm: GRPO, model_dir: Path, reference_dir: Path, step: int, ranks: Ranks
) -> tuple[Policy, ShardedUpdater]:
    from fulgor.algorithms.grpo.update import PolicyUpdater, RowShare

    policy = load_policy(model_dir, ranks.device)
    reference = None
    if algorithm.needs_reference_model:
        reference = load_policy(reference_dir, ranks.device).model.eval()
        reference.requires_grad_(False)
    _shard(policy.model)
    share = RowShare(ranks.world.rank, ranks.world.world_size)
    updater = ShardedUpdater(PolicyUpdater(policy.model, algorithm.config, reference, share), ranks)
    policy.write_weights = updater.save
    state = load_training_state(model_dir) if step > 0 else None
    if step > 0 and state is None:
        logger.warning("%s holds no training state: the optimiser starts afresh", model_dir)
    if state is not None:
        saved = state["updater"]
        if "optimizer_shards" in saved:
            load_optimizer_shards(policy.model, updater.updater.optimizer, model_dir)
        else:
            _load_full_optimizer(policy.model, updater.updater.optimizer, saved["optimizer"])
        updater.load_state_dict(saved)
    return policy, updater


def fit_on_ranks(
    world: World,
    algorithm: Any,
    engine: EngineConfig | VLLMConfig | None,
    torch_threads: int | None,
    fit: Callable[[Ranks], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """``Trainer.fit`` as one of torchrun's ranks: rank 0 runs ``fit`` (the training loop as on one
    process, leading the update) and returns its metrics; the others run the update only
    (:func:`follow`) and return none. Rank 0 ends the others' wait however ``fit`` ends."""
    from fulgor.training.checkpoints import set_torch_threads

    check_shardable(algorithm)
    assert engine is not None  # Trainer.fit refuses to train weights on an upstream
    with process_group(world, engine.device) as device:
        ranks = Ranks(world, device)
        if not world.leader:
            # Rank 0 leads the stop: torchrun passes a Ctrl+C or SIGTERM to every rank, and one
            # that left at once would fail rank 0's command under way and its own orderly stop.
            # Should rank 0 die instead, the next command's broadcast fails here and this rank
            # ends; torchrun kills a rank that outstays its shutdown timeout.
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            set_torch_threads(torch_threads)
            follow(algorithm, Path(engine.model), ranks)
            return []
        try:
            return fit(ranks)
        finally:
            ranks.stop()


def follow(algorithm: Algorithm, reference_dir: Path, ranks: Ranks) -> None:
    """A rank other than 0: run rank 0's commands until it sends ``stop``."""
    from fulgor.algorithms.grpo import GRPO

    assert isinstance(algorithm, GRPO)  # check_shardable
    rank = ranks.world.rank
    updater: ShardedUpdater | None = None
    while True:
        command = _receive()
        if command[0] == "stop":
            ranks.barrier()
            return
        if command[0] == "load":
            _, model_dir, step = command
            _, updater = _trainable(algorithm, Path(model_dir), reference_dir, step, ranks)
            continue
        if updater is None:
            raise RuntimeError(f"rank {rank} got {command[0]!r} before the weights were loaded")
        if command[0] == "step":
            updater.step(command[1])
        elif command[0] == "save":
            updater.save(Path(command[1]))
        else:
            raise RuntimeError(f"rank {rank} got an unknown command {command[0]!r}")
