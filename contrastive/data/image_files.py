"""Image datasets too large to decode in advance (ImageNet): an index on disk, pixels decoded when read.

``prepare_image_folder(..., storage="files")`` writes a dataset directory that holds no pixels::

    index.npz      ids (N,) str = paths relative to the source folder; split (N,) str; label_<attr> (N,) int64
    manifest.json  {"kind": "image_folder", "storage": "files", "source": "/abs/path/to/images",
                    "num_samples", "num_train", "num_test", "image_size", "attributes", "params", "digest"}

Its size grows with the number of ids (O(N) bytes), not with the pixels; a process that opens it leaves the ids,
split and labels on disk (:class:`contrastive.data.dataset.StoredColumn`) and reads the rows a batch asks for, so
neither it nor its DataLoader workers hold O(N) bytes of index. :class:`ImageFileDataset` opens it and
decodes each file with the same function the "memory" storage uses when it fills ``images.npy``
(:func:`contrastive.data.image_decode.load_square_rgb`: EXIF rotation, RGB, the centre square of side
min(width, height) resampled to ``image_size`` x ``image_size``, i.e. the shorter side resized to ``image_size``
and centre-cropped, in one bicubic resampling), so both storages give the same pixels for the same folder.

:class:`IndexedImageDataset` is what every such dataset shares (the index, the decoding of rows one by one or in
batches, skipping, pickling for DataLoader workers); a subclass only says where the encoded bytes of a row are
(:meth:`IndexedImageDataset.open_image`): a file here, a tar member for webdataset shards
(:class:`contrastive.data.shards.ShardDataset`).

:func:`contrastive.data.loading.load_dataset` opens any kind of dataset directory. For reading many batches
quickly (DataLoader workers, skipping of unreadable images) see :func:`contrastive.data.loading.iter_batches`.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, ClassVar

import numpy as np
import torch

from contrastive.data.dataset import (INDEX_FILE, LABEL_PREFIX, MANIFEST_FILE, ImageArrayDataset, SampleIndex,
                                      _as_index_array, _manifest_fields_ok, chunks_of, load_arrays, load_column,
                                      read_manifest, repeated_strings)
from contrastive.data.image_decode import decode_scale_of, file_index_digest, read_image_file, square_or_error
from contrastive.data.skips import SkipCounter
from contrastive.data.workers import result_tensor
from contrastive.errors import DataError

log = logging.getLogger(__name__)

STORAGE_FILES = "files"
DEFAULT_MAX_SKIP_FRACTION = 0.01
UNREADABLE = "unreadable_image"  # the SkipCounter reason of an image PIL cannot decode
IMAGE_SKIP_FIX = ("delete or re-export the unreadable files (or prepare the folder with "
                  "data.image_folder.storage=memory, which drops them once), or raise "
                  "data.image_folder.max_skip_fraction")
_MAX_THREADS = 8  # threads decoding one get_batch call (PIL decodes and resizes outside the GIL)


class BrokenSample(Exception):
    """A stored sample that is itself damaged (a tar member cut short): skipped and counted, as an image that does
    not decode, unlike an I/O error reading its file (DataReadError)."""


class IndexedImageDataset(SampleIndex):
    """A prepared index (ids, split, labels; no pixels) whose images are decoded when a row is read.

    The same interface as :class:`~contrastive.data.dataset.ImageArrayDataset` where the pipeline uses one
    (``ids``, ``split``, ``labels``, ``attributes``, ``class_names``, ``manifest``, ``digest``, ``image_size``,
    ``len()``, :meth:`indices`, :meth:`verify_ids`, :meth:`verify_digest`, :meth:`get_batch`), plus :meth:`read`
    for one row and :meth:`decode_rows` for the batch reader's workers. Picklable (DataLoader workers under any
    start method): per-process state (threads, open files) is rebuilt on first use after unpickling.

    Subclasses set :attr:`storage` and :attr:`skip_fix` and implement :meth:`open_image`, :meth:`skip_url`,
    :attr:`origin` and :meth:`compute_digest`; they may extend :meth:`_init_runtime` (and :attr:`_RUNTIME`, the
    attributes that must not be pickled).

    Attributes:
        path: the dataset directory (the index).
        skips: the :class:`~contrastive.data.skips.SkipCounter` of :meth:`get_batch` calls.
        max_skip_fraction: the threshold of :attr:`skips`, and of :func:`~contrastive.data.loading.iter_batches`
            when its caller gives none.
    """

    storage: ClassVar[str] = ""  # the manifest's "storage" value this class opens
    skip_fix: ClassVar[str] = IMAGE_SKIP_FIX  # how to fix too many unreadable images (ends the DataError)
    _RUNTIME: ClassVar[tuple[str, ...]] = ("skips", "_pool", "_pool_lock")

    def __init__(self, *, path: Path, index: Mapping[str, np.ndarray], manifest: Mapping[str, Any],
                 max_skip_fraction: float | None = None) -> None:
        super().__init__(path=path, index=index, manifest=manifest)
        if max_skip_fraction is None:
            max_skip_fraction = manifest.get("max_skip_fraction", DEFAULT_MAX_SKIP_FRACTION)
        self.max_skip_fraction = float(max_skip_fraction)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.skips = SkipCounter(max_skip_fraction=self.max_skip_fraction, where=f"dataset {self.path.name}",
                                 fix=self.skip_fix)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._RUNTIME:  # locks, threads and open files cannot cross a process boundary
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def read_index(cls, path: Path, *, extra_arrays: Sequence[str] = (),
                   required: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
        """(manifest, index arrays, fix) of the index directory ``path`` after the checks every storage needs.

        ``index`` holds ids, split, label_<attr> and ``extra_arrays``, all of shape (num_samples,); the manifest
        has the common fields, ``"storage": cls.storage`` and the keys ``required``; ``fix`` is the advice that
        ends this class's DataErrors about the directory.

        Raises:
            DataError: a file is missing or damaged, or the index disagrees with the manifest.
        """
        path = Path(path)
        fix = f"run `mclpipe run` again to regenerate it, or delete the directory {path} if it keeps failing"
        if not path.is_dir():
            raise DataError(f"prepared dataset {path} does not exist: {fix}")
        missing = [n for n in (INDEX_FILE, MANIFEST_FILE) if not (path / n).is_file()]
        if missing:
            raise DataError(f"prepared dataset {path} is incomplete (missing {', '.join(missing)}): {fix}")
        manifest = read_manifest(path)
        if (manifest is None or not _manifest_fields_ok(manifest) or manifest.get("storage") != cls.storage
                or any(k not in manifest for k in required)):
            raise DataError(f"{path / MANIFEST_FILE} is corrupt, from an incompatible version or not an index of "
                            f"storage {cls.storage!r}: {fix}")
        # ids, split and labels stay on disk, read a batch's rows (or a chunk) at a time: in memory they would cost
        # 70 bytes a sample (1M paths: 70 MB), in this process and in every DataLoader worker it is pickled to.
        columns = ["ids", "split", *(LABEL_PREFIX + a for a in manifest["attributes"])]
        index = {name: load_column(path / INDEX_FILE, name, fix=fix) for name in columns}
        index.update(load_arrays(path / INDEX_FILE, names=list(extra_arrays), fix=fix))
        n = int(manifest["num_samples"])
        for name, arr in index.items():
            if arr.shape != (n,):
                raise DataError(f"{path / INDEX_FILE}: {name} has shape {arr.shape}, expected ({n},): {fix}")
        repeated = repeated_strings(chunks_of(index["ids"]), count=len(index["ids"]))
        if repeated:
            raise DataError(f"{path / INDEX_FILE}: sample ids are not unique (e.g. {repeated}): {fix}")
        return manifest, index, fix

    # ----------------------------------------------------------------------------------------- access
    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.path)!r}, origin={self.origin!r}, n={len(self)}, "
                f"image_size={self.image_size}, attributes={self.attributes})")

    @property
    def image_size(self) -> int:
        return int(self.manifest["image_size"])

    @property
    def decode_scale(self) -> str:
        """How JPEGs are decoded ("full" or "auto", :func:`contrastive.data.image_decode.load_square_rgb`): as
        the dataset was prepared."""
        return decode_scale_of(self.manifest.get("params", {}))

    @property
    def origin(self) -> str:
        """Where the images are, for messages (a folder, a set of shards)."""
        raise NotImplementedError

    def open_image(self, row: int) -> str | os.PathLike | IO[bytes]:
        """The encoded image of ``row``: a path or a binary file object PIL can open. Raises FileNotFoundError (a
        file deleted since it was indexed) or BrokenSample for a broken sample, which :meth:`decode` turns into an
        unreadable row, and DataReadError when a file cannot be read (an I/O error, twice)."""
        raise NotImplementedError

    def encoded(self, row: int) -> bytes:
        """The encoded bytes of ``row`` (:meth:`open_image`); a file's read is tried twice (``read_twice``)."""
        source = self.open_image(row)
        return source.read() if hasattr(source, "read") else read_image_file(Path(source))

    def skip_url(self, row: int) -> str:
        """Where an unreadable ``row`` lives (the image folder, the shard), for skip messages."""
        raise NotImplementedError

    def decode(self, row: int, *, resample: bool = True) -> np.ndarray | str:
        """uint8 (S, S, 3) of ``row``, or the error text ("OSError: ...") when the sample is broken: its file gone,
        its bytes no image. Reading and decoding are apart: an I/O error reading the index or the file is no broken
        sample and ends the read (DataReadError, after a second try), whatever PIL raises decoding the bytes read
        (OSError included: "image file is truncated") marks the sample broken. ``resample=False``: a JPEG of
        ``decode_scale`` "auto" as its centre square at the decoded side (n, n, 3), for :meth:`decode_squares`."""
        try:
            data = self.encoded(row)
        except (FileNotFoundError, BrokenSample) as err:
            return f"{type(err).__name__}: {err}"
        return square_or_error(data, size=self.image_size, decode_scale=self.decode_scale, resample=resample)

    def read(self, row: int) -> torch.Tensor | None:
        """uint8 (3, S, S) of ``row``: shorter side resized to S and centre-cropped; None if unreadable
        (missing, zero bytes, truncated or not an image)."""
        image = self.decode(row)
        if isinstance(image, str):
            return None
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))  # a writable copy

    def decode_rows(self, rows: Sequence[int] | np.ndarray, *, threads: int = 1,
                    ) -> tuple[np.ndarray, torch.Tensor, list[tuple[int, str]]]:
        """Decode ``rows`` in order: (rows kept int64 (b,), uint8 (b, 3, S, S), [(unreadable row, error)]).

        ``threads`` > 1 decodes with this dataset's thread pool (not in a DataLoader worker: one per process).
        """
        rows, results, keep, failures = self._decoded_rows(rows, threads=threads, resample=True)
        images = result_tensor((len(keep), 3, self.image_size, self.image_size))
        channels_last = images.permute(0, 2, 3, 1).numpy()  # a view: each (S, S, 3) image is written transposed, once
        for out, i in enumerate(keep):
            channels_last[out] = results[i]
        return rows[keep], images, failures

    def decode_squares(self, rows: Sequence[int] | np.ndarray, *, threads: int = 1,
                       ) -> tuple[np.ndarray, torch.Tensor, np.ndarray, list[tuple[int, str]]]:
        """:meth:`decode_rows` with the resampling left out (``train.resample_on_gpu``): (rows kept int64 (b,),
        uint8 flat: each kept row's centre square (n, n, 3) back to back, sides int64 (b,): each one's n,
        failures). :func:`contrastive.data.image_decode.resample_squares` makes the (b, 3, S, S) batch of them."""
        rows, results, keep, failures = self._decoded_rows(rows, threads=threads, resample=False)
        squares = [results[i] for i in keep]
        sides = np.array([square.shape[0] for square in squares], dtype=np.int64)
        flat = result_tensor((int(sum(square.size for square in squares)),))
        at, out = 0, flat.numpy()
        for square in squares:
            out[at:at + square.size] = square.reshape(-1)
            at += square.size
        return rows[keep], flat, sides, failures

    def _decoded_rows(self, rows: Sequence[int] | np.ndarray, *, threads: int, resample: bool
                      ) -> tuple[np.ndarray, list, list[int], list[tuple[int, str]]]:
        """(rows int64, each row's decode result, positions decoded, [(unreadable row, error)])."""
        rows = np.asarray(rows, dtype=np.int64)
        decode = functools.partial(self.decode, resample=resample)
        if threads > 1 and rows.size > 1:
            results = list(self._thread_pool().map(decode, rows.tolist()))
        else:
            results = [decode(int(r)) for r in rows]
        keep = [i for i, result in enumerate(results) if not isinstance(result, str)]
        failures = [(int(rows[i]), result) for i, result in enumerate(results) if isinstance(result, str)]
        return rows, results, keep, failures

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
        """uint8 (B, 3, S, S) of rows ``indices``, in the order given, decoded by a thread pool in this process.

        Callers of ``get_batch`` key results by position, so nothing is dropped here: an unreadable image gives
        an all-zero image, is counted in :attr:`skips` and logged, and DataError is raised once more than
        ``max_skip_fraction`` of (at least 1000) images read were unreadable. :func:`~contrastive.data.loading.
        iter_batches` is the faster reader (DataLoader workers) that skips such images instead.
        """
        idx = _as_index_array(indices, size=len(self))
        kept, images, failures = self.decode_rows(idx, threads=min(_MAX_THREADS, os.cpu_count() or 1))
        if not failures:
            self.skips.ok(len(kept))
            return images
        out = torch.zeros((len(idx), 3, self.image_size, self.image_size), dtype=torch.uint8)
        good = np.ones(len(idx), dtype=bool)
        bad_rows = {row for row, _ in failures}
        good[[i for i, row in enumerate(idx.tolist()) if row in bad_rows]] = False
        out[torch.from_numpy(np.flatnonzero(good))] = images
        for row, error in failures:
            self.skips.skip(reason=UNREADABLE, key=str(self.ids[row]), url=self.skip_url(row),
                            detail=f"{error}; replaced by a black image")
        self.skips.ok(len(kept))
        return out

    def _thread_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=min(_MAX_THREADS, os.cpu_count() or 1),
                                                thread_name_prefix="image-decode")
            return self._pool


