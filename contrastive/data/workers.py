"""The one worker pool of mclpipe's readers: a function over planned work items in DataLoader worker processes,
in order, kept across reads (:class:`OrderedWorkers`). The image reader (``contrastive.data.loading.BatchReader``)
hands it row arrays to decode, the CLIP reader (``contrastive.modalities.image_text.data.SampleDecodePool``) chunks
of encoded samples."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data import Dataset as TorchDataset

from contrastive.errors import ConfigError


class _Apply(TorchDataset):
    """Map-style dataset whose item for a planned work item is ``fn(item)``: the sampler hands over the work."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __getitem__(self, item: Any) -> Any:
        return self.fn(item)


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
    tensor would be copied into shared memory on the way out)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


_WORKER_MODULES = ("torch", "PIL.Image", "contrastive.data.loading")


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
    tensors through shared memory. ``fn`` must pickle (a module-level class). One map at a time: a new map ends the
    previous one (the workers' outstanding results are dropped).

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
        self._plan = _Plan()
        self._loader: DataLoader | None = None

    def map(self, items: Iterable) -> Iterator:
        """fn(item) for every item, in order."""
        self._plan.items = iter(items)
        yield from self._data_loader()

    def _data_loader(self) -> DataLoader:
        if self._loader is None:
            workers = self.workers
            self._loader = DataLoader(_Apply(self.fn), batch_size=None, sampler=self._plan, num_workers=workers,
                                      collate_fn=_as_is, pin_memory=self.pin_memory,
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
