"""Pseudo-label combination and cluster-pure batch planning (MCL, Algorithm 1).

MCL trains stage j with batches in which every sample shares the same pseudo-label, the pseudo-label
being the tuple of k-means cluster ids of ALL earlier stages (y0, ..., y_{j-1}). Inside such a batch the
features that earlier stages already learnt cannot separate positives from negatives, so the encoder is
pushed towards features that are still unlearnt.

Everything here is vectorised numpy (one int64 sort per epoch): planning an epoch of 12M samples in
1,000 groups takes about a second and O(M) int64 memory. ``plan_batches_reference`` is the literal
dict-of-lists version of the same algorithm, kept as the benchmark baseline and as the test oracle.

Nothing is dropped silently: every plan counts the samples it drops or pools, and every rank of a
distributed run computes the same global plan and takes a disjoint slice of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from contrastive.errors import ConfigError, DataError

__all__ = [
    "BatchPlan",
    "ClusterBatchSampler",
    "align_labels_to_ids",
    "combine_pseudo_labels",
    "merge_small_groups",
    "plan_batches",
    "plan_batches_reference",
]

REMAINDER_POLICIES = ("partial", "pool", "drop")
MERGE_POLICIES = ("merge_nearest", "pool", "none")

# A bincount-based relabelling allocates one int64 per possible code; above this many codes per
# sample it is cheaper (in memory) to fall back to a sort-based np.unique.
_DENSE_RANGE_FACTOR = 2
_DENSE_RANGE_MIN = 1 << 22


# --------------------------------------------------------------------------------------------------
# small vectorised helpers
# --------------------------------------------------------------------------------------------------
def _as_int_codes(values: np.ndarray, *, name: str) -> np.ndarray:
    """Validate a 1-D integer array and return it as int64 (no copy when already int64)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise DataError(f"{name} must be a 1-D array of integer ids, got shape {arr.shape}.")
    if arr.dtype.kind not in "iub":
        raise DataError(
            f"{name} must hold integer cluster ids, got dtype {arr.dtype}; "
            "pass the k-means assignments (int64), not features or strings."
        )
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise DataError(f"{name} holds ids larger than int64 can represent; relabel them densely.")
    return arr.astype(np.int64, copy=False)


def _densify(codes: np.ndarray, *, bounds: tuple[int, int] | None = None) -> tuple[np.ndarray, int]:
    """Relabel int64 codes (M,) to 0..G-1 keeping their order (smallest code -> 0).

    Returns (dense int64 (M,), G). O(M + range) via bincount when the code range is small (the usual
    case: cluster ids are already 0..K-1), otherwise a sort-based np.unique. ``bounds`` = (lo, hi) with
    lo <= codes <= hi, when the caller knows them, saves the two O(M) min/max passes.
    """
    if codes.size == 0:
        return codes.astype(np.int64, copy=False), 0
    lo, hi = bounds if bounds is not None else (int(codes.min()), int(codes.max()))
    span = hi - lo + 1
    if span <= max(_DENSE_RANGE_FACTOR * codes.size, _DENSE_RANGE_MIN):
        shifted = codes - lo if lo != 0 else codes
        present = np.bincount(shifted, minlength=span) > 0
        if present.all():
            # Already dense up to the shift: skip the O(M) gather.
            return shifted.astype(np.int64, copy=False), span
        remap = np.cumsum(present, dtype=np.int64) - 1
        return remap[shifted], int(present.sum())
    uniq, inverse = np.unique(codes, return_inverse=True)
    return inverse.astype(np.int64, copy=False).reshape(-1), int(uniq.size)


def _owned(result: np.ndarray, source: np.ndarray) -> np.ndarray:
    """Copy result if it is a view of the caller's input, so callers may modify what we return."""
    return result.copy() if np.shares_memory(result, np.asarray(source)) else result


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


