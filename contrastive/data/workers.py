"""The one worker pool of mclpipe's readers: a function over planned work items in DataLoader worker processes,
in order, kept across reads (:class:`OrderedWorkers`). The image reader (``contrastive.data.loading.BatchReader``)
hands it row arrays to decode, the CLIP reader (``contrastive.modalities.image_text.data.SampleDecodePool``) chunks
of encoded samples."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data import Dataset as TorchDataset

from contrastive.errors import ConfigError, MclpipeError


class _ResultBuffers:
    """Shared-memory segments that a pool's workers reuse for their results' tensors, lent to the reading process
    until it lets go of them.

    Why: a worker that puts each result in fresh shared memory makes the kernel fault in and zero every 4 KiB page
    of it (37 pages an image of a 224 px uint8 batch): measured on the 2-core CI machine (2026-11-26), handing a
    batch of 64 such images over cost 0.22-0.26 ms of CPU an image that way against 0.03-0.04 ms from a reused
    segment, about an eighth of what decoding a 500 x 375 JPEG to its square costs in all.

    ``flags``, uint8 (workers, slots) in shared memory, says which segment is lent out: 0 = free, else the
    generation (the map, 1-255) it was lent in. A worker sets its row's flag when :meth:`take` lends a segment; the
    reading process clears it (:meth:`release_returned`) once no tensor it received on that segment is alive, which
    a pinned result (the DataLoader's pin thread copies it) is at once, and (:meth:`reclaim`) when a new map begins
    for one lent in an earlier map whose result was never delivered (the DataLoader drops a map's outstanding
    results). With every slot of a worker lent out (a consumer that keeps its batches), the worker uses a fresh,
    unpooled segment: slower, never wrong, nothing waits. A result the reading process sends on to another process
    counts as let go once the reading process drops it: copy it first (no reader of mclpipe does that).
    """

    def __init__(self, *, workers: int, slots: int) -> None:
        self._start(flags=torch.zeros((workers, slots), dtype=torch.uint8).share_memory_(), generation=0)

    def _start(self, *, flags: torch.Tensor, generation: int) -> None:
        self.flags = flags
        self.generation = generation
        self._segments: dict[int, torch.UntypedStorage] = {}  # a worker's own: slot -> segment
        self._taken: list[int] = []  # a worker's: the slots lent for the item in progress
        self._delivered: list[tuple[int, list[int], list[StorageWeakRef]]] = []  # the reader's

    def __getstate__(self) -> dict[str, Any]:
        return {"flags": self.flags, "generation": self.generation}  # a worker starts with no segments of its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._start(**state)

    # ---------------------------------------------------------------- in a worker
    def start_item(self, generation: int) -> None:
        self.generation, self._taken = generation, []

    def taken(self) -> list[int]:
        return self._taken

    def take(self, nbytes: int, *, worker: int) -> torch.UntypedStorage:
        """A shared segment of at least ``nbytes`` for the item in progress: a free slot's (grown if too small),
        else a fresh one."""
        free = np.flatnonzero(self.flags[worker].numpy() == 0)
        if free.size == 0:
            return torch.UntypedStorage._new_shared(nbytes)
        big_enough = [int(s) for s in free if s in self._segments and self._segments[s].nbytes() >= nbytes]
        slot = big_enough[0] if big_enough else next((int(s) for s in free if s not in self._segments), int(free[0]))
        if not big_enough:  # a new slot, or one too small for this result: its old segment is no one's any more
            self._segments[slot] = torch.UntypedStorage._new_shared(nbytes)
        self.flags[worker, slot] = self.generation
        self._taken.append(slot)
        return self._segments[slot]

    # ---------------------------------------------------------------- in the reading process
    def next_generation(self) -> int:
        self.generation = self.generation % 255 + 1
        return self.generation

    def deliver(self, *, worker: int, slots: list[int], result: Any) -> None:
        """``result`` of ``worker`` went out on ``slots``: they return once its tensors are gone (at once when
        pinned: the pin thread copied them)."""
        if slots:
            watched = [StorageWeakRef(t.untyped_storage()) for t in _tensors_in(result) if not t.is_pinned()]
            self._delivered.append((worker, slots, watched))

    def release_returned(self) -> None:
        """Free the slots of every delivered result whose tensors are all gone."""
        kept = []
        for worker, slots, watched in self._delivered:
            if all(ref.expired() for ref in watched):
                self.flags[worker, slots] = 0
            else:
                kept.append((worker, slots, watched))
        self._delivered = kept

    def reclaim(self) -> None:
        """At a map's start, once the DataLoader has dropped the previous map's outstanding results: free what an
        earlier generation lent and no delivered result holds."""
        self.release_returned()
        held = torch.zeros_like(self.flags, dtype=torch.bool)
        for worker, slots, _ in self._delivered:
            held[worker, slots] = True
        stale = (self.flags != 0) & (self.flags != self.generation) & ~held
        self.flags[stale] = 0


def _tensors_in(result: Any) -> Iterator[torch.Tensor]:
    """The tensors of a worker's result: itself, or inside its tuples, lists, dicts and dataclasses."""
    if isinstance(result, torch.Tensor):
        yield result
    elif isinstance(result, (tuple, list)):
        for part in result:
            yield from _tensors_in(part)
    elif isinstance(result, dict):
        for part in result.values():
            yield from _tensors_in(part)
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        for field in dataclasses.fields(result):
            yield from _tensors_in(getattr(result, field.name))


class _Apply(TorchDataset):
    """Map-style dataset whose item for a planned work item is ``fn(item)``: the sampler hands over the work,
    ``(generation, item)``, and the result comes back as ``(worker, slots lent, fn(item))``."""

    def __init__(self, fn: Callable[[Any], Any], *, buffers: _ResultBuffers | None = None) -> None:
        self.fn = fn
        self.buffers = buffers

    def __getitem__(self, planned: tuple[int, Any]) -> tuple[int, list[int], Any]:
        generation, item = planned
        if self.buffers is None:  # inline: no workers, no segments
            return -1, [], self.fn(item)
        self.buffers.start_item(generation)
        try:
            result = self.fn(item)
        except MclpipeError as err:  # to the reader as itself: the DataLoader re-raises a worker's error as a traceback
            result = _Raised(err)
        return get_worker_info().id, self.buffers.taken(), result


class _Raised:
    """A worker's user-facing error (its one-line message naming the fix), raised again by the reading process."""

    def __init__(self, error: MclpipeError) -> None:
        self.error = error


class _Plan:
    """The DataLoader's sampler: the work items of the map in progress (set by :meth:`OrderedWorkers.map`)."""

    def __init__(self) -> None:
        self.items: Iterator = iter(())

    def __iter__(self) -> Iterator:
        return self.items


def _as_is(item):
    """collate_fn for ``batch_size=None``: keep the item (the default would turn the numpy rows into a tensor)."""
    return item


def result_tensor(shape: tuple[int, ...], *, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An empty tensor of ``shape`` for a worker's result: in a worker process it lives in shared memory from the
    start, so handing it to the reading process copies nothing (as the DataLoader's own collate does; an ordinary
    tensor would be copied into shared memory on the way out). In an :class:`OrderedWorkers` worker the memory is
    a segment the worker reuses once the reading process is done with it (:class:`_ResultBuffers`), so it is not
    zeroed: write every element."""
    info = get_worker_info()
    if info is None:
        return torch.empty(shape, dtype=dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buffers = getattr(info.dataset, "buffers", None)
    storage = (buffers.take(nbytes, worker=info.id) if buffers is not None and nbytes
               else torch.UntypedStorage._new_shared(nbytes))
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


_WORKER_MODULES = ("torch", "PIL.Image", "contrastive.data.loading")
#: The longest temporary directory under which the forkserver's socket path fits: it is
#: ``<tmp>/pymp-XXXXXXXX/listener-XXXXXXXX`` (32 characters past the directory), and a Unix socket's path holds at
#: most 107 bytes (Linux's ``sun_path`` of 108, with its terminating NUL).
LONGEST_SOCKET_TMPDIR = 107 - 32


def _check_socket_dir(setting: str) -> None:
    """Refuse, naming the fix, a temporary directory too long for the forkserver's socket: Python would fail on the
    first worker with a bare ``OSError: AF_UNIX path too long`` (a TMPDIR deep inside a job's or a test's scratch)."""
    import tempfile

    directory = tempfile.gettempdir()
    if len(directory.encode()) > LONGEST_SOCKET_TMPDIR:
        raise ConfigError(f"worker processes talk through a Unix socket under the temporary directory {directory} "
                          f"({len(directory.encode())} bytes), and its path would pass the 107 bytes a socket path "
                          f"holds: set TMPDIR to a directory of at most {LONGEST_SOCKET_TMPDIR} bytes (export "
                          f"TMPDIR=/tmp), or {setting}=0 to read in this process")


def _worker_context(preload: tuple[str, ...] = ()) -> str:
    """Workers start from a forkserver, not a fork of this process: a fork of a process that runs a Prefect flow
    (its event loop and API log threads) dies on start. The server imports what every worker needs once, so a
    pool's workers start in milliseconds instead of re-importing torch (about 1.5 s a pool) or open_clip (about
    2 s). The first pool of a process starts the server, with its ``preload`` modules beside the common ones; the
    list has no effect once the server runs (a later pool's extra modules are imported by its workers)."""
    import multiprocessing

    multiprocessing.set_forkserver_preload([*_WORKER_MODULES, *preload])
    return "forkserver"


class ClosedOnExit:
    """``with reader:`` ends its workers on the way out (``close``), whatever ends the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class OrderedWorkers(ClosedOnExit):
    """``fn`` over work items in the order given, in ``workers`` DataLoader worker processes that start on the first
    map and stay (``persistent_workers``) until :meth:`close`: the one worker pool of every reader (image-file
    batches, CLIP shard samples). ``workers=0`` runs ``fn`` in the calling thread.

    The items are the DataLoader's sampler (``batch_size=None``): the plan stays the caller's and a worker only
    computes ``fn(item)`` on what it is handed (row arrays, a few encoded samples); results come back in order, their
    tensors through shared memory: segments a worker writes its results into again once the reader has dropped
    (or the pin thread copied) what it sent in them (:func:`result_tensor`, :class:`_ResultBuffers`). ``fn`` must
    pickle (a module-level class). One map at a time: a new map ends the previous one (the workers' outstanding
    results are dropped).

    Args:
        fn: item -> result, run in the workers.
        workers: worker processes (0: inline).
        prefetch: items each worker computes ahead (``prefetch_factor``): ``workers x prefetch`` in flight.
        pin_memory: pin the results' tensors (the DataLoader's pin thread) for asynchronous copies to a GPU.
        setting: the config setting that sets ``workers``, named by the error.
        preload: modules ``fn`` needs, imported once by the worker server if this pool starts it.

    Raises:
        ConfigError: ``workers`` < 0 or ``prefetch`` < 1.
    """

    def __init__(self, fn: Callable[[Any], Any], *, workers: int, prefetch: int = 2, pin_memory: bool = False,
                 setting: str = "train.workers", preload: tuple[str, ...] = ()) -> None:
        if workers < 0 or prefetch < 1:
            raise ConfigError(f"reading needs workers >= 0 and prefetch >= 1, got workers={workers}, "
                              f"prefetch={prefetch}: set {setting} to 0 or more")
        self.fn = fn
        self.workers = workers
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.preload = preload
        self.setting = setting
        self._plan = _Plan()
        self._loader: DataLoader | None = None

    def map(self, items: Iterable) -> Iterator:
        """fn(item) for every item, in order."""
        loader = self._data_loader()
        buffers = loader.dataset.buffers
        generation = buffers.next_generation() if buffers is not None else 0
        self._plan.items = ((generation, item) for item in items)
        results = iter(loader)  # a pool's workers finish the previous map's work here, and it is dropped
        if buffers is None:
            yield from (result for _, _, result in results)
            return
        buffers.reclaim()
        for worker, slots, result in results:
            buffers.deliver(worker=worker, slots=slots, result=result)
            if isinstance(result, _Raised):
                raise result.error
            yield result
            del result  # this frame's reference: only the consumer's keep a slot lent now
            buffers.release_returned()

    def _data_loader(self) -> DataLoader:
        if self._loader is None:
            workers = self.workers
            if workers:
                _check_socket_dir(self.setting)
            # A worker's results in flight: those queued (prefetch), the one it computes, and a few the consumer
            # holds (a batch in its step, one being augmented); more than that and it falls back to fresh memory.
            buffers = _ResultBuffers(workers=workers, slots=self.prefetch + 4) if workers else None
            self._loader = DataLoader(_Apply(self.fn, buffers=buffers), batch_size=None, sampler=self._plan,
                                      num_workers=workers, collate_fn=_as_is, pin_memory=self.pin_memory,
                                      prefetch_factor=self.prefetch if workers else None,
                                      persistent_workers=workers > 0,
                                      multiprocessing_context=_worker_context(self.preload) if workers else None)
        return self._loader

    def worker_processes(self) -> list:
        """The worker processes started (none before the first map, inline, or after :meth:`close`)."""
        return list(getattr(getattr(self._loader, "_iterator", None), "_workers", []))

    def close(self) -> None:
        """End the workers (a later map starts new ones)."""
        loader, self._loader = self._loader, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
