"""Open a prepared dataset, and read it batch by batch: a slice for ``images.npy``, DataLoader workers decoding
the images of an index (image files, webdataset shards).

:func:`load_dataset` picks the class from the directory's manifest. :func:`iter_batches` is the one reader for
every storage. For an :class:`~contrastive.data.dataset.ImageArrayDataset` a batch is a memmap slice, read in this
process (there is nothing to decode). For an :class:`~contrastive.data.image_files.IndexedImageDataset` (image
files, :class:`~contrastive.data.shards.ShardDataset`) every batch is one item of a map-style dataset that
``torch.utils.data.DataLoader`` workers decode whole (``batch_size=None``): the plan of batches (the sampler's
order, MCL's group-pure batches) stays the caller's, the workers only decode, and the batches come back in the
order given. Unreadable images are dropped from their batch, counted in a
:class:`~contrastive.data.skips.SkipCounter` and logged; more than ``max_skip_fraction`` of them ends the run
with a :class:`~contrastive.errors.DataError` naming the first bad images and the fix.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from contrastive.data.dataset import ImageArrayDataset, _as_index_array, read_manifest
from contrastive.data.image_files import UNREADABLE, Dataset, ImageFileDataset, IndexedImageDataset
from contrastive.data.shards import ShardDataset
from contrastive.data.skips import SkipCounter
from contrastive.errors import ConfigError

log = logging.getLogger(__name__)

# The manifest's "storage" -> the class that opens the directory; anything else (no "storage": Trifeature, an
# image folder with storage "memory") is an images.npy dataset.
INDEX_CLASSES: dict[str, type[IndexedImageDataset]] = {cls.storage: cls for cls in (ImageFileDataset, ShardDataset)}

_IN_PROCESS_THREADS = 8  # decode threads when workers=0 (PIL decodes outside the GIL)


class _BatchDecoder(TorchDataset):
    """Map-style dataset whose item ``i`` is batch ``i`` decoded: (rows kept, uint8 (b, 3, S, S), failures)."""

    def __init__(self, dataset: IndexedImageDataset, batches: list[np.ndarray], *, threads: int = 1) -> None:
        self.dataset = dataset
        self.batches = batches
        self.threads = threads

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[np.ndarray, torch.Tensor, list[tuple[int, str]]]:
        return self.dataset.decode_rows(self.batches[i], threads=self.threads)


def _as_is(item):
    """collate_fn for ``batch_size=None``: keep the item (the default would turn the numpy rows into a tensor)."""
    return item


def load_dataset(directory: Path, *, verify_digest: bool = False,
                 max_skip_fraction: float | None = None) -> Dataset:
    """Open a prepared dataset directory as the class its manifest's ``"storage"`` calls for.

    ``"files"`` (an image folder's index) gives an :class:`~contrastive.data.image_files.ImageFileDataset`,
    ``"shards"`` (a webdataset index) a :class:`~contrastive.data.shards.ShardDataset`; anything else (Trifeature,
    an image folder with storage "memory") an :class:`~contrastive.data.dataset.ImageArrayDataset`, whose loader
    reports what is missing or damaged.

    Args:
        max_skip_fraction: threshold of an index's skip counter; None = the one its preparation recorded
            (shards), else 1 %. Unused for ``images.npy``.

    Raises:
        DataError: as the chosen class's ``load``.
    """
    manifest = read_manifest(Path(directory))
    cls = INDEX_CLASSES.get(manifest.get("storage")) if manifest is not None else None
    if cls is not None:
        return cls.load(directory, verify_digest=verify_digest, max_skip_fraction=max_skip_fraction)
    return ImageArrayDataset.load(directory, verify_digest=verify_digest)


def iter_batches(dataset: Dataset, batches: Iterable[np.ndarray], *, workers: int, prefetch: int = 2,
                 max_skip_fraction: float | None = None, counter: SkipCounter | None = None,
                 pin_memory: bool | None = None) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """Yield ``(rows_kept, uint8 (b, 3, S, S))`` for every batch of dataset rows, in the order of ``batches``.

    Args:
        dataset: an ImageArrayDataset (read in this process: a slice, nothing to decode, no workers) or an
            IndexedImageDataset (image files, shards: decoded by DataLoader workers, one whole batch per worker
            task).
        batches: int arrays of dataset rows, one per batch. For an index they are collected into a list first (the
            DataLoader indexes them): an ImageNet epoch of 256-image batches is ~10 MB of row numbers.
        workers: DataLoader worker processes for an index (0 = decode in this process, with threads).
        prefetch: batches each worker decodes ahead (DataLoader ``prefetch_factor``; unused when workers=0).
        max_skip_fraction: unreadable share of the images seen above which DataError is raised (checked every
            1000 images and after the last batch); None = the dataset's ``max_skip_fraction``. Ignored when
            ``counter`` is given.
        counter: a SkipCounter to count into (e.g. one per training run across epochs); default: a new one.
        pin_memory: pin the image tensors (faster copies to the GPU); default: when CUDA is available.

    Yields:
        One pair per batch, also for a batch whose every image was unreadable (then b = 0): the rows that
        were decoded, int64 (b,), in the batch's order, and their images. An ImageArrayDataset keeps every row.

    Raises:
        DataError: more than ``max_skip_fraction`` of the images seen so far are unreadable (names up to 3).
        ConfigError: ``workers`` < 0 or ``prefetch`` < 1.
        IndexError: a batch holds a row outside the dataset.
    """
    if workers < 0 or prefetch < 1:
        raise ConfigError(f"iter_batches needs workers >= 0 and prefetch >= 1, got workers={workers}, "
                          f"prefetch={prefetch}")
    if not isinstance(dataset, IndexedImageDataset):
        for batch in batches:  # images.npy: the memmap slice is the fast path
            rows = _as_index_array(batch, size=len(dataset))
            yield rows, dataset.get_batch(rows)
        return
    yield from _iter_file_batches(dataset, batches, workers=workers, prefetch=prefetch,
                                  max_skip_fraction=max_skip_fraction, counter=counter, pin_memory=pin_memory)


_WORKER_MODULES = ["torch", "PIL.Image", "contrastive.data.loading"]


def _worker_context() -> str:
    """Workers start from a forkserver, not a fork of this process: a fork of a process that runs a Prefect flow
    (its event loop and API log threads) dies on start. The server imports what every worker needs once, so an
    epoch's workers start in milliseconds instead of re-importing torch (about 1.5 s an epoch)."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(_WORKER_MODULES)  # no effect once the server runs: same list anyway
    return "forkserver"


def _iter_file_batches(dataset: IndexedImageDataset, batches: Iterable[np.ndarray], *, workers: int, prefetch: int,
                       max_skip_fraction: float | None, counter: SkipCounter | None,
                       pin_memory: bool | None) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    plan = [_as_index_array(batch, size=len(dataset)) for batch in batches]
    if counter is None:
        counter = SkipCounter(max_skip_fraction=dataset.max_skip_fraction if max_skip_fraction is None
                              else max_skip_fraction, where=f"reading images of {dataset.origin}",
                              fix=dataset.skip_fix)
    threads = 1 if workers else min(_IN_PROCESS_THREADS, os.cpu_count() or 1)
    loader = DataLoader(_BatchDecoder(dataset, plan, threads=threads), batch_size=None, shuffle=False,
                        num_workers=workers, collate_fn=_as_is,
                        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
                        prefetch_factor=prefetch if workers else None, persistent_workers=False,
                        multiprocessing_context=_worker_context() if workers else None)
    skipped_before = sum(counter.skipped.values())
    for kept, images, failures in loader:  # in the order of ``plan``: the default sampler is sequential
        for row, error in failures:
            counter.skip(reason=UNREADABLE, key=str(dataset.ids[row]), url=dataset.skip_url(row), detail=error)
        counter.ok(len(kept))
        yield kept, images
    counter.check()
    skipped = sum(counter.skipped.values()) - skipped_before
    if skipped:
        log.warning("%s: skipped %d unreadable image(s) in %d batches (%d skipped of %d seen in all)",
                    counter.where, skipped, len(plan), sum(counter.skipped.values()), counter.seen)
