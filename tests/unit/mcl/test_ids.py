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


# ----------------------------------------------------------------- the paths taken, their edges, the messages
def test_the_scatter_path_applies_to_compact_int_ids_and_non_negative_int_labels():
    """``_scatter_int_labels`` returns labels (in the labels' dtype) where it applies, else None for the general
    path: any id range start (not only 0), a label 0, a single id, gaps between ids; not for float labels, no ids,
    a range wider than max(2 L, 2^22), dataset ids outside the labelled range or between labelled ids."""
    from contrastive.mcl.ids import _scatter_int_labels as scatter

    def run(label_ids, labels, dataset_ids):
        return scatter(label_ids=np.array(label_ids, dtype=np.int64), labels=np.array(labels),
                       dataset_ids=np.array(dataset_ids, dtype=np.int64))
    out = run([5, 3, 4], np.array([0, 2, 1], dtype=np.int32), [4, 5, 3, 3])
    assert out.dtype == np.int32 and out.tolist() == [1, 0, 2, 2]
    assert run([7], [2], [7]).tolist() == [2] and run([3, 5], [1, 0], [5, 3]).tolist() == [0, 1]
    assert run([10**7 + 1, 10**7], [1, 0], [10**7]).tolist() == [0]  # a far range start, a narrow range
    assert run([0, (1 << 22) - 1], [1, 2], [(1 << 22) - 1]).tolist() == [2]  # a range of 2^22: a table
    assert run([0, 1], np.array([2**62 + 1, 0]), [0]).tolist() == [2**62 + 1]  # int64 labels kept exactly
    for label_ids, labels, dataset_ids in [([0, 1], [0.5, 1.5], [0]), ([], np.array([], dtype=np.int64), [0]),
                                           ([0, 1 << 22], [1, 2], [0]),
                                           ([0, 1], [1, -1], [0]), ([3, 4], [1, 2], [5]), ([3, 4], [1, 2], [2]),
                                           ([3, 5], [1, 2], [4])]:
        assert run(label_ids, np.array(labels), dataset_ids) is None, (label_ids, labels, dataset_ids)


def test_the_joins_mark_a_missing_id_minus_one_and_handle_one_id_and_none(monkeypatch):
    from contrastive.mcl import ids

    def no_sort(**_):
        raise AssertionError("a compact range joins by its lookup table")
    int64 = lambda *values: np.array(values, dtype=np.int64)  # noqa: E731
    assert ids._join_int_ids(label_ids=int64(), dataset_ids=int64(1, 2)).tolist() == [-1, -1]
    assert ids._join_sorted_ids(label_ids=np.array(["a"]), dataset_ids=np.array(["b", "a"])).tolist() == [-1, 0]
    monkeypatch.setattr(ids, "_join_sorted_ids", no_sort)
    assert ids._join_int_ids(label_ids=int64(7), dataset_ids=int64(7)).tolist() == [0]
    assert ids._join_int_ids(label_ids=int64(0, 1, 2), dataset_ids=int64(3)).tolist() == [-1]  # just past the end
    assert ids._join_int_ids(label_ids=int64(5, 6), dataset_ids=int64(4, 6, 7)).tolist() == [-1, 1, -1]
    assert ids._join_int_ids(label_ids=int64(3, 5), dataset_ids=int64(4, 5)).tolist() == [-1, 1]  # a gap
    far = 10**7 + int64(2, 0, 1)
    assert ids._join_int_ids(label_ids=far, dataset_ids=far[::-1]).tolist() == [2, 1, 0]
    assert ids._join_int_ids(label_ids=int64(0, (1 << 22) - 1), dataset_ids=int64(0)).tolist() == [0]


def test_the_int_sort_of_ids_is_numpys_stable_argsort():
    from contrastive.mcl.ids import _argsort_ids
    rng = np.random.default_rng(3)
    for ids in (rng.integers(-50, 50, size=200), rng.integers(-(2**62), 2**62, size=50),
                np.array([-(2**62), 0, 2**62 - 1, 5, -3]), np.array([2**63 - 1, -(2**63), 0, 1, -1]),
                2**59 - 1 + np.array([10, 0, 3, 1, 7]),  # shifted by -lo, not +lo: packed keys that overflow
                np.array([-(2**61), 2**61 - 1, 0, 5, -3])):  # value bits of hi - lo, not hi + lo
        np.testing.assert_array_equal(_argsort_ids(ids), np.argsort(ids, kind="stable"))


