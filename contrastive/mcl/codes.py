"""Integer codes shared by the MCL modules: check that an array holds integer ids, relabel codes densely
(0..G-1, order kept) and argsort non-negative int64 keys stably, all vectorised numpy in O(M) memory.
"""
from __future__ import annotations

import numpy as np
import torch

from contrastive.errors import DataError

# A bincount-based relabelling allocates one int64 per possible code; above this many codes per
# sample it is cheaper (in memory) to fall back to a sort-based np.unique.
_DENSE_RANGE_FACTOR = 2
_DENSE_RANGE_MIN = 1 << 22


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
