"""Embedding export: float16 shards plus the sample ids they belong to, written by one loop for every modality.

:func:`compute_embeddings` is the forward loop (the stage's precision, inference mode, pinned non-blocking copies
on CUDA, one device -> host read per batch, one batch behind the GPU); :func:`export_ranked` splits an export over
the ranks of a launch (each rank its contiguous share, its own shards) and writes the manifest in rank order, so W
processes export exactly what one process does. The image, CLIP and text exports are these two functions with their own batches.
"""
from __future__ import annotations

import json
import os
import queue
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

import numpy as np
import torch

from contrastive.data.dataset import as_string_array, write_npy
from contrastive.engine.files import atomic_write_bytes, disk_full_error, is_disk_full, write_json, write_stage_summary
from contrastive.engine.distributed import DistInfo
from contrastive.errors import DataError

MANIFEST = "manifest.json"
#: Rows per float16 shard of an export (an export holds one shard per rank in memory).
SHARD_ROWS = 65_536


def held_ids(ids) -> np.ndarray:
    """Sample ids as an export holds them until it writes ``ids.npy``: string ids (file paths, shard keys) as numpy
    StringDType, ~16-50 B a sample instead of a ``<U`` array's 4 B a character of the longest id (~120 B for
    30-character paths: 1.4 GB at 12M); integer ids as they are."""
    ids = np.asarray(ids)
    return as_string_array(ids) if ids.dtype.kind in ("U", "S", "T", "O") else ids


#: The header every shard is written with: numpy's format 1.0, padded to 128 bytes (a multiple of numpy's 64-byte
#: alignment), so a shard's row count is written into it again, the same length, when the shard ends short.
NPY_HEADER_BYTES = 128
#: Bytes of a shard the writing thread lets the kernel hold dirty before it syncs them (fdatasync): the sync at a
#: shard's end then waits for at most this much.
SYNC_EVERY_BYTES = 8 << 20
#: Blocks waiting for the writing thread before ``add`` waits for it (a disk slower than the export holds it back).
QUEUED_BLOCKS = 8


def npy_header(*, rows: int, dim: int) -> bytes:
    """The .npy header (format 1.0, little-endian float16, C order) of a (rows, dim) array, NPY_HEADER_BYTES long."""
    text = repr({"descr": "<f2", "fortran_order": False, "shape": (rows, dim)}).encode("latin1")
    pad = NPY_HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise ValueError(f"a ({rows}, {dim}) shard's header does not fit {NPY_HEADER_BYTES} bytes")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", NPY_HEADER_BYTES - 10) + text + b" " * pad + b"\n"


class _ShardFiles(threading.Thread):
    """The thread that writes an export's shards while the export computes the next batches: each shard streamed
    into a temporary file beside it as its rows arrive (header for the full shard first, rewritten when it ends
    short), synced every SYNC_EVERY_BYTES, fsynced and renamed when it ends. Before it, a shard's rows were held and
    written, then fsynced, in one go when it filled or the export finished, with the GPU idle: 0.18-0.33 s of a
    16,384-row export of D = 2048 on the 2-core CI machine, and a full shard of 65,536 such rows is 268 MB.

    Messages (``put``): ("open", path, rows, dim), ("rows", float16 array), ("close", rows), None to stop. The
    first error (a full disk: the DiskFullError its write would raise) is kept for :meth:`raise_error`; the
    temporary file is removed and later messages are dropped, so the export never waits on a dead writer."""

    def __init__(self):
        super().__init__(name="embedding-shards", daemon=True)
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUED_BLOCKS)
        self.error: BaseException | None = None
        self.handle: BinaryIO | None = None
        self.path: Path | None = None
        self.tmp: Path | None = None
        self.reserved = self.dim = self.unsynced = 0

    def run(self) -> None:
        while (message := self.queue.get()) is not None:
            if self.error is not None:
                continue
            try:
                getattr(self, f"_{message[0]}")(*message[1:])
            except BaseException as exc:  # noqa: BLE001 - handed to the exporting thread at its next call
                self.error = self._as_step_error(exc)
                self._discard()

    def _open(self, path: Path, rows: int, dim: int) -> None:
        self.path, self.tmp = path, path.with_name(path.name + f".tmp{os.getpid()}")
        self.reserved, self.dim, self.unsynced = rows, dim, 0
        self.handle = open(self.tmp, "wb", buffering=0)  # each block straight to the kernel: ~1 MB a batch
        self.handle.write(npy_header(rows=rows, dim=dim))

    def _rows(self, block: np.ndarray) -> None:
        view = memoryview(block).cast("B")
        while view:  # an unbuffered write may take part of it
            view = view[self.handle.write(view):]
        self.unsynced += block.nbytes
        if self.unsynced >= SYNC_EVERY_BYTES:
            os.fdatasync(self.handle.fileno())
            self.unsynced = 0

    def _close(self, rows: int) -> None:
        if rows != self.reserved:
            self.handle.seek(0)
            self.handle.write(npy_header(rows=rows, dim=self.dim))
        os.fsync(self.handle.fileno())
        self.handle.close()
        self.handle = None
        os.replace(self.tmp, self.path)

    def _as_step_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, OSError) and is_disk_full(exc) and self.path is not None:
            return disk_full_error(directory=self.path.parent, what=f"an embedding export ({self.path.name})")
        return exc

    def _discard(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)  # a partial shard would only hold on to the space

    def put(self, message) -> None:
        self.raise_error()
        self.queue.put(message)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.queue.put(None)
        self.join()


