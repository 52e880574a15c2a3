"""torch.distributed plumbing for CLIP stages: torchrun environment, process groups, lockstep helpers.

A stage runs either in one process (world size 1) or under ``torchrun`` (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` in the environment), with DDP over nccl on GPUs or gloo on CPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from contrastive.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def dist_from_env() -> DistInfo:
    """The process's place in a torchrun launch (rank 0 of 1 when not launched by torchrun)."""
    return DistInfo(rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1)),
                    local_rank=int(os.environ.get("LOCAL_RANK", 0)))


def resolve_backend(*, backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ConfigError(f"unknown distributed backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("distributed.backend=nccl needs CUDA devices; use gloo (or auto) on CPU")
    return backend


def device_for(*, name: str, info: DistInfo) -> torch.device:
    """``auto``/``cuda`` -> this process's GPU (cuda:LOCAL_RANK) when CUDA is available, else CPU."""
    if name == "cpu" or not torch.cuda.is_available():
        if name == "cuda":
            raise ConfigError("device=cuda but no CUDA GPU is visible: use --set device=auto or device=cpu")
        return torch.device("cpu")
    return torch.device("cuda", info.local_rank % torch.cuda.device_count())


def init_process_group(*, info: DistInfo, backend: str, device: torch.device) -> None:
    """Join the process group of a torchrun launch (no-op for a single process or if already joined)."""
    if not info.is_distributed or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=resolve_backend(backend=backend, device=device), rank=info.rank,
                            world_size=info.world_size)


def all_reduce_min(value: int, *, device: torch.device) -> int:
    """The minimum of ``value`` over all ranks (itself without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
