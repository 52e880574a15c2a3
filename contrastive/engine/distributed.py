"""torch.distributed plumbing shared by every stage: torchrun environment, devices, process groups, lockstep
helpers, gathering with gradient, and batch norm over the global batch.

A stage runs either in one process (world size 1) or under ``torchrun`` (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` or a c10d rendezvous in the environment), with DDP over nccl on
GPUs or gloo on CPU. Every helper here is the identity (or a no-op) without an initialised process group, so the
single-process path runs the same code.

Gradient convention: in DDP every rank computes the SAME global loss L over the gathered batch. The collectives
below are autograd-aware and their backward sums the gradients of all ranks (``all_gather`` -> reduce-scatter,
``all_reduce`` -> all-reduce), so rank r's parameters receive W * dL/dz_r * dz_r/dtheta; DDP's average over the W
ranks then gives exactly dL/dtheta of the single-process loss on the concatenated batch.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from contrastive.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")


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


def current_info() -> DistInfo:
    """This process's rank and world size from the initialised process group (rank 0 of 1 without one)."""
    if not is_initialized():
        return DistInfo()
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(),
                    local_rank=int(os.environ.get("LOCAL_RANK", 0)))


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def resolve_backend(*, backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ConfigError(f"unknown distributed backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("distributed.backend=nccl needs CUDA devices; use gloo (or auto) on CPU")
    return backend


def device_for(*, name: str, info: DistInfo | None = None) -> torch.device:
    """``auto``/``cuda`` -> this process's GPU (cuda:LOCAL_RANK) when CUDA is available, else CPU."""
    info = info or dist_from_env()
    if name not in DEVICES:
        raise ConfigError(f"unknown device {name!r}: use one of {', '.join(DEVICES)}")
    if name == "cpu" or not torch.cuda.is_available():
        if name == "cuda":
            raise ConfigError("device=cuda but no CUDA GPU is visible: use --set device=auto or device=cpu")
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if info.local_rank >= visible:  # a modulo would put two processes on one GPU and leave the run to OOM there
        raise ConfigError(f"process {info.local_rank} of this node has no GPU of its own: {visible} GPUs are visible "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}) but "
                          f"{info.local_rank + 1} or more processes run on the node: set distributed.nproc_per_node="
                          f"{visible} or fewer, or make more GPUs visible")
    return torch.device("cuda", info.local_rank)


def per_rank_batch(*, global_batch_size: int, world_size: int) -> int:
    """Samples per process of a global batch split evenly over ``world_size`` processes."""
    if global_batch_size % world_size or global_batch_size // world_size < 2:
        raise ConfigError(f"the global batch of {global_batch_size} must be a multiple of the {world_size} "
                          "processes with at least 2 samples each: change the batch size or "
                          "distributed.nproc_per_node")
    return global_batch_size // world_size


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
    return _all_reduce_int(value, device=device, op=dist.ReduceOp.MIN)


def all_reduce_max(value: int, *, device: torch.device) -> int:
    """The maximum of ``value`` over all ranks (itself without a process group)."""
    return _all_reduce_int(value, device=device, op=dist.ReduceOp.MAX)


def _all_reduce_int(value: int, *, device: torch.device, op) -> int:
    if not is_initialized() or dist.get_world_size() == 1:
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=op)
    return int(tensor.item())


def any_rank(flag: torch.Tensor, *, device: torch.device) -> bool:
    """Whether ``flag`` (a bool tensor on ``device``) is true on any rank: one all-reduce and one device-to-host
    read, the only host synchronisation of a step outside logging in one process."""
    if is_initialized() and dist.get_world_size() > 1:
        flag = flag.to(device=device, dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag)


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def gather_objects(value) -> list:
    """``value`` of every rank, in rank order (a one-item list without a process group). A collective: every rank
    calls it."""
    if not is_initialized() or dist.get_world_size() == 1:
        return [value]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """(B_r, ...) on each rank -> (sum_r B_r, ...) in rank order; identity without a process group.

    Differentiable: the backward sums every rank's gradient for each slot (see the module docstring), which is
    what makes DDP's averaged gradient equal the single-process one. Ranks may hold different batch sizes (a
    partial batch): rows are padded for the collective and stripped after. Integer tensors (group ids) are
    gathered without autograd.
    """
    if not is_initialized() or dist.get_world_size() == 1:
        return x
    world = dist.get_world_size()
    size = torch.tensor([x.shape[0]], device=x.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    longest = max(counts)
    padded = x if x.shape[0] == longest else torch.cat(
        [x, x.new_zeros((longest - x.shape[0], *x.shape[1:]))], dim=0)
    if not x.is_floating_point():
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded.contiguous())
    else:
        from torch.distributed.nn.functional import all_gather
        with warnings.catch_warnings():
            # torch 2.14 marks it deprecated in favour of the private _functional_collectives; it is still the
            # public, autograd-aware all_gather.
            warnings.simplefilter("ignore", FutureWarning)
            parts = list(all_gather(padded.contiguous()))
    return torch.cat([part[:n] for part, n in zip(parts, counts)], dim=0)


def all_reduce_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks, differentiable (backward sums the gradients); identity without a process group."""
    if not is_initialized() or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_reduce
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return all_reduce(x)


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch norm whose training statistics cover the global batch of all ranks (SimCLR's "global BN").

    torch's SyncBatchNorm runs on GPUs only; this one works with any backend (gloo on CPU) and is what
    :func:`sync_batch_norms` installs off CUDA. For input (N, C, ...) on each rank:
        mean_c = sum_r sum_i x_ric / n,  var_c = sum_r sum_i x_ric^2 / n - mean_c^2,  n = sum_r N_r * prod(...)
        y = (x - mean) / sqrt(var + eps) * weight + bias
    with the sums all-reduced WITH gradient, so the backward equals single-process BatchNorm on the whole batch.
    Running statistics use the unbiased variance, as nn.BatchNorm does. In eval mode it is plain batch norm.
    """

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.ndim < 2:
            raise ValueError(f"expected at least 2-D input (N, C, ...), got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        dims = [0, *range(2, x.ndim)]
        local_count = x.numel() // x.shape[1]
        stats = torch.cat([x.sum(dims), (x * x).sum(dims),
                           torch.tensor([float(local_count)], dtype=x.dtype, device=x.device)])
        stats = all_reduce_with_grad(stats)
        channels = x.shape[1]
        count = stats[-1].detach()
        mean = stats[:channels] / count
        var = (stats[channels:2 * channels] / count - mean * mean).clamp_min(0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                unbiased = var * count / max(float(count) - 1.0, 1.0)
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased.detach())
        shape = [1, channels] + [1] * (x.ndim - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def sync_batch_norms(module: nn.Module, *, device: torch.device) -> nn.Module:
    """Replace every BatchNorm layer by one over the global batch: torch's SyncBatchNorm on CUDA, GlobalBatchNorm
    elsewhere. Parameters and running statistics are kept. Without a process group the module is returned as is."""
    if not is_initialized() or dist.get_world_size() == 1:
        return module
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _convert_to_global(module)


def _convert_to_global(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlobalBatchNorm):
        converted = GlobalBatchNorm(module.num_features, eps=module.eps, momentum=module.momentum,
                                    affine=module.affine, track_running_stats=module.track_running_stats)
        converted.load_state_dict(module.state_dict())
        converted.train(module.training)
        return converted
    for name, child in module.named_children():
        setattr(module, name, _convert_to_global(child))
    return module
