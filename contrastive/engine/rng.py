"""Every random number generator a resumed stage must restore to draw exactly what an uninterrupted one draws."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng(generators: dict[str, torch.Generator] | None = None) -> dict:
    """python, numpy and torch's global states plus the named explicit generators (e.g. the augmentation's).
    Tensors and plain data only (numpy's uint32 key as an int64 tensor: a uint32 tensor does not survive the
    plain pickle of ``all_gather_object``), so a checkpoint holding it loads without unpickling code
    (contrastive.engine.safe_load)."""
    kind, key, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": (kind, torch.from_numpy(key.astype(np.int64)), position, has_gauss, cached_gaussian),
             "generators": {name: g.get_state() for name, g in (generators or {}).items()}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    random.setstate(state["python"])
    kind, key, position, has_gauss, cached_gaussian = state["numpy"]
    key = key.numpy() if isinstance(key, torch.Tensor) else key
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, generator in (generators or {}).items():
        generator.set_state(state["generators"][name])


def rng_of_rank(checkpoint: dict, *, rank: int, world_size: int) -> dict:
    """The RNG state a rank restores from a checkpoint: its own (``rng_by_rank``, every rank's states gathered when
    it was written), so ranks keep drawing different dropout masks after a resume; rank 0's ``rng`` for a
    checkpoint written before per-rank states existed or by another number of processes."""
    by_rank = checkpoint.get("rng_by_rank")
    if by_rank is not None and len(by_rank) == world_size:
        return by_rank[rank]
    return checkpoint["rng"]
