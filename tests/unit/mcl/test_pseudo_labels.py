"""Tests for contrastive.mcl.pseudo_labels: combining the cluster ids of every earlier stage."""
from __future__ import annotations

import numpy as np
import pytest

from contrastive.errors import ConfigError, DataError
from contrastive.mcl.pseudo_labels import combine_pseudo_labels


def test_combine_two_stages_matches_hand_computed_codes():
    y0 = np.array([0, 0, 1, 1, 0])
    y1 = np.array([1, 0, 1, 1, 1])
    # tuples (0,1) (0,0) (1,1) (1,1) (0,1) numbered lexicographically: (0,0)->0, (0,1)->1, (1,1)->2
    codes = combine_pseudo_labels(stage_assignments=[y0, y1])
    np.testing.assert_array_equal(codes, [1, 0, 2, 2, 1])
    assert codes.dtype == np.int64


def test_combine_three_stages_with_sparse_and_negative_ids():
    y0 = np.array([7, 7, 7, 7, -1, -1])
    y1 = np.array([3, 3, 9, 9, 3, 3])
    y2 = np.array([0, 5, 0, 0, 5, 5])
    # tuples: (7,3,0) (7,3,5) (7,9,0) (7,9,0) (-1,3,5) (-1,3,5)
    # sorted: (-1,3,5)->0, (7,3,0)->1, (7,3,5)->2, (7,9,0)->3
    codes = combine_pseudo_labels(stage_assignments=[y0, y1, y2])
    np.testing.assert_array_equal(codes, [1, 2, 3, 3, 0, 0])


def test_combine_uses_all_stages_not_only_the_last():
    # The public reference code grouped by the last stage only (loop-variable bug).
    y0 = np.array([0, 0, 1, 1])
    y1 = np.array([0, 1, 0, 1])
    combined = combine_pseudo_labels(stage_assignments=[y0, y1])
    last_only = combine_pseudo_labels(stage_assignments=[y1])
    assert np.unique(combined).size == 4
    assert np.unique(last_only).size == 2
    assert not np.array_equal(combined, last_only)


def test_combine_agrees_with_unique_rows_on_random_data():
    rng = np.random.default_rng(1)
    stages = [rng.integers(0, k, size=5000) for k in (3, 5, 4)]
    codes = combine_pseudo_labels(stage_assignments=stages)
    _, expected = np.unique(np.stack(stages, axis=1), axis=0, return_inverse=True)
    np.testing.assert_array_equal(codes, expected.reshape(-1))


def test_combine_huge_id_range_falls_back_to_sorting():
    y0 = np.array([10**15, 0, 10**15, 5])
    y1 = np.array([1, 1, 2, 1])
    np.testing.assert_array_equal(combine_pseudo_labels(stage_assignments=[y0, y1]), [2, 0, 3, 1])


def test_combine_single_stage_relabels_densely_and_does_not_alias_input():
    y0 = np.array([5, 3, 5, 9], dtype=np.int64)
    codes = combine_pseudo_labels(stage_assignments=[y0])
    np.testing.assert_array_equal(codes, [1, 0, 1, 2])
    dense = np.array([0, 1, 1], dtype=np.int64)
    out = combine_pseudo_labels(stage_assignments=[dense])
    out[0] = 99
    assert dense[0] == 0


def test_combine_errors():
    with pytest.raises(ConfigError, match="every earlier stage"):
        combine_pseudo_labels(stage_assignments=[])
    with pytest.raises(ConfigError, match="align"):
        combine_pseudo_labels(stage_assignments=[np.zeros(3, int), np.zeros(4, int)])
    with pytest.raises(DataError, match="integer"):
        combine_pseudo_labels(stage_assignments=[np.zeros(3, dtype=np.float32)])


def test_combine_errors_name_the_stage_and_the_fix():
    with pytest.raises(ConfigError, match=r"^combine_pseudo_labels got no stages; pass the cluster assignments of "
                                          r"every earlier stage\.$"):
        combine_pseudo_labels(stage_assignments=[])
    with pytest.raises(DataError, match=r"^stage_assignments\[1\] must hold integer cluster ids"):
        combine_pseudo_labels(stage_assignments=[np.zeros(3, dtype=np.int64), np.zeros(3)])
    with pytest.raises(ConfigError, match=r"^stage assignments have different lengths \[3, 2\]; align every stage's "
                                          r"assignments to the same sample ids \(align_labels_to_ids\) before "
                                          r"combining\.$"):
        combine_pseudo_labels(stage_assignments=[np.zeros(3, dtype=np.int64), np.zeros(2, dtype=np.int64)])


def test_combining_reaches_the_largest_code_of_every_radix():
    """Every tuple of 2 x 3 x 2 present: the codes are 0..11 in lexicographic order (stage 0 most significant)."""
    grid = np.array([(a, b, c) for a in range(2) for b in range(3) for c in range(2)])[::-1]
    codes = combine_pseudo_labels(stage_assignments=[grid[:, 0], grid[:, 1], grid[:, 2]])
    np.testing.assert_array_equal(codes, np.arange(12)[::-1])
