"""Test helpers for real multi-process runs on this machine: gloo process groups on a free loopback port."""
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contrastive.engine.ports import free_port


def _in_group(rank: int, world: int, port: int, function, args: tuple) -> None:
    """One rank: ``function`` inside a gloo group, then a teardown that leaves no C++ thread of the group alive
    when the interpreter finalizes.

    A rank that returned normally used to end in interpreter finalization with the group's C++ threads (gloo's
    workers, the TCPStore's) possibly still alive and holding the last reference to a tensor that has a Python
    object: freeing it takes the GIL from that thread, which during finalization ends the thread with pthread_exit,
    and the forced unwind through gloo's noexcept worker loop calls std::terminate ("terminate called without an
    active exception", SIGABRT: 1 of 837 tests on a fresh clone). So: the rank's objects are collected while the
    group is alive (DDP's reducer holds the group in reference cycles), every rank reaches the barrier, the group
    is destroyed (its threads joined), and a rank that succeeded leaves with os._exit(0), skipping finalization;
    a failing rank raises as before, so torch.multiprocessing reports its traceback."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        function(rank, *args)
        gc.collect()  # DDP modules and their reducers (reference cycles) go now, while the group is alive
        dist.barrier()  # no rank tears the group down while another still talks to it
    finally:
        dist.destroy_process_group()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_gloo_ranks(function, *args, world: int = 2) -> None:
    """Call ``function(rank, *args)`` in ``world`` spawned processes that form a gloo group on loopback.
    ``function`` must be importable (module level) so spawned processes can find it."""
    mp.spawn(_in_group, args=(world, free_port(), function, args), nprocs=world, join=True)
