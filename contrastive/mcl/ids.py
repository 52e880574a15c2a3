"""Joining labels to sample ids: ``align_labels_to_ids`` reorders labels computed for one list of sample ids
(e.g. by clustering) into the order of the dataset being trained on, by id and never by position, with a
lookup table for compact int ids, a sort-merge join otherwise, and errors that name missing or duplicated ids.
"""
from __future__ import annotations

import numpy as np

from contrastive.errors import DataError
from contrastive.mcl.codes import _DENSE_RANGE_FACTOR, _DENSE_RANGE_MIN, _argsort_nonnegative

__all__ = ["align_labels_to_ids"]


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
    label_ids, dataset_ids = _same_string_kind(label_ids, dataset_ids)
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


def _same_string_kind(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as ``<U`` when either holds StringDType strings (a prepared dataset's ids) and the other strings of any
    kind (``<U`` or UTF-8 ``S`` ids read from an export, clusters or pseudo-labels): numpy sorts and searches only
    within one string kind, and its ``searchsorted`` on StringDType arrays of more than a few elements returns
    wrong positions (numpy 2.4 here: every query past the end; numpy issue #31533, fixed in 2.5), so the join runs
    on ``<U``."""
    from contrastive.data.dataset import as_string_array, saveable_ids
    kinds = {a.dtype.kind, b.dtype.kind}
    if "T" in kinds and kinds <= {"T", "U", "S"}:
        return tuple(saveable_ids(as_string_array(x)) if x.dtype.kind in ("T", "S") else x for x in (a, b))
    return a, b


def _check_id_kinds(*, label_ids: np.ndarray, dataset_ids: np.ndarray) -> None:
    numeric = {"i", "u"}
    if (label_ids.dtype.kind in numeric) != (dataset_ids.dtype.kind in numeric):
        raise DataError(
            f"label ids are {label_ids.dtype} but dataset ids are {dataset_ids.dtype}; use the same id type "
            "(e.g. both str) when exporting embeddings and when loading the dataset."
        )
