"""Cluster-pure batches over shards: the per-stage re-shard by group and the group-stream reader."""
import json
import os

import numpy as np
import pytest

from contrastive.modalities.image_text.data import SkipCounter, iter_raw_samples, write_tiny_shards
from contrastive.modalities.image_text.grouped import (MANIFEST, GroupedBatchReader, measure_reader_throughput, reshard_by_group)
from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip
from contrastive.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    shards = write_tiny_shards(directory=tmp_path_factory.mktemp("src") / "train", num_samples=120,
                               samples_per_shard=25, seed=1, corrupt=True)
    keys = np.array([s["__key__"] for s in iter_raw_samples(shards["urls"])])
    good = keys[~np.isin(keys, shards["corrupt_keys"])]  # export labels only samples that decode
    groups = np.random.default_rng(0).integers(0, 5, good.size)
    return shards, good, groups


def _read_all(directory, *, slot, batch_size, epoch=0, **kw):
    reader = GroupedBatchReader(directory=directory, batch_size=batch_size, slot=slot, seed=3, **kw)
    return reader, list(reader.raw_batches(epoch=epoch))


@pytest.mark.parametrize("world_size", [1, 2])
def test_every_batch_is_group_pure_and_every_sample_read_once(tmp_path, source, world_size):
    shards, keys, groups = source
    manifest = reshard_by_group(urls=shards["urls"], keys=keys, groups=groups, out_dir=tmp_path / "g",
                                slots=world_size, seed=0, spool_bytes=4096)  # tiny spool: many flushes
    assert manifest["samples"] == keys.size and manifest["unlabelled_skipped"] == 2
    assert manifest["spool_flushes"] > manifest["files"]
    group_of = dict(zip(keys.tolist(), groups.tolist()))
    seen_by_rank = []
    for rank in range(world_size):
        reader, batches = _read_all(tmp_path / "g", slot=rank, batch_size=6, active_streams=2)
        assert len(batches) == len(reader)
        for batch in batches:
            assert {group_of[s["__key__"]] for s in batch.samples} == {batch.group}
        seen = [s["__key__"] for b in batches for s in b.samples]
        assert len(seen) == len(set(seen))
        seen_by_rank.append(set(seen))
        _, stats = reader.schedule(0)
        assert stats["samples_planned"] == len(seen)
        assert stats["samples_planned_global"] + stats["samples_dropped"] == keys.size
    # Ranks never overlap and together read every planned sample.
    assert not set.intersection(*seen_by_rank) or world_size == 1
    assert sum(len(s) for s in seen_by_rank) == stats["samples_planned_global"]
    # Same batch counts on every rank (DDP lockstep) and a different order in the next epoch.
    lengths = {len(GroupedBatchReader(directory=tmp_path / "g", batch_size=6, slot=r, seed=3)) for r in range(world_size)}
    assert len(lengths) == 1
    _, next_epoch = _read_all(tmp_path / "g", slot=0, batch_size=6, epoch=1, active_streams=2)
    assert [b.group for b in next_epoch] != [b.group for b in batches] or len(batches) < 3


def test_drop_policy_and_windowed_schedule_bounds_open_groups(tmp_path, source):
    shards, keys, groups = source
    reshard_by_group(urls=shards["urls"], keys=keys, groups=groups, out_dir=tmp_path / "g", slots=1, seed=0)
    reader, batches = _read_all(tmp_path / "g", slot=0, batch_size=8, remainder_policy="drop",
                                active_streams=2)
    assert all(len(b.samples) == 8 for b in batches)
    # At any point at most 2 groups have started but not finished.
    order = [b.group for b in batches]
    last = {g: max(i for i, x in enumerate(order) if x == g) for g in set(order)}
    first = {g: min(i for i, x in enumerate(order) if x == g) for g in set(order)}
    assert max(sum(first[g] <= i <= last[g] for g in first) for i in range(len(order))) <= 2
    with pytest.raises(ConfigError, match="partial or drop"):
        GroupedBatchReader(directory=tmp_path / "g", batch_size=8, slot=0, seed=0, remainder_policy="pool")
    with pytest.raises(ConfigError, match="outside the 1 slots"):
        GroupedBatchReader(directory=tmp_path / "g", batch_size=8, slot=1, seed=0)


