"""Pseudo-label groups too small to fill a (global) batch: ``merge_small_groups`` merges each into the
large group with the most similar centroid, pools them into one mixed group, or leaves them as they are,
and counts what it did.
"""
from __future__ import annotations

import numpy as np

from contrastive.errors import ConfigError, DataError
from contrastive.mcl.codes import _argsort_nonnegative, _as_int_codes, _densify, _owned

__all__ = ["merge_small_groups"]

MERGE_POLICIES = ("merge_nearest", "pool", "none")


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
