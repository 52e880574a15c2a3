"""Cluster-pure batches over tar shards: a per-stage re-shard by pseudo-label group, read as group streams.

MCL stage j draws every batch from one pseudo-label group (MCL, Algorithm 1). In memory that is a sort
(``contrastive.mcl.batch_plan.plan_batches``); over 12M web images in tar shards a batch's samples are scattered over
all shards. Design chosen here (docs/clip.md, "Reader design"):

1. **Re-shard once per stage** (:func:`reshard_by_group`). One sequential pass over the source shards copies the
   raw bytes of every labelled sample (no decoding) into ``g<group>-r<slot>.tar``. Samples of a group are dealt
   round-robin over ``slots`` data slots (by default one per training process), so each slot holds a disjoint,
   equal-sized (+-1) part of every group. Writes go through a spool of at most ``spool_bytes`` of members, waiting
   in a staging file on the output's disk (not in memory): when full, the largest per-file lists are shuffled and
   appended to their files (a tar is a concatenation of members, so appending needs no open handles; at most one
   file is open at a time, whatever the number of groups). Cost: one copy of the data per stage on local disk,
   written sequentially, plus the staging file (mostly still in the page cache when read back).
2. **Read group streams** (:class:`GroupedBatchReader`, one per slot). Per epoch, every slot computes the same
   batch plan with ``plan_batches(world_size=slots, rank=slot)`` (how many batches each group yields, their
   per-slot sizes, what is dropped), and the same schedule: groups in a random order, at most ``active_streams``
   groups in progress, each step takes the next batch of a randomly chosen active group. A batch is the next ``b``
   samples of that group's stream in this slot (its ``r<slot>`` file, read sequentially through a seeded shuffle
   buffer). Every batch is group-pure, every planned sample is read exactly once per epoch, slots never overlap.
   A process reads one slot or several side by side, so a global batch is the same whatever the number of
   processes that share the slots.

Memory is bounded independently of the dataset size: while re-sharding, the spool's index (16 bytes a pending
member), its write runs (WRITE_CHUNK) and a slice of the labels (LABEL_CHUNK, read from the pseudo-labels file
in the shards' order), plus 8 bytes a label for the check that keys are unique; while reading,
``active_streams x shuffle_buffer`` raw samples plus one open file per active stream. With K^N = 1000 groups and
8 ranks there are 8000 files per stage.

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
import zipfile
from array import array
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from contrastive.modalities.image_text.data import (TAR_END, ClipBatch, SampleDecodePool, SkipCounter,
                                                    decode_image_text, decode_pool, iter_raw_samples, sample_members,
                                                    shuffled)
from contrastive.data.dataset import chunks_of, open_npz_member, repeated_strings
from contrastive.errors import ConfigError, DataError
from contrastive.mcl.batch_plan import plan_batches

MANIFEST = "grouped.json"
KEEP_FIELDS = ("jpg", "jpeg", "png", "webp", "txt", "json")


def group_file(*, group: int, slot: int) -> str:
    return f"g{group:06d}-r{slot:03d}.tar"


# ---------------------------------------------------------------------------------------------------- re-shard
LABEL_CHUNK = 1 << 15  # labels read at a time (keys as Python str: about 2 MB)
SPOOL_FILE = ".spool"  # the spool's staging file inside the re-shard's temporary directory (removed before rename)
WRITE_CHUNK = 4 << 20  # bytes of members gathered in memory per write when a spooled file is flushed


class NpzColumn:
    """One 1-D array of an ``np.savez`` archive read by slices, never whole: ``len()``, ``dtype`` and ``[a:b]``
    (sequential slices are sequential reads). What :func:`reshard_by_group` walks the pseudo-labels with, so their
    ids (``<U``: 4 bytes a character) are never held as one O(M) array."""

    def __init__(self, archive: zipfile.ZipFile, name: str):
        self._member, shape, _, self.dtype = open_npz_member(archive, name)
        if len(shape) != 1 or self.dtype.hasobject:
            raise DataError(f"{name} of {archive.filename} is not a 1-D array of numbers or strings")
        self.shape = shape
        self._start = self._member.tell()

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, item: slice) -> np.ndarray:
        start, stop, step = item.indices(len(self))
        if step != 1:
            raise IndexError("NpzColumn reads contiguous slices only")
        self._member.seek(self._start + start * self.dtype.itemsize)
        return np.frombuffer(self._member.read(max(stop - start, 0) * self.dtype.itemsize), dtype=self.dtype)


def _label_chunks(keys, groups) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(keys as ``<U``, groups as int64) of at most LABEL_CHUNK labels at a time, in order."""
    for start in range(0, len(keys), LABEL_CHUNK):
        stop = start + LABEL_CHUNK
        yield np.asarray(keys[start:stop]).astype(str), np.asarray(groups[start:stop]).astype(np.int64)


