"""Tests for contrastive.sampling: pseudo-label combination and cluster-pure batch plans (MCL Alg. 1)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import contrastive.sampling as sampling
from contrastive.errors import ConfigError, DataError
from contrastive.sampling import (
    BatchPlan,
    ClusterBatchSampler,
    align_labels_to_ids,
    combine_pseudo_labels,
    merge_small_groups,
    plan_batches,
    plan_batches_reference,
)


def _groups_with_sizes(sizes: list[int], *, seed: int = 0) -> np.ndarray:
    """Group ids with the given group sizes, in a shuffled sample order."""
    groups = np.repeat(np.arange(len(sizes)), sizes)
    return np.random.default_rng(seed).permutation(groups)


def _check_plan(plan: BatchPlan, groups: np.ndarray) -> None:
    """Invariants every plan must satisfy: pure batches, no repeats, consistent bookkeeping."""
    assert plan.indices.dtype == np.int64 and plan.offsets.dtype == np.int64
    assert plan.offsets[0] == 0 and plan.offsets[-1] == plan.indices.size
    assert len(plan) == plan.stats["num_batches"] == plan.group_of_batch.size
    assert np.unique(plan.indices).size == plan.indices.size, "a sample appears twice in one epoch"
    for i, batch in enumerate(plan):
        assert batch.size >= 2
        g = plan.group_of_batch[i]
        if g >= 0:
            assert np.all(groups[batch] == groups[batch[0]]), "a group-pure batch mixes groups"
    assert plan.stats["samples_planned"] == plan.indices.size
    stats = plan.stats
    assert stats["samples_planned_global"] + stats["samples_dropped"] == groups.size


# ---------------------------------------------------------------- combine_pseudo_labels
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


# ---------------------------------------------------------------- align_labels_to_ids
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


# ---------------------------------------------------------------- merge_small_groups
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


# ---------------------------------------------------------------- plan_batches
def test_partial_remainders_hand_computed():
    # sizes 10, 7, 3, 1 with B=4: full batches 2, 1, 0, 0; remainders 2, 3, 3, 1 -> kept 2, 3, 3, dropped 1
    groups = _groups_with_sizes([10, 7, 3, 1])
    plan = plan_batches(groups=groups, batch_size=4, seed=0, epoch=0, remainder_policy="partial")
    _check_plan(plan, groups)
    assert len(plan) == 6
    assert sorted(len(b) for b in plan) == [2, 3, 3, 4, 4, 4]
    assert plan.stats["samples_dropped"] == 1 and plan.stats["samples_pooled"] == 0
    assert plan.stats["groups"] == 4 and plan.stats["groups_smaller_than_batch"] == 2
    assert np.array_equal(np.sort(plan.group_of_batch), [0, 0, 0, 1, 1, 2])


def test_pool_remainders_hand_computed():
    # remainders 2 + 3 + 3 + 1 = 9 pooled -> two mixed batches of 4, 1 sample dropped
    groups = _groups_with_sizes([10, 7, 3, 1])
    plan = plan_batches(groups=groups, batch_size=4, seed=0, epoch=0, remainder_policy="pool")
    _check_plan(plan, groups)
    assert len(plan) == 5 and all(len(b) == 4 for b in plan)
    assert (plan.group_of_batch == -1).sum() == 2
    assert plan.stats["samples_pooled"] == 8 and plan.stats["samples_dropped"] == 1


def test_drop_remainders_hand_computed():
    groups = _groups_with_sizes([10, 7, 3, 1])
    plan = plan_batches(groups=groups, batch_size=4, seed=0, epoch=0, remainder_policy="drop")
    _check_plan(plan, groups)
    assert len(plan) == 3 and plan.stats["samples_dropped"] == 9 and plan.stats["samples_planned"] == 12


@pytest.mark.parametrize("policy", ["partial", "pool", "drop"])
def test_plan_invariants_and_closed_form_counts(policy):
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 60, size=40).tolist()
    groups = _groups_with_sizes(sizes, seed=4)
    b, world = 8, 1
    plan = plan_batches(groups=groups, batch_size=b, seed=5, epoch=2, remainder_policy=policy)
    _check_plan(plan, groups)
    n = np.array(sizes)
    full = n // b
    rem = n % b
    if policy == "partial":
        kept = np.where(rem >= 2 * world, rem, 0)
        assert plan.stats["samples_planned"] == int((full * b + kept).sum())
        assert len(plan) == int(full.sum() + (kept > 0).sum())
    elif policy == "pool":
        pooled = int(rem.sum())
        last = pooled % b
        assert plan.stats["samples_pooled"] == pooled - (last if last < 2 else 0)
        assert len(plan) == int(full.sum()) + pooled // b + (last >= 2)
    else:
        assert plan.stats["samples_dropped"] == int(rem.sum())
    assert plan.stats["groups_smaller_than_batch"] == int((n < b).sum())


def test_same_seed_same_plan_and_reshuffle_per_epoch_and_seed():
    groups = _groups_with_sizes([50, 40, 30])
    a = plan_batches(groups=groups, batch_size=8, seed=1, epoch=0)
    b = plan_batches(groups=groups, batch_size=8, seed=1, epoch=0)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.group_of_batch, b.group_of_batch)
    for other in (plan_batches(groups=groups, batch_size=8, seed=1, epoch=1),
                  plan_batches(groups=groups, batch_size=8, seed=2, epoch=0)):
        assert not np.array_equal(a.indices, other.indices)
        # Same samples, new batches: same multiset of sample ids, different batch membership.
        np.testing.assert_array_equal(np.sort(a.indices), np.sort(other.indices))
        assert {frozenset(x.tolist()) for x in a} != {frozenset(x.tolist()) for x in other}


def test_groups_are_interleaved_not_consecutive():
    groups = _groups_with_sizes([80] * 4)
    plan = plan_batches(groups=groups, batch_size=4, seed=0, epoch=0)
    runs = 1 + int((np.diff(plan.group_of_batch) != 0).sum())
    assert runs > 20  # 80 batches of 4 groups; sorted order would give 4 runs


def test_groups_none_gives_random_full_batches_over_all_samples():
    # 101 = 10 full batches + 1 sample, too few for a partial batch: dropped and counted
    plan = plan_batches(groups=None, num_samples=101, batch_size=10, seed=0, epoch=0)
    _check_plan(plan, np.zeros(101, dtype=np.int64))
    assert len(plan) == 10 and plan.stats["groups"] == 1 and plan.stats["samples_dropped"] == 1
    assert not np.array_equal(plan.indices[:10], np.arange(10))


def test_plan_batch_accessors():
    groups = _groups_with_sizes([6, 6])
    plan = plan_batches(groups=groups, batch_size=3, seed=0, epoch=0)
    batches = list(plan)
    np.testing.assert_array_equal(plan.batch(1), batches[1])
    np.testing.assert_array_equal(plan.batch(-1), batches[-1])
    with pytest.raises(IndexError):
        plan.batch(len(plan))


def test_plan_argument_errors():
    groups = np.zeros(8, dtype=np.int64)
    with pytest.raises(ConfigError, match="batch_size"):
        plan_batches(groups=groups, batch_size=0, seed=0, epoch=0)
    with pytest.raises(ConfigError, match="rank"):
        plan_batches(groups=groups, batch_size=2, seed=0, epoch=0, world_size=2, rank=2)
    with pytest.raises(ConfigError, match="remainder_policy"):
        plan_batches(groups=groups, batch_size=2, seed=0, epoch=0, remainder_policy="keep")
    with pytest.raises(ConfigError, match="num_samples"):
        plan_batches(groups=None, batch_size=2, seed=0, epoch=0)
    with pytest.raises(DataError, match="empty"):
        plan_batches(groups=np.zeros(0, dtype=np.int64), batch_size=2, seed=0, epoch=0)


# ---------------------------------------------------------------- distributed
@pytest.mark.parametrize("policy", ["partial", "pool", "drop"])
def test_ranks_are_disjoint_equal_length_and_cover_the_single_process_plan(policy):
    groups = _groups_with_sizes([37, 25, 16, 9, 3])
    world, b = 2, 4
    plans = [
        plan_batches(
            groups=groups, batch_size=b, seed=7, epoch=3, world_size=world, rank=r, remainder_policy=policy
        )
        for r in range(world)
    ]
    for plan in plans:
        _check_plan(plan, groups)
    assert len(plans[0]) == len(plans[1])
    np.testing.assert_array_equal(np.diff(plans[0].offsets), np.diff(plans[1].offsets))
    np.testing.assert_array_equal(plans[0].group_of_batch, plans[1].group_of_batch)
    assert not set(plans[0].indices.tolist()) & set(plans[1].indices.tolist())
    for i in range(len(plans[0])):  # the i-th batches of all ranks form one pure global batch
        joined = np.concatenate([p.batch(i) for p in plans])
        if plans[0].group_of_batch[i] >= 0:
            assert np.unique(groups[joined]).size == 1
    stats = plans[0].stats
    assert stats["samples_planned_global"] == world * stats["samples_planned"]
    assert stats["samples_planned_global"] + stats["samples_dropped"] == groups.size

    single = plan_batches(groups=groups, batch_size=world * b, seed=7, epoch=3, remainder_policy=policy)
    full_single = {
        frozenset(x.tolist()) for x, g in zip(single, single.group_of_batch) if len(x) == world * b and g >= 0
    }
    full_ranks = {
        frozenset(np.concatenate([p.batch(i) for p in plans]).tolist())
        for i in range(len(plans[0]))
        if len(plans[0].batch(i)) == b and plans[0].group_of_batch[i] >= 0
    }
    assert full_ranks == full_single


def test_distributed_partial_remainder_split_evenly():
    # one group of 13 with world 3, b 2: one global batch of 6, remainder 7 -> 2 per rank, 1 dropped
    groups = np.zeros(13, dtype=np.int64)
    plans = [plan_batches(groups=groups, batch_size=2, seed=0, epoch=0, world_size=3, rank=r) for r in range(3)]
    assert all(sorted(np.diff(p.offsets).tolist()) == [2, 2] for p in plans)
    assert plans[0].stats["samples_dropped"] == 1
    assert np.unique(np.concatenate([p.indices for p in plans])).size == 12


# ---------------------------------------------------------------- reference agreement
@pytest.mark.parametrize("policy", ["partial", "pool", "drop"])
@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1), (3, 0)])
def test_vectorised_plan_equals_reference(policy, world, rank):
    groups = _groups_with_sizes([31, 17, 12, 5, 2, 1], seed=9) * 3 + 100  # sparse, non-zero-based ids
    kwargs = dict(
        groups=groups, batch_size=3, seed=11, epoch=4, world_size=world, rank=rank, remainder_policy=policy
    )
    fast, slow = plan_batches(**kwargs), plan_batches_reference(**kwargs)
    np.testing.assert_array_equal(fast.indices, slow.indices)
    np.testing.assert_array_equal(fast.offsets, slow.offsets)
    np.testing.assert_array_equal(fast.group_of_batch, slow.group_of_batch)
    assert fast.stats == slow.stats


def test_reference_agreement_with_unpacked_sort_keys(monkeypatch):
    # Force the (group | random) key + torch stable argsort path used when M * G is too large to pack.
    monkeypatch.setattr(sampling, "_MIN_PACKED_RANDOM_BITS", 64)
    assert sampling._shuffle_key_layout(num_groups=4, num_samples=100)[1] == 0
    groups = _groups_with_sizes([20, 13, 7, 4])
    kwargs = dict(groups=groups, batch_size=4, seed=0, epoch=1)
    fast, slow = plan_batches(**kwargs), plan_batches_reference(**kwargs)
    np.testing.assert_array_equal(fast.indices, slow.indices)
    _check_plan(fast, groups)


def test_reference_agreement_groups_none():
    kwargs = dict(groups=None, num_samples=50, batch_size=8, seed=3, epoch=0)
    np.testing.assert_array_equal(plan_batches(**kwargs).indices, plan_batches_reference(**kwargs).indices)


def test_within_group_order_is_a_fair_shuffle():
    # Each sample of a 4-sample group should lead the group's first batch ~1/4 of the epochs.
    groups = np.zeros(4, dtype=np.int64)
    firsts = [plan_batches(groups=groups, batch_size=4, seed=0, epoch=e).indices[0] for e in range(400)]
    counts = np.bincount(firsts, minlength=4)
    assert counts.min() > 60, counts


# ---------------------------------------------------------------- ClusterBatchSampler
def _sampler(**overrides) -> ClusterBatchSampler:
    kwargs = dict(groups=_groups_with_sizes([30, 22, 9]), batch_size=4, seed=0)
    kwargs.update(overrides)
    return ClusterBatchSampler(**kwargs)


def test_sampler_yields_the_plan_as_lists():
    sampler = _sampler()
    sampler.set_epoch(2)
    batches = list(sampler)
    plan = plan_batches(groups=_groups_with_sizes([30, 22, 9]), batch_size=4, seed=0, epoch=2)
    assert len(sampler) == len(plan) == len(batches)
    assert batches == [b.tolist() for b in plan]
    assert all(isinstance(i, int) for i in batches[0])
    assert sampler.stats == plan.stats


def test_sampler_state_dict_resume_yields_exactly_the_remaining_batches():
    sampler = _sampler()
    sampler.set_epoch(1)
    expected = list(sampler)
    iterator = iter(sampler)
    seen = [next(iterator) for _ in range(5)]
    state = sampler.state_dict()
    assert state == {"epoch": 1, "batches_consumed": 5}

    resumed = _sampler()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # a training loop calls this on resume; it must keep the position
    rest = list(resumed)
    assert seen + rest == expected
    assert resumed.state_dict() == {"epoch": 1, "batches_consumed": len(expected)}
    assert list(resumed) == expected  # iterating a finished epoch again replays it
    resumed.set_epoch(2)
    assert resumed.state_dict() == {"epoch": 2, "batches_consumed": 0}
    assert list(resumed) != expected


def test_sampler_resume_from_a_completed_epoch_yields_nothing():
    sampler = _sampler()
    sampler.load_state_dict({"epoch": 0, "batches_consumed": len(sampler)})
    assert list(sampler) == []


def test_sampler_state_errors():
    sampler = _sampler()
    with pytest.raises(DataError, match="state_dict"):
        sampler.load_state_dict({"epoch": 0})
    with pytest.raises(DataError, match="changed since the checkpoint"):
        sampler.load_state_dict({"epoch": 0, "batches_consumed": 10_000})


def test_sampler_distributed_and_dataloader():
    groups = _groups_with_sizes([30, 22, 9])
    samplers = [ClusterBatchSampler(groups=groups, batch_size=2, seed=0, world_size=2, rank=r) for r in range(2)]
    assert len(samplers[0]) == len(samplers[1])
    seen = [set(i for b in s for i in b) for s in samplers]
    assert not seen[0] & seen[1]

    dataset = torch.utils.data.TensorDataset(torch.from_numpy(groups))
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=samplers[0])
    for (batch_groups,) in loader:
        assert torch.unique(batch_groups).numel() == 1


def test_sampler_control_run_without_groups():
    sampler = ClusterBatchSampler(groups=None, num_samples=20, batch_size=5, seed=0)
    assert sorted(i for b in sampler for i in b) == list(range(20))
    with pytest.raises(ConfigError, match="num_samples"):
        ClusterBatchSampler(groups=None, batch_size=5, seed=0)