class EmbeddingWriter:
    """Streams (B, D) embeddings into float16 shards ``<prefix>-XXXXX.npy`` of ``shard_size`` rows, written by a
    thread of their own (:class:`_ShardFiles`) while the export goes on, so an export holds a few batches in memory,
    not a shard or (N, D) float32 (10 GB for ImageNet at D = 2048), and the GPU does not wait for the disk. A shard
    appears under its name once complete (written, fsynced, renamed); :meth:`finish` returns once every shard has.
    On an error, :meth:`abort` stops the thread and removes the shard in progress."""

    def __init__(self, directory: Path, *, prefix: str = "part", shard_size: int | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix, self.shard_size = prefix, shard_size or SHARD_ROWS
        self.shards: list[str] = []
        self.ids: list[np.ndarray] = []
        self.dim = 0
        self.filled = 0  # rows in the shard in progress (the last of self.shards), 0 when none is open
        self.files = _ShardFiles()
        self.files.start()

    def add(self, embeddings: np.ndarray, ids: np.ndarray) -> None:
        if len(embeddings) != len(ids):
            raise ValueError(f"{len(embeddings)} embeddings but {len(ids)} ids")
        if not len(embeddings):
            return
        self.dim = int(embeddings.shape[1])
        block = np.array(embeddings, dtype=np.float16, order="C")  # a copy: the caller's buffer is reused
        self.ids.append(held_ids(ids))
        while len(block):
            if not self.filled:
                self._open()
            take = min(len(block), self.shard_size - self.filled)
            self.files.put(("rows", block[:take]))
            self.filled += take
            block = block[take:]
            if self.filled == self.shard_size:
                self.files.put(("close", self.filled))
                self.filled = 0

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.shards):05d}.npy"
        self.files.put(("open", self.directory / name, self.shard_size, self.dim))
        self.shards.append(name)

    def finish(self) -> dict:
        """End the last partial shard (an export of no rows writes one (0, D) shard) and wait for the writing
        thread; returns {"shards", "ids", "dim"} (a part of a manifest)."""
        if self.filled or not self.shards:
            if not self.shards:
                self._open()
            self.files.put(("close", self.filled))
            self.filled = 0
        self.files.stop()
        self.files.raise_error()
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)
        return {"shards": self.shards, "ids": ids, "dim": self.dim}

    def abort(self) -> None:
        """Stop the writing thread and remove the shard in progress (an export that failed part way)."""
        self.files.error = self.files.error or RuntimeError("export aborted")
        self.files.stop()
        self.files._discard()


def write_manifest(*, directory: Path, parts: list[dict]) -> dict:
    """Combine the parts of one or several writers (ranks, in rank order) into ``ids.npy`` + the manifest, written
    last: a directory without a manifest is an interrupted export."""
    directory = Path(directory)
    # A rank with no samples (more ranks than shards) wrote one empty (0, 0) shard: listing it would break the
    # concatenation of (n, D) shards.
    parts = [part for part in parts if len(part["ids"])] or parts[:1]
    ids = np.concatenate([part["ids"] for part in parts])
    _save_npy(directory / "ids.npy", ids)
    manifest = {"num_samples": int(len(ids)), "dim": max(part["dim"] for part in parts), "dtype": "float16",
                "shards": [name for part in parts for name in part["shards"]], "ids": "ids.npy"}
    write_json(directory / MANIFEST, manifest)
    return manifest


