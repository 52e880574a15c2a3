"""Cluster-pure batch planning (MCL, Algorithm 1): ``plan_batches`` shuffles every pseudo-label group, cuts
it into global batches whose samples all share one pseudo-label, shuffles the batches and gives each rank
of a distributed run a disjoint slice of the same global plan. Vectorised numpy (one int64 sort per
epoch): an epoch of 12M samples in 1,000 groups plans in about a second and O(M) int64 memory. Nothing is
dropped silently: every plan counts the samples it drops or pools.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from contrastive.errors import ConfigError, DataError
from contrastive.mcl.codes import _argsort_nonnegative, _as_int_codes, _densify

__all__ = ["BatchPlan", "plan_batches"]

REMAINDER_POLICIES = ("partial", "pool", "drop")


def _gather_ranges(source: np.ndarray, *, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate source[starts[i] : starts[i] + lengths[i]] for all i without a Python loop.

    starts, lengths: int64 (n,). Returns an array of source's dtype, shape (lengths.sum(),).
    """
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=source.dtype)
    begin_out = np.cumsum(lengths) - lengths
    # Position j of the output reads source[starts[i] + (j - begin_out[i])] for the range i holding j.
    positions = np.repeat(starts - begin_out, lengths) + np.arange(total, dtype=np.int64)
    return source[positions]


# Below this many random bits per sample, ties inside a group become likely enough to matter, so the
# packed one-int64 key (group | random | index) gives way to a (group | random) key + stable argsort.
_MIN_PACKED_RANDOM_BITS = 24


def _shuffle_key_layout(*, num_groups: int, num_samples: int) -> tuple[int, int]:
    """(random_bits, index_bits) of the within-group shuffle key; index_bits == 0: not packed.

    The key of sample i is  group << (r + x) | random << x | i  (r random bits, x index bits), a
    non-negative int64 when group bits + r + x <= 63. Sorting it orders samples by group, then by a
    random key, ties broken by sample index: a random-key shuffle inside every group.
    """
    group_bits = max(1, int(num_groups - 1).bit_length())
    index_bits = max(1, int(num_samples - 1).bit_length())
    packed_random_bits = 63 - group_bits - index_bits
    if packed_random_bits >= _MIN_PACKED_RANDOM_BITS:
        return packed_random_bits, index_bits
    return 62 - group_bits, 0


def _shuffle_within_groups(
    *, groups: np.ndarray, num_groups: int, rng: np.random.Generator
) -> np.ndarray:
    """Sample indices sorted by group, in a uniformly random order inside each group.

    groups: dense int64 (M,) in [0, G). Returns int64 (M,).
    A random-key shuffle: sort by (group, random key, index). Equal in distribution to "permute, then
    stable-sort by group" up to ties of the random key (probability ~ n_g^2 / 2^(r+1), r >= 24 bits),
    but costs one sort instead of a permutation plus a stable argsort.
    """
    random_bits, _ = _shuffle_key_layout(num_groups=num_groups, num_samples=groups.size)
    group_bits = max(1, int(num_groups - 1).bit_length())
    keys = rng.integers(0, 1 << random_bits, size=groups.size, dtype=np.int64)
    keys |= groups << random_bits
    return _argsort_nonnegative(keys, value_bits=group_bits + random_bits)


def _check_plan_args(
    *, batch_size: int, seed: int, epoch: int, world_size: int, rank: int, remainder_policy: str
) -> None:
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}; set a positive per-rank batch size.")
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}.")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank}.")
    if seed < 0 or epoch < 0:
        raise ConfigError(f"seed and epoch must be >= 0 (got seed={seed}, epoch={epoch}).")
    if remainder_policy not in REMAINDER_POLICIES:
        raise ConfigError(
            f"unknown remainder_policy {remainder_policy!r}; use one of {', '.join(REMAINDER_POLICIES)}."
        )


