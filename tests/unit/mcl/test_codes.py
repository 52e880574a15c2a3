"""Tests for contrastive.mcl.codes: the integer-code helpers that pseudo-labels, batch plans and small-group merges
share (checked alone here: each caller's tests reach only the paths its inputs take)."""
from __future__ import annotations

import numpy as np
import pytest

from contrastive.errors import DataError
from contrastive.mcl.codes import _as_int_codes, _densify


def test_densify_keeps_the_order_of_negative_and_sparse_codes_and_an_empty_array_has_no_groups():
    dense, count = _densify(np.array([-5, 3, -5, 0], dtype=np.int64))  # the small-range (bincount) path
    np.testing.assert_array_equal(dense, [0, 2, 0, 1])
    assert count == 3 and dense.dtype == np.int64
    dense, count = _densify(np.array([10 ** 12, 5, 10 ** 12]))  # a range too wide for bincount: np.unique
    np.testing.assert_array_equal(dense, [1, 0, 1])
    assert count == 2
    empty, count = _densify(np.zeros(0, dtype=np.int64))
    assert empty.shape == (0,) and empty.dtype == np.int64 and count == 0


def test_integer_codes_refuse_other_shapes_and_kinds_and_uint64_beyond_int64():
    with pytest.raises(DataError, match=r"^labels must be a 1-D array of integer ids, got shape \(2, 2\)\.$"):
        _as_int_codes(np.zeros((2, 2), dtype=np.int64), name="labels")
    with pytest.raises(DataError, match=r"^labels must hold integer cluster ids, got dtype float64; pass the k-means "
                                        r"assignments \(int64\), not features or strings\.$"):
        _as_int_codes(np.array([0.5]), name="labels")
    largest = np.iinfo(np.int64).max
    np.testing.assert_array_equal(_as_int_codes(np.array([0, largest], dtype=np.uint64), name="labels"), [0, largest])
    with pytest.raises(DataError, match=r"^labels holds ids larger than int64 can represent; relabel them densely\.$"):
        _as_int_codes(np.array([largest + 1], dtype=np.uint64), name="labels")
    assert _as_int_codes(np.zeros(0, dtype=np.uint64), name="labels").dtype == np.int64  # empty: no max to read
    np.testing.assert_array_equal(_as_int_codes(np.array([True, False]), name="labels"), [1, 0])
