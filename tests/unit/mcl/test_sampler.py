"""Tests for contrastive.mcl.sampler: ClusterBatchSampler's plans, resumable state and DataLoader use."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from contrastive.errors import ConfigError, DataError
from contrastive.mcl.batch_plan import plan_batches
from contrastive.mcl.sampler import ClusterBatchSampler


def _groups_with_sizes(sizes: list[int], *, seed: int = 0) -> np.ndarray:
    """Group ids with the given group sizes, in a shuffled sample order."""
    groups = np.repeat(np.arange(len(sizes)), sizes)
    return np.random.default_rng(seed).permutation(groups)


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


def test_the_engines_rows_are_the_plans_batches_from_the_start_asked_as_int64():
    """planned_rows (what the engine's BatchSource reads): epoch 1 from batch 2 on is plan batches 2.. of epoch 1."""
    plan = plan_batches(groups=_groups_with_sizes([30, 22, 9]), batch_size=4, seed=0, epoch=1)
    rows = list(_sampler().planned_rows(epoch=1, start=2))
    assert len(rows) == len(plan) - 2 and all(r.dtype == np.int64 for r in rows)
    for got, expected in zip(rows, [plan.batch(i) for i in range(2, len(plan))]):
        np.testing.assert_array_equal(got, expected)


def test_epochs_from_0_are_accepted_and_a_negative_one_is_refused_with_its_value():
    sampler = _sampler()
    sampler.set_epoch(3)
    sampler.set_epoch(0)  # back to epoch 0: allowed, and the plan is epoch 0's
    assert sampler.state_dict() == {"epoch": 0, "batches_consumed": 0}
    assert list(sampler) == [b.tolist() for b in plan_batches(groups=_groups_with_sizes([30, 22, 9]), batch_size=4,
                                                              seed=0, epoch=0)]
    with pytest.raises(ConfigError, match=r"^epoch must be >= 0, got -1\.$"):
        sampler.set_epoch(-1)


def test_a_state_with_a_negative_count_is_corrupt_and_zero_consumed_resumes_at_the_start():
    sampler = _sampler()
    for state in ({"epoch": 0, "batches_consumed": -1}, {"epoch": -1, "batches_consumed": 0}):
        with pytest.raises(DataError, match=r"^sampler state has negative values .*; the checkpoint is corrupt\.$"):
            sampler.load_state_dict(state)
    sampler.load_state_dict({"epoch": 1, "batches_consumed": 0})
    assert len(list(sampler)) == len(sampler) > 0


def test_the_sampler_errors_say_what_to_do():
    with pytest.raises(ConfigError, match=r"^groups=None \(random batches\) needs num_samples = len\(dataset\) > 0\.$"):
        ClusterBatchSampler(groups=None, batch_size=5, seed=0)
    sampler = _sampler()
    with pytest.raises(DataError, match=r"\(needs int 'epoch' and 'batches_consumed'\); the checkpoint may be from "
                                        r"another sampler\.$"):
        sampler.load_state_dict({"epoch": 0})
    with pytest.raises(DataError, match=r"has only \d+; the groups, batch size or world size changed since the "
                                        r"checkpoint: resume with the same settings or start the stage afresh\.$"):
        sampler.load_state_dict({"epoch": 0, "batches_consumed": 10_000})


def test_a_fresh_sampler_is_at_epoch_0_and_plans_with_its_remainder_policy():
    """Without set_epoch, the first epoch's plan (epoch 0); the remainder policy reaches every epoch's plan."""
    groups = _groups_with_sizes([30, 22, 9])
    for policy in ("partial", "drop"):
        plan = plan_batches(groups=groups, batch_size=4, seed=0, epoch=0, remainder_policy=policy)
        assert list(_sampler(remainder_policy=policy)) == [b.tolist() for b in plan]
    assert len(_sampler(remainder_policy="drop")) < len(_sampler(remainder_policy="partial"))