def _argsort_nonnegative(values: np.ndarray, *, value_bits: int) -> np.ndarray:
    """Stable argsort (ties by index) of int64 values (M,) in [0, 2**value_bits). Returns int64 (M,).

    When value and index fit together in one int64 (value << index_bits | index), the packed keys are
    unique, so numpy's SIMD value sort (several times faster than any argsort here) gives the stable
    order; otherwise torch's stable int64 sort (a radix sort; numpy's stable int64 argsort is timsort).
    """
    index_bits = max(1, int(values.size - 1).bit_length())
    if value_bits + index_bits > 63:
        return torch.sort(torch.from_numpy(values), stable=True).indices.numpy()
    keys = values << index_bits
    keys |= np.arange(values.size, dtype=np.int64)
    keys.sort()
    keys &= (1 << index_bits) - 1
    return keys


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


# --------------------------------------------------------------------------------------------------
# pseudo-labels
# --------------------------------------------------------------------------------------------------
def combine_pseudo_labels(*, stage_assignments: list[np.ndarray]) -> np.ndarray:
    """Combine the cluster ids of ALL earlier stages into one pseudo-label per sample.

    MCL, Section 3 / Algorithm 1: the pseudo-label of sample i for stage j is the tuple
    (y0[i], ..., y_{j-1}[i]). (The public reference code used only y_{j-1}: a loop-variable bug.)

    stage_assignments: list of int arrays, each (M,), aligned on the same sample order.
    Returns int64 (M,) in [0, G): equal codes iff equal tuples; codes are numbered in lexicographic
    order of the tuples (stage 0 most significant). Mixed-radix encoding, relabelled densely after
    every stage so the int64 code never overflows.
    """
    if not stage_assignments:
        raise ConfigError(
            "combine_pseudo_labels got no stages; pass the cluster assignments of every earlier stage."
        )
    arrays = [_as_int_codes(a, name=f"stage_assignments[{i}]") for i, a in enumerate(stage_assignments)]
    lengths = {a.size for a in arrays}
    if len(lengths) != 1:
        raise ConfigError(
            f"stage assignments have different lengths {[a.size for a in arrays]}; align every stage's "
            "assignments to the same sample ids (align_labels_to_ids) before combining."
        )
    code, num_codes = _densify(arrays[0])
    for stage in arrays[1:]:
        digit, radix = _densify(stage)
        # code < num_codes <= M and digit < radix <= M, so code * radix + digit < M^2 fits in int64.
        combined = code * radix  # a new array: code may be the caller's input
        combined += digit
        code, num_codes = _densify(combined, bounds=(0, num_codes * radix - 1))
    return _owned(code, stage_assignments[0])


def align_labels_to_ids(*, label_ids: np.ndarray, labels: np.ndarray, dataset_ids: np.ndarray) -> np.ndarray:
    """Reorder labels, keyed by sample id, into the order of the dataset being trained on.

    label_ids: (L,) str or int sample ids the labels were computed for (e.g. by clustering).
    labels: (L, ...) any dtype. dataset_ids: (M,) ids in the order the training dataset yields them.
    Returns labels[j] for each dataset id, shape (M, ...). Labels are tied to ids, never to listing
    order: the public reference code silently mislabelled samples when directory order changed.
    """
    label_ids = _as_id_array(label_ids, name="label_ids")
    dataset_ids = _as_id_array(dataset_ids, name="dataset_ids")
    labels = np.asarray(labels)
    if labels.shape[:1] != label_ids.shape:
        raise DataError(
            f"labels has {labels.shape[0] if labels.ndim else 0} rows but label_ids has {label_ids.size}; "
            "save the ids together with the assignments they belong to."
        )
    if label_ids.shape == dataset_ids.shape and np.array_equal(label_ids, dataset_ids):
        return labels
    _check_id_kinds(label_ids=label_ids, dataset_ids=dataset_ids)
    int_ids = label_ids.dtype.kind in "iu" and _fits_int64(label_ids) and _fits_int64(dataset_ids)
    if int_ids:
        label_ids = label_ids.astype(np.int64, copy=False)
        dataset_ids = dataset_ids.astype(np.int64, copy=False)
        direct = _scatter_int_labels(label_ids=label_ids, labels=labels, dataset_ids=dataset_ids)
        if direct is not None:
            return direct
        rows = _join_int_ids(label_ids=label_ids, dataset_ids=dataset_ids)
    else:
        rows = _join_sorted_ids(label_ids=label_ids, dataset_ids=dataset_ids)
    found = rows >= 0
    if not found.all():
        missing = dataset_ids[~found]
        raise DataError(
            f"{missing.size} of {dataset_ids.size} dataset ids have no label (e.g. {missing[:3].tolist()}); "
            "the labels were computed for a different dataset: re-run the clustering stage for this dataset."
        )
    return labels[rows]


