"""``plan_batches_reference``: the literal dict-of-lists version of ``contrastive.mcl.batch_plan.plan_batches``
(MCL Algorithm 1), looping over every sample in Python: the test oracle of the vectorised plan and the
baseline of its benchmark (bench/batch_plan.py). Not production code.
"""
from __future__ import annotations

import numpy as np

from contrastive.errors import DataError
from contrastive.mcl.batch_plan import BatchPlan, _check_plan_args, _prepare_groups, _shuffle_key_layout
from contrastive.mcl.codes import _as_int_codes


def plan_batches_reference(
    *,
    groups: np.ndarray | None,
    batch_size: int,
    seed: int,
    epoch: int,
    num_samples: int | None = None,
    world_size: int = 1,
    rank: int = 0,
    remainder_policy: str = "partial",
) -> BatchPlan:
    """Literal, loop-over-samples version of plan_batches (MCL Algorithm 1); slow, for checking.

    Same signature, semantics and random stream as plan_batches, so it returns the identical plan for
    the same arguments (tests check this). Benchmark baseline: it loops over every sample in Python.
    """
    _check_plan_args(
        batch_size=batch_size, seed=seed, epoch=epoch, world_size=world_size, rank=rank,
        remainder_policy=remainder_policy,
    )
    labels = _prepare_groups(groups, num_samples=num_samples)[0].tolist() if groups is None else [
        int(x) for x in _as_int_codes(groups, name="groups")
    ]
    if not labels:
        raise DataError("groups is empty: there are no samples to plan batches for.")
    dense_id = {g: i for i, g in enumerate(sorted(set(labels)))}
    rng = np.random.default_rng([seed, epoch])
    random_bits, _ = _shuffle_key_layout(num_groups=len(dense_id), num_samples=len(labels))
    keys = rng.integers(0, 1 << random_bits, size=len(labels), dtype=np.int64)

    members: dict[int, list[tuple[int, int]]] = {g: [] for g in range(len(dense_id))}
    for i, label in enumerate(labels):
        members[dense_id[label]].append((int(keys[i]), i))
    B = world_size * batch_size
    batches: list[tuple[int, list[int]]] = []  # (group or -1, global batch)
    pool: list[int] = []
    dropped = 0
    for g in range(len(dense_id)):
        shuffled = [i for _, i in sorted(members[g])]
        n_full = len(shuffled) // B
        for k in range(n_full):
            batches.append((g, shuffled[k * B : (k + 1) * B]))
        rest = shuffled[n_full * B :]
        if remainder_policy == "pool":
            pool.extend(rest)
        elif remainder_policy == "partial" and len(rest) >= 2 * world_size:
            keep = len(rest) // world_size * world_size
            batches.append((g, rest[:keep]))
            dropped += len(rest) - keep
        else:
            dropped += len(rest)
    pooled = 0
    if remainder_policy == "pool":
        pool = [pool[j] for j in rng.permutation(len(pool))]
        while len(pool) >= B:
            batches.append((-1, pool[:B]))
            pooled += B
            pool = pool[B:]
        if len(pool) >= 2 * world_size:
            keep = len(pool) // world_size * world_size
            batches.append((-1, pool[:keep]))
            pooled += keep
            pool = pool[keep:]
        dropped += len(pool)

    flat: list[int] = []
    offsets = [0]
    group_of_batch = []
    for j in rng.permutation(len(batches)):
        g, global_batch = batches[j]
        per_rank = len(global_batch) // world_size
        flat.extend(global_batch[rank * per_rank : (rank + 1) * per_rank])
        offsets.append(len(flat))
        group_of_batch.append(g)
    sizes = {g: len(m) for g, m in members.items()}
    stats = {
        "num_batches": len(batches),
        "samples_planned": len(flat),
        "samples_planned_global": len(flat) * world_size,
        "samples_dropped": dropped,
        "samples_pooled": pooled,
        "groups": len(dense_id),
        "groups_smaller_than_batch": sum(1 for n in sizes.values() if n < B),
        "world_size": world_size,
        "global_batch_size": B,
    }
    return BatchPlan(
        indices=np.asarray(flat, dtype=np.int64),
        offsets=np.asarray(offsets, dtype=np.int64),
        group_of_batch=np.asarray(group_of_batch, dtype=np.int64),
        stats=stats,
    )
