"""Entry point of a job that runs several launch steps one after the other in one process group (one rendezvous,
one start of the interpreters): the two-node tests train and export every modality's tiny stage in a single job.
Importable on the nodes through PYTHONPATH (the repo root), as every job's entry is."""
import torch.distributed as dist

from contrastive.engine.launch import resolve_entry


def run_steps_from_json(*, steps: list[dict], info=None) -> None:
    """``steps``: [{"entry": "module:function", "kwargs": {...}}, ...], each called as a job would call it
    (``function(**kwargs, info=info)``); every rank waits for the others between steps, so a step reads what the
    one before wrote (a model rank 0 saved)."""
    for step in steps:
        resolve_entry(step["entry"])(**step["kwargs"], info=info)
        if dist.is_initialized():
            dist.barrier()