def _fits_int64(ids: np.ndarray) -> bool:
    return ids.dtype.kind == "i" or ids.size == 0 or int(ids.max()) <= np.iinfo(np.int64).max


def _duplicate_ids_error(*, count: int, examples: list) -> DataError:
    return DataError(
        f"{count} label ids are duplicated (e.g. {examples}); sample ids must be unique: "
        "fix the dataset's id column and re-run the clustering stage."
    )


def _scatter_int_labels(*, label_ids: np.ndarray, labels: np.ndarray, dataset_ids: np.ndarray) -> np.ndarray | None:
    """Fast path of align_labels_to_ids for int64 ids in a compact range and non-negative 1-D integer labels
    (pseudo-label codes, cluster ids): labels[j] for each dataset id, int (M,); None when it does not apply
    or when something is wrong (duplicated or missing ids), so the general path words the error.

    One random-access pass (the scatter ``by_id[label_ids] = labels``) instead of two (scatter the row of each
    id, then gather the labels by row): at 12M samples the passes are memory-latency bound, ~0.3 s each.
    Slots start at -1; ids fill at most L distinct slots, so L filled slots means no id is duplicated.
    """
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or label_ids.size == 0 or dataset_ids.size == 0:
        return None
    if labels.dtype == np.uint64:
        return None  # no signed type holds every uint64 and -1
    lo, hi = int(label_ids.min()), int(label_ids.max())
    span = hi - lo + 1
    if span > max(_DENSE_RANGE_FACTOR * label_ids.size, _DENSE_RANGE_MIN) or int(labels.min()) < 0:
        return None
    dtype = np.result_type(labels.dtype, np.int8)  # signed, so -1 can mark an empty slot
    by_id = np.full(span, -1, dtype=dtype)
    by_id[label_ids - lo if lo else label_ids] = labels
    if span - np.count_nonzero(by_id < 0) != label_ids.size:
        return None  # duplicated ids
    query = dataset_ids - lo if lo else dataset_ids
    if int(query.min()) < 0 or int(query.max()) >= span:
        return None  # some dataset ids outside the labelled range
    out = by_id[query]
    if (out < 0).any():
        return None  # some dataset ids have no label
    return out.astype(labels.dtype, copy=False)


def _join_int_ids(*, label_ids: np.ndarray, dataset_ids: np.ndarray) -> np.ndarray:
    """Row of label_ids holding each dataset id, -1 where none: int64 (M,).

    Compact id ranges (the usual 0..M-1 style ids) use a direct lookup table, O(M + range); sparse
    ranges use the sort-merge join.
    """
    if label_ids.size == 0:
        return np.full(dataset_ids.size, -1, dtype=np.int64)
    lo, hi = int(label_ids.min()), int(label_ids.max())
    span = hi - lo + 1
    if span > max(_DENSE_RANGE_FACTOR * label_ids.size, _DENSE_RANGE_MIN):
        return _join_sorted_ids(label_ids=label_ids, dataset_ids=dataset_ids)
    shifted = label_ids - lo if lo else label_ids
    table = np.full(span, -1, dtype=np.int64)
    table[shifted] = np.arange(label_ids.size, dtype=np.int64)
    # A duplicated id writes its slot twice, so fewer slots get filled than there are ids (one O(span)
    # count instead of an O(M) random-access bincount; the bincount runs only to word the error).
    if span - np.count_nonzero(table < 0) != label_ids.size:
        counts = np.bincount(shifted, minlength=span)
        duplicated = np.flatnonzero(counts > 1)
        raise _duplicate_ids_error(
            count=int((counts[duplicated] - 1).sum()), examples=(duplicated[:3] + lo).tolist()
        )
    query = dataset_ids - lo if lo else dataset_ids
    if dataset_ids.size == 0 or (int(query.min()) >= 0 and int(query.max()) < span):
        return table[query]  # every dataset id inside the table's range (the usual case)
    rows = np.full(dataset_ids.size, -1, dtype=np.int64)
    inside = (query >= 0) & (query < span)
    rows[inside] = table[query[inside]]
    return rows


