"""Tests for contrastive.mcl.batch_plan: cluster-pure batch plans (MCL Alg. 1), single-process and distributed."""
from __future__ import annotations

import numpy as np
import pytest

import contrastive.mcl.batch_plan as batch_plan
from contrastive.errors import ConfigError, DataError
from contrastive.mcl.batch_plan import BatchPlan, plan_batches
from tests.unit.mcl.reference import plan_batches_reference


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
    monkeypatch.setattr(batch_plan, "_MIN_PACKED_RANDOM_BITS", 64)
    assert batch_plan._shuffle_key_layout(num_groups=4, num_samples=100)[1] == 0
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


# ---------------------------------------------------------------- helpers the reference shares (so tested alone)
def test_the_shuffle_key_packs_group_random_and_index_bits_into_63_bits():
    """(random_bits, index_bits) by the docstring's rule, computed by hand: g = bits of G - 1 (at least 1),
    x = bits of M - 1 (at least 1), r = 63 - g - x when r >= 24, else (62 - g, 0): not packed. The reference
    plan calls this same function, so only these values guard it."""
    layout = batch_plan._shuffle_key_layout
    assert layout(num_groups=1, num_samples=1) == (61, 1)  # g = x = 1
    assert layout(num_groups=4, num_samples=100) == (54, 7)  # g = 2 (3), x = 7 (99)
    assert layout(num_groups=4, num_samples=128) == (54, 7)  # 127 still fits in 7 bits
    assert layout(num_groups=5, num_samples=129) == (52, 8)  # g = 3 (4), x = 8 (128)
    assert layout(num_groups=2 ** 18 + 1, num_samples=2 ** 19 + 1) == (24, 20)  # r = 24: still packed
    assert layout(num_groups=2 ** 18 + 1, num_samples=2 ** 20 + 1) == (43, 0)  # r = 23: not packed


def test_gathering_ranges_keeps_the_dtype_and_single_rows():
    source = np.arange(10, 20, dtype=np.int32)
    np.testing.assert_array_equal(batch_plan._gather_ranges(source, starts=np.array([3]), lengths=np.array([1])), [13])
    np.testing.assert_array_equal(
        batch_plan._gather_ranges(source, starts=np.array([8, 0]), lengths=np.array([2, 3])), [18, 19, 10, 11, 12])
    empty = batch_plan._gather_ranges(source, starts=np.array([4, 5]), lengths=np.array([0, 0]))
    assert empty.shape == (0,) and empty.dtype == np.int32


def test_the_smallest_valid_arguments_plan_and_each_wrong_one_is_named_with_its_value():
    groups = np.zeros(8, dtype=np.int64)
    assert len(plan_batches(groups=groups, batch_size=1, seed=0, epoch=0)) == 8  # batch_size 1 is allowed
    assert len(plan_batches(groups=None, num_samples=1, batch_size=1, seed=0, epoch=0)) == 1
    with pytest.raises(ConfigError, match=r"^world_size must be >= 1, got 0\.$"):
        plan_batches(groups=groups, batch_size=2, seed=0, epoch=0, world_size=0)
    for seed, epoch in ((-1, 0), (0, -1)):
        with pytest.raises(ConfigError, match=rf"^seed and epoch must be >= 0 \(got seed={seed}, epoch={epoch}\)\.$"):
            plan_batches(groups=groups, batch_size=2, seed=seed, epoch=epoch)
    with pytest.raises(ConfigError, match=r"^unknown remainder_policy 'keep'; use one of partial, pool, drop\.$"):
        plan_batches(groups=groups, batch_size=2, seed=0, epoch=0, remainder_policy="keep")
    with pytest.raises(ConfigError, match=r"^groups=None \(ordinary random batches\) needs num_samples=len\(dataset\); "
                                          r"pass it, or pass the pseudo-labels as groups\.$"):
        plan_batches(groups=None, num_samples=0, batch_size=2, seed=0, epoch=0)
    with pytest.raises(DataError, match=r"^groups is empty: there are no samples to plan batches for\.$"):
        plan_batches(groups=np.zeros(0, dtype=np.int64), batch_size=2, seed=0, epoch=0)
    with pytest.raises(DataError, match=r"^groups must hold integer cluster ids"):
        plan_batches(groups=np.array([0.5, 1.5]), batch_size=2, seed=0, epoch=0)


def test_a_plan_indexes_from_minus_its_length_and_names_a_batch_out_of_range():
    plan = plan_batches(groups=_groups_with_sizes([6, 6]), batch_size=3, seed=0, epoch=0)
    np.testing.assert_array_equal(plan.batch(-len(plan)), plan.batch(0))
    with pytest.raises(IndexError, match=r"^batch 4 out of range for a plan of 4 batches$"):
        plan.batch(4)
    with pytest.raises(IndexError, match=r"^batch -5 out of range"):
        plan.batch(-5)


def test_a_group_of_exactly_the_global_batch_is_not_smaller_than_it():
    plan = plan_batches(groups=_groups_with_sizes([4, 8, 3]), batch_size=2, seed=0, epoch=0, world_size=2, rank=0)
    assert plan.stats["groups_smaller_than_batch"] == 1  # only the group of 3 < 2 x 2