def _check_labels(keys, groups) -> int:
    """The number of groups (max + 1) of valid labels; DataError on repeated keys or negative groups. Keys are
    checked by :func:`repeated_strings` (8 bytes a label), read a chunk at a time."""
    num_groups = 0
    for start in range(0, len(groups), LABEL_CHUNK):
        chunk_groups = np.asarray(groups[start:start + LABEL_CHUNK]).astype(np.int64)
        if chunk_groups.size:
            if chunk_groups.min() < 0:
                raise DataError(f"negative pseudo-label groups (e.g. {int(chunk_groups.min())}): groups are 0..G-1")
            num_groups = max(num_groups, int(chunk_groups.max()) + 1)
    repeated = repeated_strings(chunks_of(keys), count=len(keys))
    if repeated:
        raise DataError(f"sample keys are not unique (e.g. {repeated}); img2dataset keys are unique per "
                        "download: do not list the same shard twice in data.shards")
    return num_groups


class _LabelCursor:
    """The labels walked in the shards' order (the export's order, which the pseudo-labels keep): a sample of the
    shards is either the next labelled key or one the export skipped. O(LABEL_CHUNK) memory whatever M."""

    def __init__(self, keys, groups):
        self._chunks = _label_chunks(keys, groups)
        self._keys: list[str] = []
        self._groups: list[int] = []
        self._next = 0

    def group_of(self, key: str) -> int:
        """The group of ``key`` if it is the next labelled key, else -1 (unlabelled)."""
        if self._next == len(self._keys):
            chunk = next(self._chunks, None)
            if chunk is None:
                return -1
            self._keys, self._groups = chunk[0].tolist(), chunk[1].tolist()
            self._next = 0
        if self._keys[self._next] != key:
            return -1
        self._next += 1
        return self._groups[self._next - 1]


class _Spool:
    """Per-file lists of tar members with a total byte budget; flushes append to files in ``directory``.

    The members wait on disk, in one staging file (``SPOOL_FILE``), not in memory: memory holds their offsets and
    lengths (16 bytes a member) and at most WRITE_CHUNK bytes of them at a time. The staging file is rewritten
    with its pending members (at most ``budget`` / 2) once it passes 2 x ``budget`` bytes after a flush, so it
    stays under about 2.5 x ``budget`` on disk (3 x while being rewritten). Which members go to which file in which
    order depends only on their sizes, the budget and ``rng``."""

    def __init__(self, *, directory: Path, budget: int, rng: np.random.Generator):
        self.directory = directory
        self.budget = budget
        self.rng = rng
        self.pending: dict[str, tuple[array, array]] = {}  # file -> (offsets, lengths) in the staging file
        self.sizes: dict[str, int] = {}
        self.total = 0
        self.flushes = 0
        self._path = directory / SPOOL_FILE
        self._staging = open(self._path, "w+b", buffering=1 << 20)
        self._end = 0  # bytes appended to the staging file

    def add(self, name: str, blob: bytes) -> None:
        offsets, lengths = self.pending.setdefault(name, (array("q"), array("q")))
        offsets.append(self._end)
        lengths.append(len(blob))
        self._staging.write(blob)
        self._end += len(blob)
        self.sizes[name] = self.sizes.get(name, 0) + len(blob)
        self.total += len(blob)
        if self.total > self.budget:
            # Flush the largest buffers until half the budget is free: few, large sequential appends.
            for name in sorted(self.sizes, key=self.sizes.get, reverse=True):
                self.flush(name)
                if self.total <= self.budget // 2:
                    break
            if self._end > 2 * self.budget:
                self._compact()

    def _read(self, offsets: array, lengths: array, order: Iterator[int]) -> Iterator[bytes]:
        """The members ``order`` of one file's list, read back from the staging file in runs of WRITE_CHUNK bytes."""
        self._staging.flush()
        fd, run, size = self._staging.fileno(), [], 0
        for i in order:
            run.append(os.pread(fd, lengths[i], offsets[i]))
            size += lengths[i]
            if size >= WRITE_CHUNK:
                yield b"".join(run)
                run, size = [], 0
        if run:
            yield b"".join(run)

    def flush(self, name: str) -> None:
        offsets, lengths = self.pending.pop(name, (array("q"), array("q")))
        if not offsets:
            return
        # Shuffle within the buffer so a group's file is not in source order (more varied batches).
        order = self.rng.permutation(len(offsets))
        with open(self.directory / name, "ab") as handle:
            for run in self._read(offsets, lengths, iter(order.tolist())):
                handle.write(run)
        self.total -= self.sizes.pop(name)
        self.flushes += 1

    def _compact(self) -> None:
        """Rewrite the staging file with its pending members only (same lists, same order, new offsets)."""
        fresh_path = self.directory / (SPOOL_FILE + ".new")
        with open(fresh_path, "wb", buffering=1 << 20) as fresh:
            end = 0
            for offsets, lengths in self.pending.values():
                moved = array("q")
                for run in self._read(offsets, lengths, iter(range(len(offsets)))):
                    fresh.write(run)
                for length in lengths:
                    moved.append(end)
                    end += length
                offsets[:] = moved
        self._staging.close()
        os.replace(fresh_path, self._path)
        self._staging = open(self._path, "r+b", buffering=1 << 20)
        self._staging.seek(end)
        self._end = end

    def flush_all(self) -> None:
        for name in list(self.pending):
            self.flush(name)

    def close(self) -> None:
        """Close and remove the staging file."""
        self._staging.close()
        self._path.unlink(missing_ok=True)