def _argsort_ids(ids: np.ndarray) -> np.ndarray:
    if ids.dtype.kind == "i" and ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if hi - lo < 1 << 62:
            return _argsort_nonnegative(ids - lo, value_bits=max(1, (hi - lo).bit_length()))
    return np.argsort(ids, kind="stable")


def _join_sorted_ids(*, label_ids: np.ndarray, dataset_ids: np.ndarray) -> np.ndarray:
    """Sort-merge join: row of label_ids holding each dataset id, -1 where none: int64 (M,).

    Both sides are sorted: binary searches of sorted queries walk memory in order, which is ~30x
    faster than searching 12M queries in random order.
    """
    label_order = _argsort_ids(label_ids)
    sorted_ids = label_ids[label_order]
    duplicated = sorted_ids[1:] == sorted_ids[:-1]
    if duplicated.any():
        raise _duplicate_ids_error(
            count=int(duplicated.sum()), examples=np.unique(sorted_ids[1:][duplicated])[:3].tolist()
        )
    rows = np.full(dataset_ids.size, -1, dtype=np.int64)
    if sorted_ids.size == 0:
        return rows
    query_order = _argsort_ids(dataset_ids)
    queries = dataset_ids[query_order]
    pos = np.minimum(np.searchsorted(sorted_ids, queries), sorted_ids.size - 1)
    hit = sorted_ids[pos] == queries
    rows[query_order[hit]] = label_order[pos[hit]]
    return rows


def _as_id_array(ids: np.ndarray, *, name: str) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise DataError(f"{name} must be a 1-D array of sample ids, got shape {arr.shape}.")
    if arr.dtype.kind == "O":
        # Object arrays of str compare slowly and do not sort reliably with mixed types.
        arr = arr.astype(str)
    return arr


def _check_id_kinds(*, label_ids: np.ndarray, dataset_ids: np.ndarray) -> None:
    numeric = {"i", "u"}
    if (label_ids.dtype.kind in numeric) != (dataset_ids.dtype.kind in numeric):
        raise DataError(
            f"label ids are {label_ids.dtype} but dataset ids are {dataset_ids.dtype}; use the same id type "
            "(e.g. both str) when exporting embeddings and when loading the dataset."
        )


# --------------------------------------------------------------------------------------------------
# small groups
# --------------------------------------------------------------------------------------------------
def merge_small_groups(
    *, groups: np.ndarray, features: np.ndarray | None, min_size: int, policy: str
) -> tuple[np.ndarray, dict]:
    """Deal with pseudo-label groups too small to fill a (global) batch.

    groups: int (M,). features: float (M, D) or None (needed only by "merge_nearest").
    min_size: groups with fewer samples are "small" (typically world_size * batch_size).
    policy:
      - "merge_nearest": each small group joins the large group whose centroid (mean of L2-normalised
        rows) has the highest cosine similarity to its own; if no group is large, all samples end up
        in one group (stats["merged_all_into_one"] == 1).
      - "pool": all small groups together become one new group (its batches are no longer pure).
      - "none": groups unchanged (only relabelled densely).
    Returns (dense int64 (M,) in [0, G'), stats) with stats ints groups_before, groups_after,
    small_groups, samples_in_small_groups, merged_all_into_one, and stats["policy"].
    """
    if policy not in MERGE_POLICIES:
        raise ConfigError(f"unknown small-group policy {policy!r}; use one of {', '.join(MERGE_POLICIES)}.")
    if min_size < 1:
        raise ConfigError(f"min_size must be >= 1, got {min_size}.")
    dense, num_groups = _densify(_as_int_codes(groups, name="groups"))
    sizes = np.bincount(dense, minlength=num_groups)
    small = sizes < min_size
    stats = {
        "policy": policy,
        "groups_before": int(num_groups),
        "small_groups": int(small.sum()),
        "samples_in_small_groups": int(sizes[small].sum()),
        "merged_all_into_one": 0,
    }
    mapping = np.arange(num_groups, dtype=np.int64)
    if policy == "merge_nearest" and small.any():
        if small.all():
            mapping[:] = 0
            stats["merged_all_into_one"] = 1
        else:
            centroids = _group_centroids(groups=dense, num_groups=num_groups, features=features)
            mapping[small] = _nearest_large_group(centroids=centroids, small=small)
    elif policy == "pool" and small.any():
        mapping[small] = num_groups
    merged, num_after = _densify(mapping[dense]) if policy != "none" else (dense, num_groups)
    stats["groups_after"] = int(num_after)
    return _owned(merged, groups), stats