def test_ids_of_other_kinds_join_where_they_can_and_are_refused_where_they_cannot():
    """uint ids join int ones (both numbers); uint64 ids past int64's range are not wrapped onto negative ids;
    object ids are read as strings; StringDType ids join UTF-8 bytes ids."""
    labels = np.array([10, 20])
    assert align_labels_to_ids(label_ids=np.array([2, 1], dtype=np.uint32), labels=labels,
                               dataset_ids=np.array([1, 2])).tolist() == [20, 10]
    with pytest.raises(DataError, match="1 of 1 dataset ids have no label"):
        align_labels_to_ids(label_ids=np.array([2**64 - 5], dtype=np.uint64), labels=labels[:1],
                            dataset_ids=np.array([-5]))
    assert align_labels_to_ids(label_ids=np.array([1, "a"], dtype=object), labels=labels,
                               dataset_ids=np.array(["a", "1"])).tolist() == [20, 10]
    strings = np.array(["b", "a"], dtype=np.dtypes.StringDType())
    assert align_labels_to_ids(label_ids=strings, labels=labels,
                               dataset_ids=np.array([b"a", b"b"])).tolist() == [20, 10]


def test_aligned_ids_return_the_labels_themselves_and_the_messages_are_exact():
    labels = np.array([4, 3, 2])
    assert align_labels_to_ids(label_ids=np.arange(3), labels=labels, dataset_ids=np.arange(3)) is labels
    cases = [(dict(label_ids=np.zeros((2, 2)), labels=labels, dataset_ids=np.arange(3)),
              "label_ids must be a 1-D array of sample ids, got shape (2, 2)."),
             (dict(label_ids=np.arange(3), labels=labels, dataset_ids=np.zeros((1, 3))),
              "dataset_ids must be a 1-D array of sample ids, got shape (1, 3)."),
             (dict(label_ids=np.arange(2), labels=labels, dataset_ids=np.arange(2)),
              "labels has 3 rows but label_ids has 2; save the ids together with the assignments they belong to."),
             (dict(label_ids=np.arange(2), labels=np.array(5), dataset_ids=np.arange(2)),
              "labels has 0 rows but label_ids has 2; save the ids together with the assignments they belong to."),
             (dict(label_ids=np.arange(3), labels=labels, dataset_ids=np.array(["0"])),
              "label ids are int64 but dataset ids are <U1; use the same id type (e.g. both str) when exporting "
              "embeddings and when loading the dataset."),
             (dict(label_ids=np.array([0, 0, 1, 1, 2, 2, 3, 3]), labels=np.zeros(8), dataset_ids=np.arange(2)),
              "4 label ids are duplicated (e.g. [0, 1, 2]); sample ids must be unique: fix the dataset's id column "
              "and re-run the clustering stage."),
             (dict(label_ids=np.array([0, 0, 1, 1, 2, 2, 3, 3]) * 10**15, labels=np.zeros(8),
                   dataset_ids=np.arange(2)),
              "4 label ids are duplicated (e.g. [0, 1000000000000000, 2000000000000000]); sample ids must be "
              "unique: fix the dataset's id column and re-run the clustering stage."),
             (dict(label_ids=np.arange(3), labels=labels, dataset_ids=np.array([0, 7])),
              "1 of 2 dataset ids have no label (e.g. [7]); the labels were computed for a different dataset: "
              "re-run the clustering stage for this dataset.")]
    for kwargs, message in cases:
        with pytest.raises(DataError) as refused:
            align_labels_to_ids(**kwargs)
        assert str(refused.value) == message


def test_compact_int_ids_with_int_labels_are_aligned_by_the_scatter_alone(monkeypatch):
    from contrastive.mcl import ids

    def no_join(**_):
        raise AssertionError("compact int ids with int labels need no join")
    monkeypatch.setattr(ids, "_join_int_ids", no_join)
    monkeypatch.setattr(ids, "_join_sorted_ids", no_join)
    assert align_labels_to_ids(label_ids=np.array([2, 0, 1]), labels=np.array([7, 5, 6]),
                               dataset_ids=np.array([1, 2])).tolist() == [6, 7]
