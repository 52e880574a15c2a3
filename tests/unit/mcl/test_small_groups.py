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


def _unit_rows(features: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(features.astype(np.float64), axis=1, keepdims=True)
    return np.divide(features, norms, out=np.zeros_like(features, dtype=np.float64), where=norms > 0)


def test_group_centroids_are_the_means_of_the_unit_rows_across_chunks():
    """An independent numpy reference, over more rows than one chunk (65,536) and an all-zero row (counted as 0)."""
    from contrastive.mcl.small_groups import _group_centroids, _inverse_row_norms
    rng = np.random.default_rng(0)
    rows = (1 << 16) + 37
    features = rng.standard_normal((rows, 3)).astype(np.float32)
    features[5] = 0.0
    groups = rng.integers(0, 5, size=rows)
    unit = _unit_rows(features)
    expected = np.stack([unit[groups == g].mean(axis=0) for g in range(5)])
    np.testing.assert_allclose(_group_centroids(groups=groups, num_groups=5, features=features), expected, rtol=1e-9,
                               atol=1e-12)
    norms = np.linalg.norm(features.astype(np.float64), axis=1)
    np.testing.assert_allclose(_inverse_row_norms(features), np.where(norms > 0, 1 / np.where(norms > 0, norms, 1), 0))
    features[(1 << 16) + 3, 1] = np.nan  # in the second chunk: the message names its row
    with pytest.raises(DataError, match=rf"^features contain NaN or inf \(e\.g\. row {(1 << 16) + 3}\); the embeddings "
                                        r"of that stage may have diverged: lower its learning rate and retrain it\.$"):
        _inverse_row_norms(features)


def test_min_size_1_keeps_every_group_and_the_result_never_aliases_the_callers_array():
    groups = np.array([0, 0, 1, 2, 2], dtype=np.int64)  # already dense int64: densifying may return it as is
    for policy in ("none", "pool", "merge_nearest"):
        merged, stats = merge_small_groups(groups=groups, features=np.eye(5)[:, :3], min_size=1, policy=policy)
        np.testing.assert_array_equal(merged, groups)
        assert stats["small_groups"] == 0 and not np.shares_memory(merged, groups)


def test_merge_errors_name_the_setting_and_the_fix(small_group_case):
    groups, features = small_group_case
    with pytest.raises(ConfigError, match=r"^unknown small-group policy 'nearest'; use one of "
                                          r"merge_nearest, pool, none\.$"):
        merge_small_groups(groups=groups, features=features, min_size=3, policy="nearest")
    with pytest.raises(ConfigError, match=r"^min_size must be >= 1, got 0\.$"):
        merge_small_groups(groups=groups, features=features, min_size=0, policy="pool")
    with pytest.raises(ConfigError, match=r'^policy "merge_nearest" needs features; pass the embeddings or use '
                                          r'policy "pool"\.$'):
        merge_small_groups(groups=groups, features=None, min_size=3, policy="merge_nearest")
    with pytest.raises(DataError, match=r"got \(4, 2\); pass the embeddings the groups were computed from, in the "
                                        r"same sample order\.$"):
        merge_small_groups(groups=groups, features=features[:4], min_size=3, policy="merge_nearest")
    with pytest.raises(DataError, match=r"^groups must hold integer cluster ids"):
        merge_small_groups(groups=np.array([0.5, 1.5]), features=None, min_size=1, policy="none")


def test_the_nearest_large_group_is_by_angle_not_by_how_tight_a_group_is():
    """A spread large group has a short mean (0.1 here) but points the small group's way: cosine picks it over a
    tight group (norm 1) a little further in angle; a dot product of unnormalised centroids would not."""
    from contrastive.mcl.small_groups import _nearest_large_group
    centroids = np.array([[1.0, 0.3], [0.1, 0.0], [0.8, 0.6]])  # small, large and spread, large and tight
    nearest = _nearest_large_group(centroids=centroids, small=np.array([True, False, False]))
    np.testing.assert_array_equal(nearest, [1])