def _group_centroids(*, groups: np.ndarray, num_groups: int, features: np.ndarray | None) -> np.ndarray:
    """Mean of the L2-normalised feature rows of each group, float64 (G, D)."""
    if features is None:
        raise ConfigError('policy "merge_nearest" needs features; pass the embeddings or use policy "pool".')
    feats = np.asarray(features)
    if feats.ndim != 2 or feats.shape[0] != groups.size:
        raise DataError(
            f"features must have shape (M={groups.size}, D), got {feats.shape}; pass the embeddings the "
            "groups were computed from, in the same sample order."
        )
    inverse_norms = _inverse_row_norms(feats)
    order = _argsort_nonnegative(groups, value_bits=max(1, int(num_groups - 1).bit_length()))
    sorted_groups = groups[order]
    sums = np.zeros((num_groups, feats.shape[1]), dtype=np.float64)
    chunk = 1 << 16  # bounds the temporary gathered rows to chunk x D
    for start in range(0, groups.size, chunk):
        rows_idx = order[start : start + chunk]
        rows = feats[rows_idx].astype(np.float64) * inverse_norms[rows_idx, None]
        chunk_groups = sorted_groups[start : start + chunk]
        run_starts = np.flatnonzero(np.r_[True, chunk_groups[1:] != chunk_groups[:-1]])
        # Rows are sorted by group, so each group is one run here and the fancy += never repeats an index.
        sums[chunk_groups[run_starts]] += np.add.reduceat(rows, run_starts, axis=0)
    counts = np.bincount(groups, minlength=num_groups).astype(np.float64)
    return sums / counts[:, None]


def _inverse_row_norms(features: np.ndarray) -> np.ndarray:
    """1 / ||x_i|| (0 for all-zero rows), float64 (M,); chunked so no (M, D) temporary is made.

    Raises DataError on NaN/inf rows (a diverged encoder), before they can poison a centroid.
    """
    out = np.empty(features.shape[0], dtype=np.float64)
    chunk = 1 << 16
    for start in range(0, features.shape[0], chunk):
        rows = features[start : start + chunk].astype(np.float64)
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        if not np.isfinite(norms).all():
            row = start + int(np.flatnonzero(~np.isfinite(norms))[0])
            raise DataError(
                f"features contain NaN or inf (e.g. row {row}); the embeddings of that stage may have "
                "diverged: lower its learning rate and retrain it."
            )
        out[start : start + chunk] = np.where(norms > 0, 1.0 / np.maximum(norms, 1e-300), 0.0)
    return out


def _nearest_large_group(*, centroids: np.ndarray, small: np.ndarray) -> np.ndarray:
    """For every small group, the id of the large group with the most similar (cosine) centroid."""
    large_ids = np.flatnonzero(~small)
    unit = centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    similarity = unit[small] @ unit[large_ids].T  # (n_small, n_large)
    return large_ids[np.argmax(similarity, axis=1)]