@dataclass(frozen=True)
class ExportBatch:
    """One planned batch of an export. ids: (b,) the ids of the b rows written, in order; inputs: the host tensors
    ``encode`` takes, holding the rows marked in ``present`` (all b rows when None), e.g. uint8 images
    (p, C, H, W) or token ids and mask (p, L); present: bool (b,) or None. A row not present (an unreadable image)
    gets a zero embedding, so every sample keeps its place and id."""
    ids: np.ndarray
    inputs: tuple[torch.Tensor, ...]
    present: np.ndarray | None = None


def pinned_copies(device: torch.device) -> bool:
    """Whether copies between the host and ``device`` go through pinned memory, non-blocking (CUDA), or are plain
    ``.to`` copies (elsewhere): the one switch between :func:`compute_embeddings`'s two paths."""
    return device.type == "cuda"


class HostToDevice:
    """Host -> device copies of a batch's inputs. On CUDA each input goes through a pinned host buffer and is copied
    with ``non_blocking=True``, so the copy is a DMA from page-locked memory instead of a staged synchronous one; an
    input already pinned (a DataLoader with ``pin_memory``) is copied directly. Elsewhere: ``.to``.

    The buffers come in two sets used in turn (batch i stages into set i % 2, each grown when a batch is larger):
    :func:`compute_embeddings` stages batch i + 1 while batch i's copy and forward may still run on the GPU, and
    reads batch i's output (which waits for batch i's copy) before it stages batch i + 2 into batch i's set."""

    SETS = 2

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned: dict[tuple[int, int], torch.Tensor] = {}
        self.turn = 0

    def __call__(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if not pinned_copies(self.device):
            return tuple(t.to(self.device) for t in tensors)
        return tuple(t.to(self.device, non_blocking=True) for t in self.staged(tensors))

    def staged(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The batch's inputs in this turn's set of pinned buffers (the next call uses the other set)."""
        turn, self.turn = self.turn, (self.turn + 1) % self.SETS
        return tuple(self._stage((turn, slot), t) for slot, t in enumerate(tensors))

    def _stage(self, key: tuple[int, int], tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_pinned():
            return tensor
        buffer = self.pinned.get(key)
        if buffer is None or buffer.dtype != tensor.dtype or buffer.numel() < tensor.numel():
            buffer = self.pinned[key] = self._allocate(tensor.numel(), dtype=tensor.dtype)
        staged = buffer[:tensor.numel()].view(tensor.shape)
        staged.copy_(tensor)
        return staged

    @staticmethod
    def _allocate(numel: int, *, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, pin_memory=True)


@dataclass
class _Launched:
    """A batch whose forward has been queued: its float32 (p, D) output on its way to host memory (a non-blocking
    copy into pinned memory on CUDA, finished once ``done`` has been waited for), or None when no row was present."""
    batch: ExportBatch
    present: int
    output: torch.Tensor | None
    done: "torch.cuda.Event | None"

    def read(self) -> np.ndarray | None:
        """The output on the host: waits for this batch's copy (and so for its forward) only."""
        if self.output is None:
            return None
        if self.done is not None:
            self.done.synchronize()
        return self.output.numpy()


def compute_embeddings(*, encode: Callable[..., torch.Tensor], batches: Iterable[ExportBatch],
                       device: torch.device, writer: EmbeddingWriter, precision: str = "fp32",
                       progress: Callable[[int, int], None] | None = None) -> int:
    """Embed every batch into ``writer``, in order: the one forward loop of every export (image, CLIP, text).
    ``progress(rows, dim)`` after each batch is written: its rows and the embedding's width D (what a caller that
    stops the export early, the plan's calibration, cannot read from a result that never comes).

    encode(*batch.inputs on ``device``) -> (p, D) runs under torch.inference_mode and the stage's ``precision``
    (``contrastive.engine.precision.autocast_context``: bf16 / fp16 autocast, fp32 without); its output is cast to
    float32 and read back to the host once per batch (the writer stores float16). Inputs are copied to the device
    by :class:`HostToDevice` (pinned, non-blocking on CUDA).

    Batch i is written one batch late: the loop queues batch i + 1's copy and forward before it waits for batch i's
    output, so the GPU has the next batch's work while the host reads, writes and stages (measured on an H200 by
    ``make gpu-check``'s export row: reading each batch before staging the next left the GPU idle for that time).
    Returns how many rows were not present (zeros)."""
    from contrastive.engine.loop import release_device_memory
    from contrastive.engine.precision import autocast_context
    to_device = HostToDevice(device)
    missing, waiting = 0, None

    def launch(batch: ExportBatch) -> _Launched:
        rows = len(batch.ids)
        present = rows if batch.present is None else int(np.count_nonzero(batch.present))
        if not present:
            return _Launched(batch=batch, present=0, output=None, done=None)
        inputs = to_device(batch.inputs)
        with autocast_context(precision=precision, device=device):
            out = encode(*inputs)
        if not pinned_copies(device):
            return _Launched(batch=batch, present=present, output=out.float().cpu(), done=None)
        host = out.float().to("cpu", non_blocking=True)  # lands in pinned memory; valid once `done` has passed
        done = torch.cuda.Event()
        done.record()
        return _Launched(batch=batch, present=present, output=host, done=done)

    def write(launched: _Launched) -> None:
        nonlocal missing
        batch, rows = launched.batch, len(launched.batch.ids)
        encoded = launched.read()
        if launched.present == rows:
            block = encoded
        else:
            dim = encoded.shape[1] if encoded is not None else writer.dim
            block = np.zeros((rows, dim), np.float32)
            if encoded is not None:
                block[batch.present] = encoded
            missing += rows - launched.present
        writer.add(block, batch.ids)
        if progress is not None:
            progress(rows, writer.dim)

    with torch.inference_mode():
        for batch in batches:
            launched = launch(batch)
            if waiting is not None:
                write(waiting)
            waiting = launched
        if waiting is not None:
            write(waiting)
    if device.type == "cuda":  # the cached activations: k-means on the GPU may come next in this process
        del to_device, waiting  # the pinned buffers and the last batch's tensors
        release_device_memory(device)
    return missing


def rank_share(count: int, *, info: DistInfo) -> np.ndarray:
    """Positions of this rank's contiguous share of ``count`` items (``np.array_split``): rank 0 the first
    ceil-or-floor(count / W), rank 1 the next, ..., so the shares in rank order are 0 .. count - 1 again."""
    return np.array_split(np.arange(count, dtype=np.int64), info.world_size)[info.rank]


def export_ranked(*, out_dir: Path, info: DistInfo, embed: Callable[[EmbeddingWriter], dict[str, int]],
                  summarize: Callable[[dict[str, int]], dict] = lambda counts: {},
                  shard_size: int | None = None) -> dict:
    """One export over the ranks of a launch (or one process): per-rank shards and a rank-ordered manifest.

    ``embed(writer)`` embeds this rank's share (a contiguous part of the samples, e.g. :func:`rank_share`) into
    ``writer`` and returns this rank's counts (numbers, summed over the ranks: unreadable images, skipped shard
    members). One process writes ``part-XXXXX.npy``; rank r of W writes ``rankRRR-part-XXXXX.npy`` plus its ids and
    counts, and after a barrier rank 0 writes ``ids.npy`` and the manifest listing every rank's shards in rank order
    (the same ids, in the same order, as one process), then ``export_summary.json`` = {"dir", "num_samples", "dim",
    "world_size", **counts, **summarize(counts)} (what the launcher reads back). ``summarize`` sees the counts of
    all ranks before the manifest marks the export finished, so it may refuse them (a DataError). Returns that
    summary on rank 0, {} on the other ranks. A collective: every rank of the group calls it."""
    from contrastive.engine.distributed import barrier
    from contrastive.engine.launch import EXPORT_SUMMARY
    out_dir = Path(out_dir)
    prefix = f"rank{info.rank:03d}-part" if info.is_distributed else "part"
    writer = EmbeddingWriter(out_dir, prefix=prefix, shard_size=shard_size)
    try:
        counts = dict(embed(writer))
    except BaseException:
        writer.abort()
        raise
    part = writer.finish()
    if info.is_distributed:
        _save_npy(out_dir / f"rank{info.rank:03d}-ids.npy", part["ids"])
        write_json(out_dir / f"rank{info.rank:03d}.json", {"shards": part["shards"], "dim": part["dim"],
                                                           "counts": counts})
        barrier()
        if not info.is_main:
            return {}
        parts = [{**json.loads((out_dir / f"rank{rank:03d}.json").read_text()),
                  "ids": held_ids(np.load(out_dir / f"rank{rank:03d}-ids.npy", allow_pickle=False))}
                 for rank in range(info.world_size)]
        counts = {name: sum(p["counts"].get(name, 0) for p in parts) for name in {n for p in parts for n in p["counts"]}}
    else:
        parts = [part]
    extra = summarize(counts)
    manifest = write_manifest(directory=out_dir, parts=parts)
    summary = {"dir": str(out_dir), "num_samples": manifest["num_samples"], "dim": manifest["dim"],
               "world_size": info.world_size, **counts, **extra}
    write_stage_summary(out_dir / EXPORT_SUMMARY, summary)
    return summary


def _save_npy(path: Path, array: np.ndarray) -> None:
    """``array`` as an .npy file that loads without pickle (StringDType ids, how a prepared dataset and the writer
    hold them, as ``<U``, converted a chunk at a time), written atomically."""
    atomic_write_bytes(path, lambda file: write_npy(file, array), what="an embedding export")


def save_embeddings(*, embeddings: np.ndarray, ids: np.ndarray, directory: Path, shard_size: int = 65_536) -> dict:
    """Write (N, D) embeddings as float16 shards ``part-XXXXX.npy`` and ``ids.npy``; returns the manifest."""
    writer = EmbeddingWriter(directory, shard_size=shard_size)
    writer.add(embeddings, ids)
    return write_manifest(directory=directory, parts=[writer.finish()])


def _export_manifest(directory: Path) -> dict:
    """The manifest of a finished export in ``directory``, or the error that says to export again."""
    manifest_path = Path(directory) / MANIFEST
    if not manifest_path.exists():
        raise DataError(f"no finished embedding export in {directory} (manifest.json missing): the export was "
                        f"interrupted or deleted; rerun the pipeline to export again")
    return json.loads(manifest_path.read_text())


def _export_ids(directory: Path, manifest: dict) -> np.ndarray:
    ids = np.load(Path(directory) / manifest["ids"], allow_pickle=False)
    if len(ids) != manifest["num_samples"]:
        raise DataError(f"embedding export in {directory} is inconsistent with its manifest: delete the directory "
                        f"and rerun the pipeline")
    return ids


def load_embedding_ids(*, directory: Path) -> np.ndarray:
    """The sample ids (N,) of an export, without reading its embeddings (what pseudo-labelling needs of it: at
    CC12M the (N, D) float32 copy would be 37 GB at 768-d)."""
    directory = Path(directory)
    return _export_ids(directory, _export_manifest(directory))


def load_embeddings(*, directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """Returns (ids (N,), embeddings float32 (N, D)) of an export."""
    directory = Path(directory)
    return load_embedding_ids(directory=directory), load_embedding_rows(directory=directory)


def load_embedding_rows(*, directory: Path, rows: np.ndarray | None = None) -> np.ndarray:
    """The float32 embeddings (N, D) of an export, or with ``rows`` (R,) int positions of its stored samples only
    those, in that order: (R, D).

    The float32 matrix is the only full-size allocation: each float16 shard is read through a memory map and
    converted into its rows of it. (Concatenating the shards first held an (N, D) float16 copy beside it: at CC12M
    and 768-d, 18 GB on top of k-means' 37 GB; selecting rows after loading, a second float32 one.)"""
    directory = Path(directory)
    manifest = _export_manifest(directory)
    shards = [np.load(directory / name, mmap_mode="r") for name in manifest["shards"]]
    total = sum(len(shard) for shard in shards)
    if total != manifest["num_samples"]:
        raise DataError(f"embedding export in {directory} is inconsistent with its manifest: delete the directory "
                        f"and rerun the pipeline")
    dim = next((shard.shape[1] for shard in shards if shard.ndim == 2), 0)
    if rows is None:
        out = np.empty((total, dim), dtype=np.float32)
        start = 0
        for shard in shards:
            out[start:start + len(shard)] = shard
            start += len(shard)
        return out
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= total):
        raise IndexError(f"rows outside the {total:,} samples of the export in {directory}")
    out = np.empty((rows.size, dim), dtype=np.float32)
    order = np.argsort(rows, kind="stable")  # each shard's rows are one slice of the sorted positions
    in_order = rows[order]
    start = 0
    for shard in shards:
        lo, hi = np.searchsorted(in_order, [start, start + len(shard)])
        out[order[lo:hi]] = shard[in_order[lo:hi] - start]
        start += len(shard)
    return out