class ImageFileDataset(IndexedImageDataset):
    """A file-backed image folder (storage "files") opened for reading: an index on disk, pixels on demand.

    Attributes:
        source: the image folder the ids are relative to.
    """

    storage = STORAGE_FILES
    skip_fix = IMAGE_SKIP_FIX

    def __init__(self, *, path: Path, source: Path, index: Mapping[str, np.ndarray], manifest: Mapping[str, Any],
                 max_skip_fraction: float | None = DEFAULT_MAX_SKIP_FRACTION) -> None:
        self.source = Path(source)
        super().__init__(path=path, index=index, manifest=manifest, max_skip_fraction=max_skip_fraction)

    @classmethod
    def load(cls, path: Path, *, verify_digest: bool = False,
             max_skip_fraction: float | None = DEFAULT_MAX_SKIP_FRACTION) -> "ImageFileDataset":
        """Open a directory written by ``prepare_image_folder(..., storage="files")``.

        Args:
            path: the dataset directory.
            verify_digest: re-hash the index and compare with the manifest (reads no image).
            max_skip_fraction: threshold of :attr:`skips` (unreadable files met by :meth:`get_batch`).

        Raises:
            DataError: a file is missing or damaged, the index disagrees with the manifest, or the source folder
                is gone.
        """
        manifest, index, _ = cls.read_index(path, required=("source",))
        source = Path(manifest["source"])
        if not source.is_dir():
            raise DataError(f"the image folder {source} that dataset {path} indexes no longer exists: restore it, "
                            "or point data.image_folder.source at its new place and run again")
        dataset = cls(path=path, source=source, index=index, manifest=manifest, max_skip_fraction=max_skip_fraction)
        if verify_digest:
            dataset.verify_digest()
        return dataset

    def compute_digest(self) -> str:
        return file_index_digest(index=self.index_arrays(), params=self.manifest["params"])

    @property
    def origin(self) -> str:
        return str(self.source)

    def file(self, row: int) -> Path:
        """The image file of ``row``."""
        return self.source / str(self.ids[int(row)])

    def open_image(self, row: int) -> Path:
        return self.file(row)

    def skip_url(self, row: int) -> str:
        return str(self.source)


Dataset = ImageArrayDataset | IndexedImageDataset