# --------------------------------------------------------------------------------------------------
# batch plans
# --------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------
# torch sampler
# --------------------------------------------------------------------------------------------------
class ClusterBatchSampler(Sampler[list[int]]):
    """A resumable, distributed-safe batch sampler yielding cluster-pure batches (plan_batches).

    Use as ``DataLoader(dataset, batch_sampler=sampler)``; call ``set_epoch(e)`` before each epoch.
    groups=None gives ordinary random batches (the control run) and needs num_samples.

    Resuming: ``state_dict()`` is {"epoch", "batches_consumed"}; after ``load_state_dict`` iteration
    continues at the next unconsumed batch of the same (deterministic) plan. The sampler counts the
    batches it has *yielded*; a DataLoader with workers prefetches ahead of the training step, so a
    trainer should save the number of batches it actually trained on as "batches_consumed".
    ``set_epoch`` with the epoch already set keeps the position (so resume + set_epoch works). The
    first iteration after ``load_state_dict`` yields exactly the unconsumed batches (none if the saved
    epoch was complete); otherwise iterating an epoch that was fully iterated starts it again.
    """

    def __init__(
        self,
        *,
        groups: np.ndarray | None,
        batch_size: int,
        seed: int,
        num_samples: int | None = None,
        world_size: int = 1,
        rank: int = 0,
        remainder_policy: str = "partial",
    ) -> None:
        super().__init__()
        _check_plan_args(
            batch_size=batch_size, seed=seed, epoch=0, world_size=world_size, rank=rank,
            remainder_policy=remainder_policy,
        )
        # Densify once: every epoch's plan_batches call then takes the cheap already-dense path.
        self._groups = None if groups is None else _prepare_groups(groups)[0]
        self._num_samples = num_samples
        if groups is None and not num_samples:
            raise ConfigError("groups=None (random batches) needs num_samples = len(dataset) > 0.")
        self.batch_size = batch_size
        self.seed = seed
        self.world_size = world_size
        self.rank = rank
        self.remainder_policy = remainder_policy
        self.epoch = 0
        self.batches_consumed = 0
        self._plan: BatchPlan | None = None
        self._plan_epoch = -1
        self._resuming = False

    def _current_plan(self) -> BatchPlan:
        if self._plan is None or self._plan_epoch != self.epoch:
            self._plan = plan_batches(
                groups=self._groups, num_samples=self._num_samples, batch_size=self.batch_size,
                seed=self.seed, epoch=self.epoch, world_size=self.world_size, rank=self.rank,
                remainder_policy=self.remainder_policy,
            )
            self._plan_epoch = self.epoch
        return self._plan

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}.")
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches_consumed = 0
            self._resuming = False

    @property
    def stats(self) -> dict:
        """The current epoch plan's stats (see BatchPlan)."""
        return dict(self._current_plan().stats)

    def __len__(self) -> int:
        """Batches in a full epoch (not only the ones left after a resume)."""
        return len(self._current_plan())

    def __iter__(self) -> Iterator[list[int]]:
        plan = self._current_plan()
        if self.batches_consumed >= len(plan) and not self._resuming:
            self.batches_consumed = 0
        self._resuming = False
        while self.batches_consumed < len(plan):
            batch = plan.batch(self.batches_consumed)
            self.batches_consumed += 1
            yield batch.tolist()

    def state_dict(self) -> dict:
        return {"epoch": int(self.epoch), "batches_consumed": int(self.batches_consumed)}

    def load_state_dict(self, state: dict) -> None:
        try:
            epoch, consumed = int(state["epoch"]), int(state["batches_consumed"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(
                f"sampler state {state!r} is not a ClusterBatchSampler state_dict "
                "(needs int 'epoch' and 'batches_consumed'); the checkpoint may be from another sampler."
            ) from exc
        if epoch < 0 or consumed < 0:
            raise DataError(f"sampler state has negative values {state!r}; the checkpoint is corrupt.")
        self.epoch = epoch
        self.batches_consumed = consumed
        self._resuming = True
        if consumed > len(self._current_plan()):
            raise DataError(
                f"sampler state says {consumed} batches were consumed but epoch {epoch} has only "
                f"{len(self._plan)}; the groups, batch size or world size changed since the checkpoint: "
                "resume with the same settings or start the stage afresh."
            )
