"""Process-group set-up: torchrun, direct ``srun`` (ranks from SLURM_*), or a single process.

megatron-core owns the parallel layout (``initialize_model_parallel``); this module only finds the
world, picks the backend (NCCL on GPU, gloo on CPU, where the CPU shim is installed) and tears down.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
import subprocess

import torch
import torch.distributed as dist

from bio_megatron.utils.log import get_logger

log = get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class WorldInfo:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "srun" | "single"


def _first_slurm_host(nodelist: str) -> str:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True,
                             text=True, timeout=30).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    # Fallback for simple lists when scontrol is unavailable: "node[1-2],x" -> "node1".
    head = nodelist.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        return prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_world(env: dict[str, str] | None = None) -> WorldInfo:
    """Where this process sits: trust torchrun's variables when RANK is set, else derive from SLURM_*."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        return WorldInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                         env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 29500)), "torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        addr = env.get("MASTER_ADDR") or _first_slurm_host(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")))
        # enroot's convention: a port derived from the job id, so concurrent jobs on a node do not collide.
        port = int(env.get("MASTER_PORT") or 61000 + int(env.get("SLURM_JOB_ID", "0")) % 4536)
        return WorldInfo(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                         addr, port, "srun")
    return WorldInfo(0, 1, 0, "127.0.0.1", int(env.get("MASTER_PORT") or _free_port()), "single")


def use_gpu() -> bool:
    return torch.cuda.is_available()


def forks_can_use_the_device() -> bool:
    """Whether a child forked from this process can still run the model: not where torch sees a GPU. Asking
    ``torch.cuda.is_available()`` (megatron-core's import does) initialises the CUDA driver (``cuInit``), and a child
    forked after that cannot use the GPU, so such children must be processes of their own (``spawn``, a new
    interpreter). The one rule for ``benchmark``'s local cells and ``predict``'s worker pool."""
    return not use_gpu()


def init_distributed(world: WorldInfo | None = None, timeout_s: int = 600) -> WorldInfo:
    """Initialise torch.distributed (idempotent) and return the world. Checks the megatron-core version and makes
    the seam's process-wide replacements first (the CPU shim without a GPU; with one, only the torch-Adam
    distributed-optimizer checkpoint fixes and multi-tensor stand-ins)."""
    world = world or resolve_world()
    from bio_megatron.parallel import seam

    seam.install("process")
    if dist.is_initialized():
        return world
    # Export what megatron-core and child libraries read from the environment.
    os.environ.update(RANK=str(world.rank), WORLD_SIZE=str(world.world_size), LOCAL_RANK=str(world.local_rank),
                      MASTER_ADDR=world.master_addr, MASTER_PORT=str(world.master_port))
    if use_gpu():
        torch.cuda.set_device(world.local_rank % torch.cuda.device_count())
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{world.master_addr}:{world.master_port}",
                            rank=world.rank, world_size=world.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    log.info("distributed: %s launch, %d process(es), backend %s", world.launcher, world.world_size, backend)
    return world


# The process groups megatron-core's initialize_model_parallel created, destroyed with its layout.
_LAYOUT_GROUPS: list[dist.ProcessGroup] = []


def _live_groups() -> list[dist.ProcessGroup]:
    # torch keeps no public list of the process groups alive; its registry is the one place that has them all
    return list(dist.distributed_c10d._world.pg_map)


def destroy_model_parallel() -> None:
    """megatron-core's ``destroy_model_parallel`` forgets its groups but destroys only its gloo data-parallel ones.
    Every later ``initialize_model_parallel`` in the process (each run of a seed or grid sweep) then left about
    20 groups alive: on the CPU, ~90 open sockets per rank at 2 ranks, which ended a long sweep at a 1,024-file
    limit; on a GPU, their NCCL communicators. The groups it created are destroyed here too, by every rank
    in the order they were created (member groups only, so every member destroys a group at the same point)."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    live = set(_live_groups())
    for group in _LAYOUT_GROUPS:
        if group in live:
            dist.destroy_process_group(group)
    _LAYOUT_GROUPS.clear()


def init_model_parallel(tp: int, pp: int, seed: int) -> None:
    """megatron-core's TP/PP/DP groups plus its model-parallel RNG (per-TP-rank dropout streams)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    destroy_model_parallel()
    before = set(_live_groups())
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    _LAYOUT_GROUPS.extend(g for g in _live_groups() if g not in before)
    # Megatron's convention: a different stream per pipeline stage, shared across data-parallel replicas.
    stage_seed = seed + 100 * ps.get_pipeline_model_parallel_rank()
    torch.manual_seed(stage_seed)
    model_parallel_cuda_manual_seed(stage_seed)


def single_process(local_rank: int = 0) -> None:
    """A one-process gloo/NCCL world with TP1/PP1: dist-checkpointing reshards any saved layout into it (the
    readers and writers of checkpoints at TP1: ``formats/``, ``predict``). ``local_rank`` picks the GPU (modulo
    the count), as for a rank: ``predict ner``'s workers spread over the machine's GPUs."""
    init_distributed(dataclasses.replace(resolve_world({}), local_rank=local_rank))
    init_model_parallel(1, 1, seed=0)


def teardown() -> None:
    if dist.is_initialized():
        _LAYOUT_GROUPS.clear()  # destroy_process_group() below destroys every group at once
        destroy_model_parallel()
        dist.destroy_process_group()
