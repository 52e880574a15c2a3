"""Open a prepared dataset, and read it batch by batch: a slice for ``images.npy``, DataLoader workers decoding
the images of an index (image files, webdataset shards).

:func:`load_dataset` picks the class from the directory's manifest. :class:`BatchReader` is the one reader for
every storage (a stage keeps one for all its epochs; :func:`iter_batches` is one read of a fresh one). For an
:class:`~contrastive.data.dataset.ImageArrayDataset` a batch is a memmap slice, read in this process (there is
nothing to decode). For an :class:`~contrastive.data.image_files.IndexedImageDataset` (image files,
:class:`~contrastive.data.shards.ShardDataset`) every batch is one item of a map-style dataset that
``torch.utils.data.DataLoader`` workers decode whole (``batch_size=None``), the plan of batches being the
DataLoader's sampler: the plan (the sampler's order, MCL's group-pure batches) stays the caller's, the workers
(persistent across reads) only decode, and the batches come back in the order given. :func:`default_workers` is
the rule for how many workers when the config leaves it unset. Unreadable images are dropped from their batch, counted in a
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

from contrastive.data.dataset import ImageArrayDataset, _as_index_array, read_manifest
from contrastive.data.image_decode import resample_squares
from contrastive.data.image_files import UNREADABLE, Dataset, ImageFileDataset, IndexedImageDataset
from contrastive.data.shards import ShardDataset
from contrastive.data.skips import SkipCounter
from contrastive.data.workers import ClosedOnExit, OrderedWorkers
from contrastive.engine.device import available_cores

log = logging.getLogger(__name__)

# The manifest's "storage" -> the class that opens the directory; anything else (no "storage": Trifeature, an
# image folder with storage "memory") is an images.npy dataset.
INDEX_CLASSES: dict[str, type[IndexedImageDataset]] = {cls.storage: cls for cls in (ImageFileDataset, ShardDataset)}

_IN_PROCESS_THREADS = 8  # decode threads when workers=0 (PIL decodes outside the GIL)


MAX_DEFAULT_WORKERS = 16  # a GPU host's cores per GPU; more workers than that only add start-up and memory


def default_workers(*, cores: int | None = None, processes: int | None = None) -> int:
    """The decode workers of one training process when ``train.workers`` is unset (the stated rule).

    ``cores`` (default: :func:`available_cores`) shared by the ``processes`` of this node (default: torchrun's
    ``LOCAL_WORLD_SIZE``, else 1), less one core for the training thread, at least 1 and at most
    ``MAX_DEFAULT_WORKERS``: 2 cores -> 1 worker, 16 cores and 1 process -> 15, 64 cores and 8 GPUs -> 7.
    """
    cores = available_cores() if cores is None else cores
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if processes is None else processes
    return max(1, min(MAX_DEFAULT_WORKERS, cores // max(1, processes) - 1))


def resolve_workers(workers: int | None) -> int:
    """``workers`` as set, or :func:`default_workers` for None (the config's "auto")."""
    return default_workers() if workers is None else int(workers)


class _BatchDecoder:
    """An int64 row array -> that batch decoded: (rows kept, uint8 (b, 3, S, S), failures), or with ``squares``
    (rows kept, the unresampled squares packed flat, their sides, failures: :meth:`IndexedImageDataset.
    decode_squares`). The rows come from the plan, so one set of workers serves every epoch's plan."""

    def __init__(self, dataset: IndexedImageDataset, *, threads: int = 1, squares: bool = False) -> None:
        self.dataset = dataset
        self.threads = threads
        self.squares = squares

    def __call__(self, rows: np.ndarray) -> tuple:
        if self.squares:
            return self.dataset.decode_squares(rows, threads=self.threads)
        return self.dataset.decode_rows(rows, threads=self.threads)


def resample_device(*, on_gpu: bool, device: torch.device) -> torch.device | None:
    """Where a stage's reader resamples the decoded squares (``train.resample_on_gpu``): ``device`` when the
    setting is on and the stage runs on CUDA, else None (the workers resample, as without the setting).

    A run on the CPU falls back rather than refusing: the setting moves work, not results (the pixels are the
    workers' to rounding, so it is not in the content key), and on a CPU the "device" is the training process
    itself, which would take the resampling from the workers for nothing. So one config serves a GPU host and a
    laptop; each call on a CPU logs the fallback in one INFO line (a stage calls it once, when it builds its reader).
    """
    if not on_gpu:
        return None
    if device.type != "cuda":
        log.info("train.resample_on_gpu is set but the stage runs on %s: the DataLoader workers resample the "
                 "images, as without it", device)
        return None
    return device


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
                 pin_memory: bool | None = None, resample_on: torch.device | None = None,
                 ) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """Yield ``(rows_kept, uint8 (b, 3, S, S))`` for every batch of dataset rows, in the order of ``batches``: one
    read of a :class:`BatchReader` made for it (its workers end with the read).

    Args:
        dataset, workers, prefetch, max_skip_fraction, counter, pin_memory, resample_on: as
            :class:`BatchReader`'s.
        batches: int arrays of dataset rows, one per batch.

    Yields:
        One pair per batch, also for a batch whose every image was unreadable (then b = 0): the rows that
        were decoded, int64 (b,), in the batch's order, and their images. An ImageArrayDataset keeps every row.

    Raises:
        DataError: more than ``max_skip_fraction`` of the images seen so far are unreadable (names up to 3).
        ConfigError: ``workers`` < 0 or ``prefetch`` < 1.
        IndexError: a batch holds a row outside the dataset.
    """
    reader = BatchReader(dataset, workers=workers, prefetch=prefetch, max_skip_fraction=max_skip_fraction,
                         counter=counter, pin_memory=pin_memory, resample_on=resample_on)
    try:
        yield from reader.read(batches)
    finally:
        reader.close()