def reshard_by_group(*, urls: Sequence[str], keys, groups, out_dir: Path, slots: int,
                     seed: int, spool_bytes: int = 256 << 20, counter: SkipCounter | None = None) -> dict:
    """Copy every labelled sample of ``urls`` into group-sorted tars ``g<group>-r<slot>.tar`` (one pass, no decode).

    keys: (M,) sample keys (``__key__``) with pseudo-labels, in the order of the shards (the export's order, which
    the pseudo-labels keep); groups: (M,) int group of each key (dense 0..G-1). Either may be an array or an
    :class:`NpzColumn` (read in slices: memory does not grow with M beyond 8 bytes a key for the uniqueness check).
    Samples of the shards without a label (skipped as broken at export) are not copied and are counted.
    A labelled key that is absent from the shards (or out of their order) raises DataError (the shards changed
    since the export). Memory: the spool's index and write runs (``_Spool``; its ``spool_bytes`` of members wait on
    disk in the output's temporary directory). Writes ``grouped.json`` last (atomic directory rename). Returns the
    manifest.
    """
    if slots < 1:
        raise ConfigError(f"slots must be >= 1, got {slots}")
    out_dir = Path(out_dir)
    if (out_dir / MANIFEST).is_file():
        return json.loads((out_dir / MANIFEST).read_text())
    if not isinstance(keys, NpzColumn):
        keys = np.asarray(keys)
    if not isinstance(groups, NpzColumn):
        groups = np.asarray(groups)
    if keys.shape != groups.shape:
        raise DataError(f"{len(keys)} keys but {len(groups)} groups; pass the ids saved with the pseudo-labels")
    num_groups = _check_labels(keys, groups)
    labels = _LabelCursor(keys, groups)
    counts = np.zeros((num_groups, slots), dtype=np.int64)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    started, unlabelled, copied_bytes = time.perf_counter(), 0, 0
    try:
        spool = _Spool(directory=tmp, budget=spool_bytes, rng=np.random.default_rng([seed, 7]))
        try:
            for sample in iter_raw_samples(urls, counter=counter):
                group = labels.group_of(sample["__key__"])
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
        finally:
            spool.close()
        written = int(counts.sum())
        if written != len(keys):
            raise DataError(f"{len(keys) - written} labelled samples were not found in the shards in the labels' "
                            f"order (of {len(keys)}): the shards changed since the embeddings were exported; rerun "
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
