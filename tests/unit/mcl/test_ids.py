"""Tests for contrastive.mcl.ids: aligning labels to the dataset's sample ids."""
from __future__ import annotations

import numpy as np
import pytest

from contrastive.errors import DataError
from contrastive.mcl.ids import align_labels_to_ids


def test_align_labels_to_permuted_string_ids():
    label_ids = np.array(["c", "a", "b", "d"])
    labels = np.array([30, 10, 20, 40])
    dataset_ids = np.array(["a", "b", "c", "d"])
    np.testing.assert_array_equal(
        align_labels_to_ids(label_ids=label_ids, labels=labels, dataset_ids=dataset_ids), [10, 20, 30, 40]
    )


def test_align_int_ids_subset_and_2d_labels():
    label_ids = np.array([40, 10, 30, 20])
    labels = np.array([[4, 4], [1, 1], [3, 3], [2, 2]])
    out = align_labels_to_ids(label_ids=label_ids, labels=labels, dataset_ids=np.array([20, 40]))
    np.testing.assert_array_equal(out, [[2, 2], [4, 4]])


def test_align_sparse_int_ids_use_the_sort_merge_join():
    rng = np.random.default_rng(0)
    ids = rng.choice(10**15, size=500, replace=False) - 10**14  # far too sparse for a lookup table
    labels = rng.integers(0, 7, size=500)
    perm = rng.permutation(500)
    out = align_labels_to_ids(label_ids=ids[perm], labels=labels[perm], dataset_ids=ids[::-1])
    np.testing.assert_array_equal(out, labels[::-1])
    with pytest.raises(DataError, match="1 of 2 dataset ids"):
        align_labels_to_ids(label_ids=ids, labels=labels, dataset_ids=np.array([ids[3], 10**15 + 1]))


def test_align_fast_path_when_ids_equal():
    ids = np.arange(5)
    labels = np.array([4, 3, 2, 1, 0])
    out = align_labels_to_ids(label_ids=ids, labels=labels, dataset_ids=ids.copy())
    np.testing.assert_array_equal(out, labels)


def test_align_missing_ids_error_names_count_examples_and_fix():
    with pytest.raises(DataError) as info:
        align_labels_to_ids(
            label_ids=np.array(["a", "b"]), labels=np.array([0, 1]),
            dataset_ids=np.array(["a", "x", "y", "z", "w"]),
        )
    message = str(info.value)
    assert "4 of 5 dataset ids have no label" in message
    assert "'x'" in message and "'w'" not in message  # at most 3 examples
    assert "re-run the clustering stage" in message


def test_align_duplicate_label_ids_and_mismatched_types():
    with pytest.raises(DataError, match="duplicated"):
        align_labels_to_ids(label_ids=np.array([1, 2, 2]), labels=np.zeros(3), dataset_ids=np.array([2, 1]))
    with pytest.raises(DataError, match=r"1 label ids are duplicated \(e.g. \['b'\]\)"):
        align_labels_to_ids(label_ids=np.array(["b", "a", "b"]), labels=np.zeros(3), dataset_ids=np.array(["a"]))
    with pytest.raises(DataError, match="same id type"):
        align_labels_to_ids(label_ids=np.array(["1", "2"]), labels=np.zeros(2), dataset_ids=np.array([2, 1]))
    with pytest.raises(DataError, match="rows"):
        align_labels_to_ids(label_ids=np.array([1, 2]), labels=np.zeros(3), dataset_ids=np.array([2, 1]))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.uint64, np.int16])
def test_align_int_labels_scatter_path_matches_a_dict_lookup(dtype):
    # Non-negative 1-D integer labels with compact int ids take the one-scatter path; negative labels,
    # uint64 and float labels take the row-join path. All must agree with a plain dict lookup.
    rng = np.random.default_rng(1)
    ids = rng.permutation(1000).astype(np.int64) + 5_000  # compact range, not starting at 0
    labels = rng.integers(0, 100, size=1000).astype(dtype)
    dataset_ids = rng.permutation(ids)[:700]
    expected = np.array([dict(zip(ids.tolist(), labels.tolist()))[i] for i in dataset_ids.tolist()])
    out = align_labels_to_ids(label_ids=ids, labels=labels, dataset_ids=dataset_ids)
    assert out.dtype == labels.dtype
    np.testing.assert_array_equal(out, expected)
    signed = labels.astype(np.int64) - 50  # negative labels: the general path
    np.testing.assert_array_equal(align_labels_to_ids(label_ids=ids, labels=signed, dataset_ids=dataset_ids),
                                  expected - 50)


def test_align_int_labels_errors_match_the_general_path():
    ids = np.array([3, 1, 2, 2])
    with pytest.raises(DataError, match=r"1 label ids are duplicated \(e.g. \[2\]\)"):
        align_labels_to_ids(label_ids=ids, labels=np.array([0, 1, 2, 3]), dataset_ids=np.array([1, 2]))
    ids = np.array([3, 1, 2, 5])  # 4 is a gap inside the range, 9 lies outside it
    for missing in (4, 9):
        with pytest.raises(DataError, match=rf"1 of 3 dataset ids have no label \(e.g. \[{missing}\]\)"):
            align_labels_to_ids(label_ids=ids, labels=np.array([0, 1, 2, 3]), dataset_ids=np.array([1, missing, 3]))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 9, 17, 100])
def test_the_stable_argsort_of_nonnegative_values_is_numpys_stable_argsort(size):
    """Every size around a power of two (the index bits), many ties, and value bits that fill the int64 exactly
    (63 in all: the packed path) or overflow it (64: torch's stable sort)."""
    from contrastive.mcl.codes import _argsort_nonnegative
    rng = np.random.default_rng(size)
    index_bits = max(1, (size - 1).bit_length())
    for value_bits in (3, 63 - index_bits, 64 - index_bits):
        values = rng.integers(0, 4, size=size, dtype=np.int64) << (value_bits - 2)  # ties, top bits used
        got = _argsort_nonnegative(values, value_bits=value_bits)
        np.testing.assert_array_equal(got, np.argsort(values, kind="stable"))