class BatchReader(ClosedOnExit):
    """Reads planned batches of a dataset, one read per epoch, with the same workers for every read.

    An :class:`~contrastive.data.dataset.ImageArrayDataset` is sliced in this process (nothing to decode, no
    workers). An :class:`~contrastive.data.image_files.IndexedImageDataset` (image files, shards) is decoded by
    ``workers`` DataLoader worker processes, one whole batch per worker task, in the order planned; the workers
    start on the first read and stay (``persistent_workers``) until :meth:`close`, so an epoch does not pay their
    start-up again. Decoding is deterministic (a row's pixels depend on its file alone), so the batches are the
    same whatever the number of workers.

    Args:
        dataset: the dataset to read.
        workers: DataLoader worker processes for an index (0 = decode in this process, with threads);
            :func:`resolve_workers` turns the config's None ("auto") into a number.
        prefetch: batches each worker decodes ahead (``prefetch_factor``): ``workers x prefetch`` batches in
            flight, which covers a step as long as one worker decodes a batch in less than ``workers`` steps.
        max_skip_fraction: unreadable share of the images seen above which DataError is raised (checked every
            1000 images and after each read); None = the dataset's ``max_skip_fraction``. Ignored when ``counter``
            is given.
        counter: a SkipCounter to count into across reads; default: a new one for this reader.
        pin_memory: pin the image tensors (faster, asynchronous copies to the GPU); default: when CUDA is available.
        resample_on: a device (``train.resample_on_gpu``, :func:`resample_device`): the workers ship each JPEG's
            centre square at its decoded size and this reader resamples the batch there
            (:func:`~contrastive.data.image_decode.resample_squares`; the pixels are the workers' to rounding), so
            a batch comes out on that device. None: the workers resample (the default). Only an index decoded with
            ``decode_scale`` "auto" has squares to ship; other datasets read as without it.

    Raises:
        ConfigError: ``workers`` < 0 or ``prefetch`` < 1.
    """

    def __init__(self, dataset: Dataset, *, workers: int, prefetch: int = 2, max_skip_fraction: float | None = None,
                 counter: SkipCounter | None = None, pin_memory: bool | None = None,
                 resample_on: torch.device | None = None) -> None:
        self.dataset = dataset
        self.counter = counter
        if counter is None and isinstance(dataset, IndexedImageDataset):
            self.counter = SkipCounter(max_skip_fraction=dataset.max_skip_fraction if max_skip_fraction is None
                                       else max_skip_fraction, where=f"reading images of {dataset.origin}",
                                       fix=dataset.skip_fix)
        threads = 1 if workers else min(_IN_PROCESS_THREADS, os.cpu_count() or 1)
        indexed = isinstance(dataset, IndexedImageDataset)
        # Only libjpeg-turbo's path ("auto") leaves a square unresampled; PIL's ("full") resamples in the worker.
        self.resample_on = resample_on if indexed and dataset.decode_scale == "auto" else None
        self._workers = OrderedWorkers(_BatchDecoder(dataset, threads=threads, squares=self.resample_on is not None)
                                       if indexed else None, workers=workers, prefetch=prefetch,
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory)

    def read(self, batches: Iterable[np.ndarray]) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        """Yield ``(rows_kept int64 (b,), uint8 (b, 3, S, S))`` for every batch of dataset rows, in order; rows of
        unreadable images are dropped from their batch (b = 0 when none is left), counted and logged.

        Raises:
            DataError: more than ``max_skip_fraction`` of the images seen so far are unreadable.
            IndexError: a batch holds a row outside the dataset.
        """
        checked = (_as_index_array(batch, size=len(self.dataset)) for batch in batches)
        if not isinstance(self.dataset, IndexedImageDataset):
            for rows in checked:  # images.npy: the memmap slice is the fast path
                yield rows, self.dataset.get_batch(rows)
            return
        yield from self._decoded(checked)

    def _decoded(self, plan: Iterator[np.ndarray]) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        dataset, counter = self.dataset, self.counter
        skipped_before, batches = sum(counter.skipped.values()), 0
        for kept, *decoded, failures in self._workers.map(plan):  # in the order planned
            batches += 1
            images = decoded[0] if self.resample_on is None else resample_squares(
                decoded[0].to(self.resample_on, non_blocking=True), decoded[1], size=dataset.image_size)
            for row, error in failures:
                counter.skip(reason=UNREADABLE, key=str(dataset.ids[row]), url=dataset.skip_url(row), detail=error)
            counter.ok(len(kept))
            yield kept, images
        counter.check()
        skipped = sum(counter.skipped.values()) - skipped_before
        if skipped:
            log.warning("%s: skipped %d unreadable image(s) in %d batches (%d skipped of %d seen in all)",
                        counter.where, skipped, batches, sum(counter.skipped.values()), counter.seen)

    def close(self) -> None:
        """End the workers (a later read starts new ones)."""
        self._workers.close()