def test_resume_skips_batches_and_decoding_yields_tensors(tmp_path, source):
    shards, keys, groups = source
    reshard_by_group(urls=shards["urls"], keys=keys, groups=groups, out_dir=tmp_path / "g", slots=1, seed=0)
    reader = GroupedBatchReader(directory=tmp_path / "g", batch_size=6, slot=0, seed=3, shuffle_buffer=4)
    full = [[s["__key__"] for s in b.samples] for b in reader.raw_batches(epoch=0)]
    tail = [[s["__key__"] for s in b.samples] for b in reader.raw_batches(epoch=0, start=3)]
    assert tail == full[3:]
    transform = create_clip(spec=ClipSpec(model_name=TINY_MODEL, trainable_image_blocks=1)).eval_transform
    decoded = list(reader.batches(epoch=0, transform=transform, counter=SkipCounter(max_skip_fraction=0.0),
                                  workers=2))
    assert [b.keys for b in decoded] == full
    assert decoded[0].images.shape[1:] == (3, 32, 32) and decoded[0].group >= 0


def test_missing_labelled_samples_and_duplicate_keys_fail_clearly(tmp_path, source):
    shards, keys, groups = source
    with pytest.raises(DataError, match="shards changed"):
        reshard_by_group(urls=shards["urls"][:2], keys=keys, groups=groups, out_dir=tmp_path / "g", slots=1,
                         seed=0)
    assert not (tmp_path / "g").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".g")]
    with pytest.raises(DataError, match="not unique"):
        reshard_by_group(urls=shards["urls"], keys=np.r_[keys, keys[:1]], groups=np.r_[groups, groups[:1]],
                         out_dir=tmp_path / "g", slots=1, seed=0)


def test_throughput_measurement_reports_both_readers(tmp_path, source):
    shards, _, _ = source
    result = measure_reader_throughput(urls=shards["urls"], batch_size=8, num_groups=10, work_dir=tmp_path)
    assert result["sequential_samples_per_s"] > 0 and result["grouped_samples_per_s"] > 0
    assert 110 <= result["samples"] <= 120 and result["num_groups"] == 10  # remainders of groups are dropped
    assert json.loads((tmp_path / "grouped" / MANIFEST).read_text())["samples"] == 120


def test_reshard_memory_does_not_grow_with_the_samples(tmp_path, monkeypatch):
    """The spool's members wait on disk and the pseudo-labels are read in slices: the re-shard's peak of traced
    memory is the same for 5x the samples (a spool of members in memory and a ``<U`` key table grew with them),
    and reading the labels from the file writes what the same labels as arrays write."""
    import tracemalloc

    from contrastive.modalities.image_text import grouped
    from contrastive.modalities.image_text.steps import reshard_stage

    monkeypatch.setattr(grouped, "LABEL_CHUNK", 64)  # small slices and write runs: tiny inputs
    monkeypatch.setattr(grouped, "WRITE_CHUNK", 64 << 10)  # show whether anything grows with M
    peaks = []
    for n in (300, 1500):
        shards = write_tiny_shards(directory=tmp_path / f"src{n}", num_samples=n, samples_per_shard=100, seed=2,
                                   corrupt=False)
        keys = np.array([s["__key__"] for s in iter_raw_samples(shards["urls"])])
        groups = np.arange(keys.size) % 5
        np.savez(tmp_path / f"labels{n}.npz", ids=keys, groups=groups)
        tracemalloc.start()
        try:
            reshard_stage(pseudo_labels_path=str(tmp_path / f"labels{n}.npz"), urls=shards["urls"],
                          out_dir=str(tmp_path / f"g{n}"), slots=1, seed=0, spool_bytes=256 << 20)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] <= peaks[0] + (256 << 10), peaks
    reshard_by_group(urls=shards["urls"], keys=keys, groups=groups, out_dir=tmp_path / "arrays", slots=1, seed=0)
    names = sorted(os.listdir(tmp_path / "arrays"))
    assert names == sorted(os.listdir(tmp_path / "g1500")) and all(
        (tmp_path / "arrays" / name).read_bytes() == (tmp_path / "g1500" / name).read_bytes()
        for name in names if name.endswith(".tar"))
