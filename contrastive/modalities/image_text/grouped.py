"""Cluster-pure batches over tar shards: a per-stage re-shard by pseudo-label group, read as group streams.

MCL stage j draws every batch from one pseudo-label group (MCL, Algorithm 1). In memory that is a sort
(``contrastive.mcl.batch_plan.plan_batches``); over 12M web images in tar shards a batch's samples are scattered over
all shards. Design chosen here (docs/clip.md, "Reader design"):

1. **Re-shard once per stage** (:func:`reshard_by_group`). One sequential pass over the source shards copies the
   raw bytes of every labelled sample (no decoding) into ``g<group>-r<slot>.tar``. Samples of a group are dealt
   round-robin over ``slots`` data slots (by default one per training process), so each slot holds a disjoint,
   equal-sized (+-1) part of every group. Writes go through a spool of at most ``spool_bytes``: when full, the largest per-file buffers are
   shuffled and appended to their files (a tar is a concatenation of members, so appending needs no open
   handles; at most one file is open at a time, whatever the number of groups). Cost: one copy of the data per
   stage on local disk, written sequentially.
2. **Read group streams** (:class:`GroupedBatchReader`, one per slot). Per epoch, every slot computes the same
   batch plan with ``plan_batches(world_size=slots, rank=slot)`` (how many batches each group yields, their
   per-slot sizes, what is dropped), and the same schedule: groups in a random order, at most ``active_streams``
   groups in progress, each step takes the next batch of a randomly chosen active group. A batch is the next ``b``
   samples of that group's stream in this slot (its ``r<slot>`` file, read sequentially through a seeded shuffle
   buffer). Every batch is group-pure, every planned sample is read exactly once per epoch, slots never overlap.
   A process reads one slot or several side by side, so a global batch is the same whatever the number of
   processes that share the slots.

Memory is bounded independently of the dataset size: the spool while re-sharding, and while reading
``active_streams x shuffle_buffer`` raw samples plus one open file per active stream; only the labels (M int64 and
the key table) are O(M). With K^N = 1000 groups and 8 ranks there are 8000 files per stage.

Trade-offs against an indexed random-access reader (wids): random access needs the dataset on a local disk with
fast random reads and reads one member per seek; this design reads every file sequentially (HDDs, network
filesystems, object stores after one copy) at the cost of one copy per stage and coarser (windowed) batch mixing.
:func:`measure_reader_throughput` compares it with plain sequential webdataset reading.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from contrastive.modalities.image_text.data import (TAR_END, ClipBatch, SampleDecodePool, SkipCounter,
                                                    decode_image_text, decode_pool, iter_raw_samples, sample_members,
                                                    shuffled)
from contrastive.errors import ConfigError, DataError
from contrastive.mcl.batch_plan import plan_batches

MANIFEST = "grouped.json"
KEEP_FIELDS = ("jpg", "jpeg", "png", "webp", "txt", "json")


def group_file(*, group: int, slot: int) -> str:
    return f"g{group:06d}-r{slot:03d}.tar"


# ---------------------------------------------------------------------------------------------------- re-shard
class _KeyTable:
    """Sorted sample keys -> group, looked up by binary search (O(M) strings, no per-key Python objects)."""

    def __init__(self, *, keys: np.ndarray, groups: np.ndarray):
        keys = np.asarray(keys).astype(str)
        if keys.shape != np.asarray(groups).shape:
            raise DataError(f"{keys.size} keys but {np.asarray(groups).size} groups; pass the ids saved with the "
                            "pseudo-labels")
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        if self.keys.size > 1 and (self.keys[1:] == self.keys[:-1]).any():
            dup = self.keys[1:][self.keys[1:] == self.keys[:-1]][:3].tolist()
            raise DataError(f"sample keys are not unique (e.g. {dup}); img2dataset keys are unique per download: "
                            "do not list the same shard twice in data.shards")
        self.groups = np.asarray(groups, dtype=np.int64)[order]

    def group_of(self, key: str) -> int:
        i = int(np.searchsorted(self.keys, key))
        if i < self.keys.size and self.keys[i] == key:
            return int(self.groups[i])
        return -1


class _Spool:
    """Per-file buffers of tar members with a total byte budget; flushes append to files in ``directory``."""

    def __init__(self, *, directory: Path, budget: int, rng: np.random.Generator):
        self.directory = directory
        self.budget = budget
        self.rng = rng
        self.buffers: dict[str, list[bytes]] = {}
        self.sizes: dict[str, int] = {}
        self.total = 0
        self.flushes = 0

    def add(self, name: str, blob: bytes) -> None:
        self.buffers.setdefault(name, []).append(blob)
        self.sizes[name] = self.sizes.get(name, 0) + len(blob)
        self.total += len(blob)
        if self.total > self.budget:
            # Flush the largest buffers until half the budget is free: few, large sequential appends.
            for name in sorted(self.sizes, key=self.sizes.get, reverse=True):
                self.flush(name)
                if self.total <= self.budget // 2:
                    break

    def flush(self, name: str) -> None:
        blobs = self.buffers.pop(name, [])
        if not blobs:
            return
        # Shuffle within the buffer so a group's file is not in source order (more varied batches).
        order = self.rng.permutation(len(blobs))
        with open(self.directory / name, "ab") as handle:
            handle.write(b"".join(blobs[i] for i in order))
        self.total -= self.sizes.pop(name)
        self.flushes += 1

    def flush_all(self) -> None:
        for name in list(self.buffers):
            self.flush(name)


def reshard_by_group(*, urls: Sequence[str], keys: np.ndarray, groups: np.ndarray, out_dir: Path, slots: int,
                     seed: int, spool_bytes: int = 256 << 20, counter: SkipCounter | None = None) -> dict:
    """Copy every labelled sample of ``urls`` into group-sorted tars ``g<group>-r<slot>.tar`` (one pass, no decode).

    keys: (M,) sample keys (``__key__``) with pseudo-labels; groups: (M,) int group of each key (dense 0..G-1).
    Samples of the shards without a label (skipped as broken at export) are not copied and are counted.
    A labelled key that is absent from the shards raises DataError (the shards changed since the export).
    Writes ``grouped.json`` last (atomic directory rename). Returns the manifest.
    """
    if slots < 1:
        raise ConfigError(f"slots must be >= 1, got {slots}")
    out_dir = Path(out_dir)
    if (out_dir / MANIFEST).is_file():
        return json.loads((out_dir / MANIFEST).read_text())
    table = _KeyTable(keys=keys, groups=groups)
    num_groups = int(table.groups.max()) + 1 if table.groups.size else 0
    counts = np.zeros((num_groups, slots), dtype=np.int64)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    spool = _Spool(directory=tmp, budget=spool_bytes, rng=np.random.default_rng([seed, 7]))
    started, unlabelled, copied_bytes = time.perf_counter(), 0, 0
    try:
        for sample in iter_raw_samples(urls, counter=counter):
            group = table.group_of(sample["__key__"])
            if group < 0:
                unlabelled += 1
                continue
            dealt = counts[group].sum()
            slot = int(dealt % slots)
            counts[group, slot] += 1
            blob = sample_members({k: v for k, v in sample.items() if k == "__key__" or k in KEEP_FIELDS})
            copied_bytes += len(blob)
            spool.add(group_file(group=group, slot=slot), blob)
        spool.flush_all()
        written = int(counts.sum())
        if written != table.keys.size:
            raise DataError(f"{table.keys.size - written} labelled samples were not found in the shards (of "
                            f"{table.keys.size}): the shards changed since the embeddings were exported; rerun "
                            "the pipeline so export and clustering see the current shards")
        for name in os.listdir(tmp):
            with open(tmp / name, "ab") as handle:
                handle.write(TAR_END)
        seconds = time.perf_counter() - started
        manifest = {"slots": slots, "num_groups": num_groups, "counts": counts.tolist(),
                    "samples": written, "unlabelled_skipped": unlabelled, "bytes": copied_bytes,
                    "files": len(os.listdir(tmp)), "spool_bytes": spool_bytes, "spool_flushes": spool.flushes,
                    "seconds": seconds, "samples_per_s": written / max(seconds, 1e-9), "seed": seed}
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def manifest_slots(manifest: dict) -> int:
    """The number of data slots of a re-shard (manifests written before slots were named call it world_size)."""
    return int(manifest.get("slots", manifest.get("world_size", 1)))


# ---------------------------------------------------------------------------------------------------- reading
@dataclass
class RawBatch:
    group: int
    samples: list[dict]


class GroupedBatchReader:
    """Cluster-pure batches of one data slot from a directory written by :func:`reshard_by_group`.

    batch_size: per-slot batch b (a global batch holds slots * b samples of one group).
    remainder_policy: "partial" or "drop", as in plan_batches ("pool" would mix groups and needs random access).
    active_streams: groups in progress at once (bounds open files and buffers). shuffle_buffer: raw samples
    buffered per stream for an extra within-group shuffle (0 = file order, already shuffled when written).
    """

    def __init__(self, *, directory: Path, batch_size: int, slot: int, seed: int,
                 remainder_policy: str = "partial", active_streams: int = 16, shuffle_buffer: int = 0):
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST
        if not manifest_path.is_file():
            raise DataError(f"no finished group re-shard in {self.directory} ({MANIFEST} missing); rerun the "
                            "pipeline to re-shard this stage")
        self.manifest = json.loads(manifest_path.read_text())
        slots = manifest_slots(self.manifest)
        if not 0 <= slot < slots:
            raise ConfigError(f"slot {slot} is outside the {slots} slots of the re-shard in {self.directory}")
        if remainder_policy not in ("partial", "drop"):
            raise ConfigError(f"remainder_policy {remainder_policy!r} is not supported over shards (pooled batches "
                              "mix groups); use partial or drop")
        if active_streams < 1:
            raise ConfigError(f"active_streams must be >= 1, got {active_streams}")
        self.counts = np.asarray(self.manifest["counts"], dtype=np.int64).reshape(-1, slots)
        self.batch_size, self.slot, self.slots, self.seed = batch_size, slot, slots, seed
        self.remainder_policy, self.active_streams, self.shuffle_buffer = remainder_policy, active_streams, \
            shuffle_buffer
        self._plans: dict[int, tuple[list[tuple[int, int]], dict]] = {}

    # ------------------------------------------------------------------------------------------------ planning
    def schedule(self, epoch: int) -> tuple[list[tuple[int, int]], dict]:
        """[(group, batch size in this slot)] in reading order, and the plan's stats; identical in all slots
        (plan_batches makes the slots' sizes equal)."""
        if epoch in self._plans:
            return self._plans[epoch]
        sizes = self.counts.sum(axis=1)
        plan = plan_batches(groups=np.repeat(np.arange(sizes.size, dtype=np.int64), sizes),
                            batch_size=self.batch_size, seed=self.seed, epoch=epoch, world_size=self.slots,
                            rank=self.slot, remainder_policy=self.remainder_policy)
        per_batch = np.diff(plan.offsets)
        pending: dict[int, list[int]] = {}
        for group, size in zip(plan.group_of_batch.tolist(), per_batch.tolist()):
            pending.setdefault(group, []).append(size)
        used = {g: sum(s) for g, s in pending.items()}
        for group, total in used.items():
            if total > self.counts[group, self.slot]:  # cannot happen with round-robin slots; guards edits
                raise DataError(f"group {group} needs {total} samples in slot {self.slot} but its file holds "
                                f"{self.counts[group, self.slot]}; rerun the re-shard")
        order = self._windowed_order(pending=pending, rng=np.random.default_rng([self.seed, epoch, 1]))
        stats = {**plan.stats, "active_streams": self.active_streams,
                 "samples_unread_in_slot": int(self.counts[:, self.slot].sum() - per_batch.sum())}
        self._plans = {epoch: (order, stats)}
        return order, stats

    def _windowed_order(self, *, pending: dict[int, list[int]], rng: np.random.Generator) -> list[tuple[int, int]]:
        queue = deque(int(g) for g in rng.permutation(sorted(pending)))
        active: list[int] = []
        order: list[tuple[int, int]] = []
        while queue or active:
            while len(active) < self.active_streams and queue:
                active.append(queue.popleft())
            j = int(rng.integers(len(active)))
            group = active[j]
            order.append((group, pending[group].pop()))
            if not pending[group]:
                active[j] = active[-1]
                active.pop()
        return order

    def __len__(self) -> int:
        return len(self.schedule(0)[0])

    # ------------------------------------------------------------------------------------------------ reading
    def _open(self, group: int, epoch: int) -> Iterator[dict]:
        path = self.directory / group_file(group=group, slot=self.slot)
        samples = iter_raw_samples([str(path)])
        rng = np.random.default_rng([self.seed, epoch, 2, group])
        return iter(shuffled(samples, buffer=self.shuffle_buffer, rng=rng))

    def raw_batches(self, *, epoch: int, start: int = 0) -> Iterator[RawBatch]:
        """Raw (undecoded) batches of this slot for ``epoch``, skipping the first ``start`` (resumption: skipped
        batches are read but not decoded)."""
        order, _ = self.schedule(epoch)
        remaining = {}
        for group, _size in order:
            remaining[group] = remaining.get(group, 0) + 1
        streams: dict[int, Iterator[dict]] = {}
        for index, (group, size) in enumerate(order):
            if group not in streams:
                streams[group] = self._open(group, epoch)
            samples = [next(streams[group]) for _ in range(size)]
            remaining[group] -= 1
            if remaining[group] == 0:
                streams.pop(group)  # the group's planned batches are done; its file closes
            if index >= start:
                yield RawBatch(group=group, samples=samples)

    def batches(self, *, epoch: int, transform: Callable, counter: SkipCounter, start: int = 0,
                workers: int = 0, uint8: bool = False, pool: SampleDecodePool | None = None) -> Iterator[ClipBatch]:
        """Decoded cluster-pure batches (``ClipBatch.group`` set), one planned batch a decode task, in ``workers``
        processes; uint8: the images uint8 with their ``normalization`` (:class:`SampleDecoder`). pool: a stage's
        decode pool kept across epochs (made with this ``transform``, the reader's seed and ``uint8``); None: one
        for this read. A planned batch whose every sample is unreadable is left out."""
        groups: deque[int] = deque()  # the planned batches' groups, queued as the workers are handed them

        def planned() -> Iterator[list[dict]]:
            for batch in self.raw_batches(epoch=epoch, start=start):
                groups.append(batch.group)
                yield batch.samples
        with decode_pool(pool, transform=transform, seed=self.seed, uint8=uint8, workers=workers) as decoding:
            for decoded in decoding.chunks(planned(), epoch=epoch, counter=counter):
                group = groups.popleft()
                if decoded.images is not None:
                    yield ClipBatch(images=decoded.images, texts=decoded.texts, keys=decoded.keys, group=group,
                                    tokens=decoded.tokens, normalization=decoding.decoder.normalization)


# ---------------------------------------------------------------------------------------------------- benchmark
def measure_reader_throughput(*, urls: Sequence[str], batch_size: int, grouped_dir: Path | None = None,
                              num_groups: int = 100, seed: int = 0, max_samples: int | None = None,
                              decode: bool = True, active_streams: int = 16, work_dir: Path | None = None) -> dict:
    """Samples/s of the group-stream reader vs plain sequential webdataset reading of the same shards.

    Both read raw samples and (with ``decode``) decode every image and caption with PIL, on one thread, over the
    same number of samples (``max_samples`` or all of rank 0's group files). Without ``grouped_dir`` the shards
    are re-sharded first into ``work_dir`` (a temp dir by default) with random groups of ``num_groups``;
    the re-shard's own rate is reported as ``reshard_samples_per_s``.
    Returns {"sequential_samples_per_s", "grouped_samples_per_s", "ratio" (grouped / sequential), "samples",
    "reshard_samples_per_s" or None, "num_groups", "decode"}.
    """
    cleanup = None
    reshard_rate = None
    if grouped_dir is None:
        keys = [s["__key__"] for s in iter_raw_samples(urls)]
        rng = np.random.default_rng(seed)
        groups = rng.integers(0, num_groups, len(keys))
        groups = np.unique(groups, return_inverse=True)[1]
        base = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="mclpipe-reader-bench-"))
        cleanup = None if work_dir else base
        manifest = reshard_by_group(urls=urls, keys=np.asarray(keys), groups=groups, out_dir=base / "grouped",
                                    slots=1, seed=seed)
        reshard_rate = manifest["samples_per_s"]
        grouped_dir = base / "grouped"
    try:
        reader = GroupedBatchReader(directory=Path(grouped_dir), batch_size=batch_size, slot=0, seed=seed,
                                    active_streams=active_streams)
        limit = max_samples or int(reader.counts[:, 0].sum())

        def consume(samples: Iterator[dict]) -> tuple[int, float]:
            started, n = time.perf_counter(), 0
            for sample in samples:
                if decode:
                    try:
                        decode_image_text(sample)
                    except Exception:  # noqa: BLE001 - broken samples cost the same to find in both readers
                        pass
                n += 1
                if n >= limit:
                    break
            return n, time.perf_counter() - started

        n_seq, t_seq = consume(iter_raw_samples(urls))
        n_grp, t_grp = consume(s for raw in reader.raw_batches(epoch=0) for s in raw.samples)
        seq_rate, grp_rate = n_seq / max(t_seq, 1e-9), n_grp / max(t_grp, 1e-9)
        return {"sequential_samples_per_s": seq_rate, "grouped_samples_per_s": grp_rate,
                "ratio": grp_rate / max(seq_rate, 1e-9), "samples": min(n_seq, n_grp),
                "reshard_samples_per_s": reshard_rate, "num_groups": int(reader.counts.shape[0]), "decode": decode}
    finally:
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
