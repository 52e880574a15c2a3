"""Tests for contrastive.mcl.small_groups: merging, pooling or keeping groups too small for a batch."""
from __future__ import annotations

import numpy as np
import pytest

from contrastive.errors import ConfigError, DataError
from contrastive.mcl.small_groups import merge_small_groups


@pytest.fixture
def small_group_case():
    # groups 10 and 20 are large (5 samples), 30 (2 samples, points near group 10's direction) and
    # 40 (1 sample, near group 20's direction) are small for min_size=3.
    groups = np.array([10] * 5 + [20] * 5 + [30] * 2 + [40])
    features = np.array(
        [[1.0, 0.0]] * 5 + [[0.0, 2.0]] * 5 + [[3.0, 0.4], [0.9, 0.1]] + [[0.2, 1.0]]
    )
    return groups, features


def test_merge_nearest_joins_the_most_similar_large_group(small_group_case):
    groups, features = small_group_case
    merged, stats = merge_small_groups(groups=groups, features=features, min_size=3, policy="merge_nearest")
    np.testing.assert_array_equal(merged, [0] * 5 + [1] * 5 + [0, 0] + [1])
    assert stats == {
        "policy": "merge_nearest", "groups_before": 4, "groups_after": 2, "small_groups": 2,
        "samples_in_small_groups": 3, "merged_all_into_one": 0,
    }


def test_merge_pool_puts_small_groups_in_one_new_group(small_group_case):
    groups, _ = small_group_case
    merged, stats = merge_small_groups(groups=groups, features=None, min_size=3, policy="pool")
    np.testing.assert_array_equal(merged, [0] * 5 + [1] * 5 + [2, 2, 2])
    assert stats["groups_after"] == 3 and stats["small_groups"] == 2 and stats["policy"] == "pool"


def test_merge_none_only_relabels(small_group_case):
    groups, _ = small_group_case
    merged, stats = merge_small_groups(groups=groups, features=None, min_size=3, policy="none")
    np.testing.assert_array_equal(merged, [0] * 5 + [1] * 5 + [2, 2, 3])
    assert stats["groups_before"] == stats["groups_after"] == 4
    assert stats["samples_in_small_groups"] == 3


def test_merge_nearest_when_no_group_is_large_merges_everything(small_group_case):
    groups, features = small_group_case
    merged, stats = merge_small_groups(groups=groups, features=features, min_size=100, policy="merge_nearest")
    np.testing.assert_array_equal(merged, np.zeros(groups.size))
    assert stats["merged_all_into_one"] == 1 and stats["groups_after"] == 1 and stats["small_groups"] == 4


def test_merge_errors(small_group_case):
    groups, features = small_group_case
    with pytest.raises(ConfigError, match="use one of"):
        merge_small_groups(groups=groups, features=features, min_size=3, policy="nearest")
    with pytest.raises(ConfigError, match="needs features"):
        merge_small_groups(groups=groups, features=None, min_size=3, policy="merge_nearest")
    with pytest.raises(DataError, match="shape"):
        merge_small_groups(groups=groups, features=features[:4], min_size=3, policy="merge_nearest")
    for bad in (np.nan, np.inf):
        broken = features.copy()
        broken[11, 0] = bad
        with pytest.raises(DataError, match="learning rate"):
            merge_small_groups(groups=groups, features=broken, min_size=3, policy="merge_nearest")