def _prepare_groups(groups: np.ndarray | None, *, num_samples: int | None = None) -> tuple[np.ndarray, int]:
    """Dense group ids (M,) and G; ``None`` means one group holding every sample (the control run)."""
    if groups is None:
        if num_samples is None or num_samples < 1:
            raise ConfigError(
                "groups=None (ordinary random batches) needs num_samples=len(dataset); pass it, or pass the "
                "pseudo-labels as groups."
            )
        return np.zeros(num_samples, dtype=np.int64), 1
    dense, num_groups = _densify(_as_int_codes(groups, name="groups"))
    if dense.size == 0:
        raise DataError("groups is empty: there are no samples to plan batches for.")
    return dense, num_groups


def _kept_remainder(remainder: np.ndarray | int, *, world_size: int) -> np.ndarray | int:
    """Size of the smaller group-pure batch kept from a remainder under the "partial" rule.

    Kept only if every rank gets at least 2 samples (a contrastive batch of one sample has no
    negatives); its size is rounded down to a multiple of world_size so ranks split it evenly.
    """
    return np.where(remainder >= 2 * world_size, (remainder // world_size) * world_size, 0)


@dataclass
class BatchPlan:
    """One rank's batches for one epoch, stored compactly.

    indices: int64 (N,) sample indices of this rank's batches, concatenated in training order.
    offsets: int64 (num_batches + 1,) batch i is indices[offsets[i]:offsets[i+1]].
    group_of_batch: int64 (num_batches,) the (dense) group of each batch; -1 for mixed (pooled) batches.
    stats: ints num_batches, samples_planned (this rank), samples_planned_global, samples_dropped
        (global), samples_pooled (global, samples placed in mixed batches), groups,
        groups_smaller_than_batch (groups with fewer than world_size * batch_size samples),
        world_size, global_batch_size. Invariant: samples_planned_global + samples_dropped == M.
    """

    indices: np.ndarray
    offsets: np.ndarray
    group_of_batch: np.ndarray
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def batch(self, i: int) -> np.ndarray:
        """Sample indices of batch i, int64 (b_i,)."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} out of range for a plan of {len(self)} batches")
        i %= len(self)
        return self.indices[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self.indices[self.offsets[i] : self.offsets[i + 1]]


@dataclass
class _GlobalBatches:
    """Global batches before the shuffle: where each one starts in ``source``, its size, its group."""

    source: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    groups: np.ndarray
    dropped: int
    pooled: int


def plan_batches(
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
    """Plan one epoch of cluster-pure batches (MCL Algorithm 1), for one rank of world_size.

    groups: int (M,) pseudo-label of each sample (combine_pseudo_labels), or None for ordinary random
        batches over all samples (the control run; then num_samples is required).
    batch_size: per-rank batch size b; a GLOBAL batch holds B = world_size * b samples of ONE group.

    Algorithm (rng = np.random.default_rng([seed, epoch]), identical on every rank):
      1. shuffle the samples inside every group (random-key sort, see _shuffle_within_groups);
      2. cut each group into global batches of B; the remainder r < B of a group is
         "partial": kept as one smaller pure batch of floor(r / W) * W samples if r >= 2W, else dropped;
         "pool": remainders of all groups are pooled, shuffled and cut into MIXED batches of B, the
                 last pool remainder treated as in "partial";  "drop": dropped;
      3. shuffle the order of all global batches (groups interleave; a new order every epoch);
      4. rank r takes rows [r * s / W, (r + 1) * s / W) of every global batch of size s, so ranks never
         overlap and all have the same number of batches and samples.
    Dropped and pooled samples are counted in stats, never lost silently.
    """
    _check_plan_args(
        batch_size=batch_size, seed=seed, epoch=epoch, world_size=world_size, rank=rank,
        remainder_policy=remainder_policy,
    )
    dense, num_groups = _prepare_groups(groups, num_samples=num_samples)
    rng = np.random.default_rng([seed, epoch])
    global_batch = world_size * batch_size
    order = _shuffle_within_groups(groups=dense, num_groups=num_groups, rng=rng)
    sizes = np.bincount(dense, minlength=num_groups)
    cut = _cut_global_batches(
        order=order, group_sizes=sizes, global_batch=global_batch, world_size=world_size,
        remainder_policy=remainder_policy, rng=rng,
    )
    shuffle = rng.permutation(cut.starts.size)
    per_rank = cut.sizes[shuffle] // world_size
    indices = _gather_ranges(cut.source, starts=cut.starts[shuffle] + rank * per_rank, lengths=per_rank)
    offsets = np.concatenate([[0], np.cumsum(per_rank)]).astype(np.int64)
    stats = {
        "num_batches": int(shuffle.size),
        "samples_planned": int(indices.size),
        "samples_planned_global": int(indices.size) * world_size,
        "samples_dropped": int(cut.dropped),
        "samples_pooled": int(cut.pooled),
        "groups": int(num_groups),
        "groups_smaller_than_batch": int((sizes < global_batch).sum()),
        "world_size": int(world_size),
        "global_batch_size": int(global_batch),
    }
    return BatchPlan(indices=indices, offsets=offsets, group_of_batch=cut.groups[shuffle], stats=stats)


def _cut_global_batches(
    *,
    order: np.ndarray,
    group_sizes: np.ndarray,
    global_batch: int,
    world_size: int,
    remainder_policy: str,
    rng: np.random.Generator,
) -> _GlobalBatches:
    """Step 2 of plan_batches: global batches in construction order (by group, then position).

    order: int64 (M,) samples sorted by group, shuffled inside groups. group_sizes: int64 (G,).
    """
    num_groups = group_sizes.size
    group_starts = np.cumsum(group_sizes) - group_sizes
    full = group_sizes // global_batch
    remainder = group_sizes - full * global_batch
    if remainder_policy == "partial":
        kept = _kept_remainder(remainder, world_size=world_size)
    else:  # "drop" drops remainders, "pool" moves them to the pool below
        kept = np.zeros_like(remainder)
    batches_per_group = full + (kept > 0)
    batch_group = np.repeat(np.arange(num_groups, dtype=np.int64), batches_per_group)
    k = np.arange(batch_group.size, dtype=np.int64) - np.repeat(
        np.cumsum(batches_per_group) - batches_per_group, batches_per_group
    )
    starts = group_starts[batch_group] + k * global_batch
    sizes = np.where(k < full[batch_group], global_batch, kept[batch_group]).astype(np.int64)
    if remainder_policy != "pool":
        dropped = int((remainder - kept).sum())
        return _GlobalBatches(
            source=order, starts=starts, sizes=sizes, groups=batch_group, dropped=dropped, pooled=0
        )

    pool = _gather_ranges(order, starts=group_starts + full * global_batch, lengths=remainder)
    pool = pool[rng.permutation(pool.size)]
    n_pool_full = pool.size // global_batch
    last = pool.size - n_pool_full * global_batch
    last_kept = int(_kept_remainder(last, world_size=world_size))
    pool_sizes = np.full(n_pool_full + (last_kept > 0), global_batch, dtype=np.int64)
    if last_kept:
        pool_sizes[-1] = last_kept
    # Pooled batches index the pool appended after ``order`` in one source array.
    pool_starts = order.size + np.arange(pool_sizes.size, dtype=np.int64) * global_batch
    return _GlobalBatches(
        source=np.concatenate([order, pool]),
        starts=np.concatenate([starts, pool_starts]),
        sizes=np.concatenate([sizes, pool_sizes]),
        groups=np.concatenate([batch_group, np.full(pool_sizes.size, -1, dtype=np.int64)]),
        dropped=last - last_kept,
        pooled=int(pool_sizes.sum()),
    )
