"""Test helpers for real multi-process runs on this machine: free loopback ports and gloo process groups."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _in_group(rank: int, world: int, port: int, function, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        function(rank, *args)
        dist.barrier()  # no rank tears the group down while another still talks to it
    finally:
        dist.destroy_process_group()


def run_gloo_ranks(function, *args, world: int = 2) -> None:
    """Call ``function(rank, *args)`` in ``world`` spawned processes that form a gloo group on loopback.
    ``function`` must be importable (module level) so spawned processes can find it."""
    mp.spawn(_in_group, args=(world, free_port(), function, args), nprocs=world, join=True)
