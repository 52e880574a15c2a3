"""The on-disk format of a prepared dataset, its atomic writer, and :class:`ImageArrayDataset` to read it.

A prepared dataset is one directory::

    images.npy     uint8 (N, H, W, 3), read with ``np.load(mmap_mode="r")``
    index.npz      ids (N,) str, unique and stable; split (N,) str "train"/"test";
                   label_<attr> (N,) int64 per attribute, -1 where unknown
    manifest.json  {"kind", "num_samples", "num_train", "num_test", "image_size",
                    "attributes": {attr: [class names]}, "params": {...}, "digest": sha256 hex}

Every writer goes through :func:`atomic_dataset_dir`: files are written into a hidden temporary directory next
to the target and renamed into place at the end, so an interrupted preparation never leaves a directory that
looks complete. ``manifest.json`` is written last, and a directory without one is never treated as a dataset.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from contrastive.errors import ConfigError, DataError, DataReadError

IMAGES_FILE = "images.npy"
INDEX_FILE = "index.npz"
MANIFEST_FILE = "manifest.json"
SPLITS = ("train", "test")
LABEL_PREFIX = "label_"
_TMP_MARK = ".tmp-"
# Rows hashed per step when computing the digest: bounds memory for memmapped images of any size.
_DIGEST_CHUNK_BYTES = 64 * 2**20
#: How sample ids (and other string columns of an index) are held in memory: numpy's variable-width UTF-8 strings
#: (16 bytes a string, plus its UTF-8 bytes when longer than 15), not ``<U`` (4 bytes a character, every string
#: padded to the longest): a 40-character path costs 56 bytes instead of 160. Elements are Python ``str``.
STRING_DTYPE = np.dtypes.StringDType()
#: Strings converted, hashed or written at a time (bounds the transient ``<U`` / Python copies of a column).
ID_CHUNK = 1 << 16


# --------------------------------------------------------------------------------------------- string columns
def as_string_array(values) -> np.ndarray:
    """``values`` (a sequence of str, or a ``<U`` / ``S`` (UTF-8) / StringDType array) as a 1-D StringDType array
    (:data:`STRING_DTYPE`), without building an O(N) ``<U`` copy; a StringDType array is returned as is."""
    if isinstance(values, np.ndarray) and values.dtype == STRING_DTYPE:
        return values
    if isinstance(values, np.ndarray) and values.dtype.kind in ("U", "S"):
        out = np.empty(values.shape, dtype=STRING_DTYPE)
        flat, dst = values.reshape(-1), out.reshape(-1)
        for start in range(0, flat.size, ID_CHUNK):  # S -> StringDType decodes UTF-8
            dst[start:start + ID_CHUNK] = flat[start:start + ID_CHUNK]
        return out
    items = values.tolist() if isinstance(values, np.ndarray) else values
    return np.asarray([str(v) for v in items], dtype=STRING_DTYPE)


def saveable_ids(ids) -> np.ndarray:
    """``ids`` as an array ``np.save`` / ``np.savez`` write without pickling: a StringDType array (how a prepared
    dataset holds its ids) becomes ``<U`` of its longest string (what exports, clusters and pseudo-labels store);
    any other array is returned as is."""
    ids = np.asarray(ids)
    if ids.dtype != STRING_DTYPE:
        return ids
    width = int(np.strings.str_len(ids).max()) if ids.size else 1
    return ids.astype(f"<U{max(width, 1)}")


def string_hashes(values: np.ndarray) -> np.ndarray:
    """64-bit FNV-1a of each string's code points (a ``<U`` array's padding ignored): uint64 (n,). The same in
    every process (Python's ``hash`` of a str is salted per process); any string array, converted to ``<U`` here,
    so pass at most a chunk (ID_CHUNK strings) at a time."""
    values = np.asarray(values).reshape(-1)
    values = np.ascontiguousarray(saveable_ids(values) if values.dtype == STRING_DTYPE else values.astype(str))
    width = values.dtype.itemsize // 4
    codes = values.view(np.uint32).reshape(values.size, width) if width else np.zeros((values.size, 0), np.uint32)
    hashes = np.full(values.size, 0xCBF29CE484222325, dtype=np.uint64)
    for column in codes.T:
        hashes = np.where(column != 0, (hashes ^ column) * np.uint64(0x100000001B3), hashes)
    return hashes


def chunks_of(values: np.ndarray) -> Callable[[], Iterator[np.ndarray]]:
    """What :func:`repeated_strings` walks for one array: its ID_CHUNK-string slices, in order."""
    return lambda: (values[start:start + ID_CHUNK] for start in range(0, len(values), ID_CHUNK))


def repeated_strings(chunks: Callable[[], Iterable[np.ndarray]], *, count: int, examples: int = 3) -> list[str]:
    """Up to ``examples`` strings that occur more than once among the string arrays ``chunks()`` yields (at most
    ``count`` strings in all), in order of their second occurrence; [] when all differ. In 8 bytes a string: the
    64-bit hashes of all (:func:`string_hashes`), sorted in place; only the strings whose hash repeats are compared
    as strings, in a second walk of ``chunks()``. Neither the strings nor a sorted copy are held whole."""
    hashes = np.empty(count, dtype=np.uint64)
    filled = 0
    for chunk in chunks():
        hashes[filled:filled + len(chunk)] = string_hashes(chunk)
        filled += len(chunk)
    hashes = hashes[:filled]
    hashes.sort()
    repeated = np.unique(hashes[1:][hashes[1:] == hashes[:-1]])
    del hashes
    seen: set[str] = set()
    found: list[str] = []
    if not repeated.size:
        return found
    for chunk in chunks():
        for value in np.asarray(chunk)[np.isin(string_hashes(chunk), repeated)].tolist():
            if value not in seen:
                seen.add(value)
            elif value not in found:
                found.append(value)
                if len(found) == examples:
                    return found
    return found


def _array_or_column(values):
    """``values`` as an array, unless it is a column read by slices (:class:`StoredColumn`, :class:`RowsOf`): the
    writers, hashers and comparers of string columns walk those a chunk at a time instead of reading them whole."""
    return values if isinstance(values, (StoredColumn, RowsOf)) else np.asarray(values)


def write_npy(file, values) -> None:
    """``values`` (an array, a :class:`StoredColumn` or :class:`RowsOf`) as the .npy ``np.save`` writes without
    pickling, into the open binary ``file``: a StringDType (or object) string array as ``<U`` of its longest
    string, as every earlier version wrote ids, converted ID_CHUNK strings at a time (:func:`write_strings_npy`)."""
    values = _array_or_column(values)
    if values.dtype.kind not in ("T", "O"):
        np.lib.format.write_array(file, np.asarray(values), allow_pickle=False)
        return
    flat = values.reshape(-1) if isinstance(values, np.ndarray) else values
    write_strings_npy(file, chunks_of(flat), shape=values.shape)


def write_strings_npy(file, chunks: Callable[[], Iterable[np.ndarray]], *, shape: tuple[int, ...]) -> None:
    """The strings the 1-D arrays ``chunks()`` yields (prod(``shape``) in all, in order) as one ``<U`` .npy of
    their longest string, into the open binary ``file``: two walks of ``chunks()`` (the width, then the rows), a
    chunk converted at a time, so they are never held as one ``<U`` array (at 12M 30-character ids: 1.4 GB)."""
    width = max(1, max((int(np.strings.str_len(as_string_array(chunk)).max()) for chunk in chunks() if len(chunk)),
                       default=1))
    dtype = np.dtype(f"<U{width}")
    np.lib.format.write_array_header_2_0(file, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                "fortran_order": False, "shape": tuple(shape)})
    for chunk in chunks():
        file.write(memoryview(as_string_array(chunk).astype(dtype)).cast("B"))


@contextlib.contextmanager
def _npz_members(path) -> Iterator[Callable[[str], Any]]:
    """An npz being written to ``path`` (a path or an open binary file) as ``np.savez`` writes one, uncompressed:
    yields ``member(name)``, a new ``<name>.npy`` member open for writing."""
    import zipfile
    with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        yield lambda name: archive.open(f"{name}.npy", mode="w", force_zip64=True)


def save_index(path, index: Mapping[str, np.ndarray]) -> None:
    """Write the 1-D arrays ``index`` as the npz ``path`` (a path or an open binary file; what ``np.savez`` writes:
    one ``<name>.npy`` member each, uncompressed), each written by :func:`write_npy`: string ids are never pickled
    nor held whole as ``<U``."""
    with _npz_members(path) as member:
        for name, values in index.items():
            with member(name) as file:
                write_npy(file, values)


def open_npz_member(archive, name: str):
    """(open member, shape, fortran_order, dtype) of the array ``name`` of the open npz ``archive`` (a
    ``zipfile.ZipFile``), its header read, so the member reads on at the array's first byte; KeyError when it has
    no such array. What every reader of an npz column by slices starts from."""
    member = archive.open(f"{name}.npy")
    version = np.lib.format.read_magic(member)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(member)
    return member, shape, fortran, dtype


def npz_member_equals(path: Path, name: str, expected: np.ndarray, *, chunk_bytes: int = 1 << 20) -> bool:
    """Whether the 1-D array ``name`` stored (uncompressed) in the .npz ``path`` equals ``expected`` (an array, a
    :class:`StoredColumn` or :class:`RowsOf`) in dtype (a StringDType ``expected`` equals a ``<U`` column of the
    same strings), shape and every element, both read ``chunk_bytes`` at a time, never whole. False for anything
    else (other dtype or layout, a compressed or unreadable member): the caller then loads and joins."""
    import zipfile
    expected = _array_or_column(expected)
    try:
        with zipfile.ZipFile(path) as archive:
            member, shape, _, dtype = open_npz_member(archive, name)
            with member:
                # a prepared dataset's ids (StringDType) against the <U the file holds: compared as strings
                as_strings = expected.dtype == STRING_DTYPE and dtype.kind == "U"
                if shape != expected.shape or expected.ndim != 1 or dtype.hasobject or \
                        (dtype != expected.dtype and not as_strings):
                    return False
                rows = max(1, chunk_bytes // max(1, dtype.itemsize))
                for start in range(0, expected.size, rows):
                    stop = min(start + rows, expected.size)
                    chunk = member.read((stop - start) * dtype.itemsize)
                    if len(chunk) != (stop - start) * dtype.itemsize or \
                            not np.array_equal(np.frombuffer(chunk, dtype=dtype), expected[start:stop]):
                        return False
                return True
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return False


def npz_column_for_ids(path: Path, *, ids: np.ndarray, name: str) -> np.ndarray | None:
    """The 1-D column ``name`` of the npz ``path`` (labels keyed by its ``ids`` column) when that file lists ``ids``
    in the same order (compared a chunk at a time by :func:`npz_member_equals`, never loaded whole) and the column
    has their shape; None otherwise: the caller then loads the file's ids and joins by id. Raises what ``np.load``
    raises on a damaged file."""
    if not npz_member_equals(path, "ids", ids):
        return None
    with np.load(path, allow_pickle=False) as stored:
        column = stored[name]
    return column if column.shape == np.shape(ids) else None


def _read_member(archive, name: str) -> np.ndarray:
    """The array ``name`` of the npz ``archive``; a 1-D string column (``<U`` or ``S``) as StringDType, read
    ID_CHUNK strings at a time (never whole as ``<U``)."""
    member, shape, fortran, dtype = open_npz_member(archive, name)
    with member:
        if dtype.hasobject:
            raise ValueError(f"{name} holds Python objects (pickled), which are not read")
        if dtype.kind not in ("U", "S") or len(shape) != 1:
            count = int(np.prod(shape)) if shape else 1
            data = np.empty(count, dtype=dtype)
            view = memoryview(data.view(np.uint8))
            done = 0
            while done < view.nbytes:
                got = member.readinto(view[done:])
                if not got:
                    raise ValueError(f"{name} is truncated")
                done += got
            return data.reshape(shape[::-1]).T if fortran else data.reshape(shape)
        out = np.empty(shape, dtype=STRING_DTYPE)
        for start in range(0, shape[0], ID_CHUNK):
            count = min(ID_CHUNK, shape[0] - start)
            chunk = np.frombuffer(member.read(count * dtype.itemsize), dtype=dtype)
            if chunk.size != count:
                raise ValueError(f"{name} is truncated")
            out[start:start + count] = chunk
        return out



#: Rows between two wanted ones still read in the same call (a read costs a system call: about as much as copying
#: a few KiB), and the most bytes one read of a :class:`StoredColumn` takes.
_GAP_ROWS = 64
_READ_BYTES = 1 << 20
_OPEN_LOCK = threading.Lock()  # opening a StoredColumn's file (a lock per column would not pickle)
READ_FIX = ("check the disk or network filesystem that holds it and its permissions, then run again (finished steps "
            "are kept)")


def read_twice(read: Callable[[], Any], *, path: Path | str, what: str, missing_is_broken: bool = False,
               on_retry: Callable[[], None] | None = None) -> Any:
    """``read()``, once more after an I/O error (a network filesystem's hiccup passes), else DataReadError naming
    ``path`` (``what``: what it is, for the message). An I/O error is never a broken sample: counted as one, a
    moved data directory would read as "20 of 20 samples are broken". ``missing_is_broken``: a file that does not
    exist raises FileNotFoundError at once (an image deleted since it was indexed: its sample is broken), not
    retried. ``on_retry``: called before the second try (to drop an open handle)."""
    try:
        return read()
    except OSError as first:
        if missing_is_broken and isinstance(first, FileNotFoundError):
            raise
        if on_retry is not None:
            on_retry()
        try:
            return read()
        except OSError as err:
            if missing_is_broken and isinstance(err, FileNotFoundError):
                raise
            raise DataReadError(f"could not read {what} {path} (tried twice): {type(err).__name__}: "
                                f"{err.strerror or err}; {READ_FIX}") from err


def file_identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime ns) of a file: what says a reopened path is still the file that was opened."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _local_data_offset(handle, info) -> int:
    """Where the bytes of the zip member ``info`` start in the open archive file ``handle``: after its local
    header, whose name and extra field lengths may differ from the central directory's (zip64)."""
    import struct
    handle.seek(info.header_offset)
    header = handle.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise ValueError(f"bad local header of {info.filename}")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length


class StoredColumn:
    """A 1-D column of an index on disk (the ``name`` member of an uncompressed .npz, as :func:`save_index` and
    ``np.savez`` write it), read from the file when indexed and never held whole.

    What a file-backed dataset (image files, webdataset shards) keeps of its sample ids instead of an (N,) array:
    a 30-character path costs 46 bytes a sample as StringDType, in the training process and again in every
    DataLoader worker the dataset is pickled to (550 MB at 12M samples, times one plus the workers); a column costs
    nothing until read. Indexing with an int, a slice or an array of rows reads only those rows (rows close together
    in one read), so a batch's ids cost a few system calls next to the batch's decoding.

    Strings come back as StringDType (:data:`STRING_DTYPE`, elements ``str``), as :func:`load_arrays` gives them;
    numbers in their stored dtype. Picklable: a process opens the file again on its first read.

    Attributes:
        path: the .npz file. name: the column. shape: (N,). dtype: what indexing returns.
    """

    def __init__(self, *, path: Path, name: str, offset: int, stored: np.dtype, length: int,
                 identity: tuple[int, ...] | None = None) -> None:
        self.path, self.name = Path(path), name
        self._offset, self._stored, self._length = int(offset), np.dtype(stored), int(length)
        self.dtype = STRING_DTYPE if self._stored.kind in ("U", "S") else self._stored
        # The file that was opened (file_identity): a process that opens the path again (a DataLoader worker, a
        # retry) checks it still is that file, not one replaced or rewritten since, whose rows would be others.
        self.identity = tuple(identity) if identity is not None else None
        self._handle = None
        self._pid = None

    @classmethod
    def open(cls, path: Path, name: str) -> "StoredColumn | None":
        """The column ``name`` of the npz ``path``; None when it cannot be read in place (a compressed member, more
        than one dimension, Python objects): the caller then loads it. Raises ValueError (or what ``zipfile``
        raises) on a damaged file, naming a truncated column."""
        import zipfile
        identity = file_identity(os.stat(path))
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(f"{name}.npy")
            member, shape, _, stored = open_npz_member(archive, name)
            with member:
                header_bytes = member.tell()
            if info.compress_type != zipfile.ZIP_STORED or len(shape) != 1 or stored.hasobject \
                    or stored.itemsize == 0:
                return None
            with open(path, "rb") as handle:
                offset = _local_data_offset(handle, info) + header_bytes
        if header_bytes + shape[0] * stored.itemsize > info.file_size:
            raise ValueError(f"{name} is truncated")
        return cls(path=path, name=name, offset=offset, stored=stored, length=shape[0], identity=identity)

    # ----------------------------------------------------------------------------------------- array-like
    @property
    def shape(self) -> tuple[int]:
        return (self._length,)

    ndim = 1

    @property
    def size(self) -> int:
        return self._length

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"StoredColumn({str(self.path)!r}, {self.name!r}, n={self._length}, stored={self._stored})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None, "_pid": None}  # an open file does not cross a process boundary

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            row = int(key) + (self._length if key < 0 else 0)
            if not 0 <= row < self._length:
                raise IndexError(f"row {int(key)} is out of range for {self._length} rows")
            value = self._pread(row, row + 1)[0]
            return str(value) if self.dtype == STRING_DTYPE else value  # a str, as a StringDType array gives
        if isinstance(key, slice):
            start, stop, step = key.indices(self._length)
            if step == 1:
                return self._read_range(start, max(start, stop))
            key = np.arange(start, stop, step)
        return self._read_rows(np.asarray(key))

    def __array__(self, dtype=None, copy=None):
        values = self[:]
        return values if dtype is None else values.astype(dtype)

    def __iter__(self) -> Iterator:
        for start in range(0, self._length, ID_CHUNK):
            yield from self._read_range(start, min(start + ID_CHUNK, self._length)).tolist()

    def tolist(self) -> list:
        return self[:].tolist()

    # Compared element by element, as the array it stands for (reads the whole column).
    def __eq__(self, other):
        return self[:] == (other[:] if isinstance(other, StoredColumn) else other)

    def __ne__(self, other):
        return ~(self == other)

    __hash__ = None

    # ----------------------------------------------------------------------------------------- reading
    def _file(self):
        """This process's open file of the column (opened on first use, again after a fork). Under a lock: a
        dataset's decode threads read ids at once, and a handle opened twice would close the one another thread is
        reading through."""
        handle = self._handle
        if handle is None or self._pid != os.getpid():
            with _OPEN_LOCK:
                if self._handle is None or self._pid != os.getpid():
                    handle = open(self.path, "rb", buffering=0)  # noqa: SIM115 - kept open
                    self._check_same_file(handle)
                    self._handle, self._pid = handle, os.getpid()
                handle = self._handle
        return handle

    def _check_same_file(self, handle) -> None:
        """Refuse a file at :attr:`path` that is not the one this column was opened on (replaced or rewritten)."""
        if self.identity is None or file_identity(os.fstat(handle.fileno())) == self.identity:
            return
        handle.close()
        raise DataError(f"{self.path} changed after the dataset was opened (replaced or rewritten while a run read "
                        f"it): its {self.name!r} rows may no longer be the ones the run planned with; do not prepare "
                        "a dataset again while a run reads it, then run again (finished steps are kept)")

    def _drop_handle(self) -> None:
        """Forget this process's open file (it is opened again, and checked, on the next read)."""
        with _OPEN_LOCK:
            self._handle = None

    def _pread(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as stored (a ``<U`` / number array over the bytes read). An I/O error is tried once
        more on a file opened again (:func:`read_twice`), then ends the read as DataReadError naming the file."""
        size = (stop - start) * self._stored.itemsize
        # the handle is held for the read: the file stays open for it whatever other threads do
        data = read_twice(lambda: os.pread(self._file().fileno(), size, self._offset + start * self._stored.itemsize),
                          path=self.path, what="the prepared index", on_retry=self._drop_handle)
        if len(data) != size:
            raise DataError(f"{self.path} ends inside its {self.name!r} column (rows {start}..{stop}): the file was "
                            "cut short after it was opened; prepare the dataset again")
        return np.frombuffer(data, dtype=self._stored)

    def _held(self, stored: np.ndarray) -> np.ndarray:
        return stored.astype(STRING_DTYPE) if self.dtype == STRING_DTYPE else stored.copy()

    def _read_range(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, dtype=self.dtype)
        step = max(1, _READ_BYTES // self._stored.itemsize)
        for first in range(start, stop, step):
            last = min(first + step, stop)
            out[first - start:last - start] = self._held(self._pread(first, last))
        return out

    def _read_rows(self, rows: np.ndarray) -> np.ndarray:
        """``self[rows]`` for an int (or boolean mask) array ``rows`` of any order: read in ascending order, rows
        at most _GAP_ROWS apart in one read spanning at most _READ_BYTES, ID_CHUNK rows converted at a time."""
        if rows.dtype == bool:
            if rows.shape != self.shape:
                raise IndexError(f"boolean index of shape {rows.shape} for a column of {self._length} rows")
            rows = np.flatnonzero(rows)
        if rows.size and rows.dtype.kind not in "iu":
            raise IndexError(f"rows must be integers, got {rows.dtype}")
        rows = np.where(rows < 0, rows + self._length, rows).astype(np.int64, copy=False).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self._length):
            raise IndexError(f"rows out of range for {self._length} rows")
        order = np.argsort(rows, kind="stable")
        out = np.empty(rows.size, dtype=self.dtype)
        most = max(1, _READ_BYTES // self._stored.itemsize)
        for begin in range(0, rows.size, ID_CHUNK):
            positions = order[begin:begin + ID_CHUNK]
            wanted = rows[positions]
            stored = np.empty(wanted.size, dtype=self._stored)
            # a new read where the next row is more than _GAP_ROWS on (a batch's scattered rows: one read each) ...
            bounds = [0, *(np.flatnonzero(np.diff(wanted) > _GAP_ROWS) + 1).tolist(), wanted.size]
            for start, stop in zip(bounds[:-1], bounds[1:]):
                first, last = int(wanted[start]), int(wanted[stop - 1])
                if last - first < most:
                    stored[start:stop] = self._pread(first, last + 1)[wanted[start:stop] - first]
                    continue
                # ... and where a dense run would pass _READ_BYTES
                run = np.arange(start, stop)
                for piece in np.split(run, np.flatnonzero(np.diff((wanted[run] - first) // most)) + 1):
                    low = int(wanted[piece[0]])
                    stored[piece] = self._pread(low, int(wanted[piece[-1]]) + 1)[wanted[piece] - low]
            out[positions] = self._held(stored)
        return out.reshape(np.shape(rows))


# --------------------------------------------------------------------------------------------- hashing
def params_hash(params: Mapping[str, Any], *, length: int = 10) -> str:
    """Short, stable hex hash of JSON-serialisable ``params`` (key order does not matter)."""
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def digest_array(digest, array: np.ndarray) -> None:
    """Feed ``array`` to the hashlib object ``digest``: numbers as their little-endian bytes; strings as UTF-8
    lines joined by newlines, so the digest does not depend on how the strings are held (``<U`` of any width,
    StringDType). Strings are fed ID_CHUNK at a time, never as one O(N) Python list."""
    array = _array_or_column(array)
    if array.dtype.kind not in ("U", "S", "O", "T"):
        array = np.asarray(array)
        digest.update(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
        return
    flat = array.reshape(-1) if isinstance(array, np.ndarray) else array  # a column: read by slices
    for start in range(0, flat.size, ID_CHUNK):
        text = "\n".join(str(x) for x in flat[start:start + ID_CHUNK].tolist())
        digest.update((("\n" if start else "") + text).encode("utf-8"))


def compute_digest(*, images: np.ndarray, index: Mapping[str, np.ndarray]) -> str:
    """sha256 hex of the image bytes and every index array (names included, sorted by name).

    Args:
        images: uint8 (N, H, W, 3); a memmap is fine, it is read in chunks.
        index: name -> (N,) array (``ids``, ``split``, ``label_<attr>``).
    """
    digest = hashlib.sha256()
    digest.update(f"images{tuple(images.shape)}{images.dtype.str}".encode())
    row_bytes = max(1, int(np.prod(images.shape[1:])) * images.dtype.itemsize)
    step = max(1, _DIGEST_CHUNK_BYTES // row_bytes)
    for start in range(0, images.shape[0], step):
        digest.update(np.ascontiguousarray(images[start:start + step]).tobytes())
    for name in sorted(index):
        digest.update(f"|{name}|".encode())
        digest_array(digest, index[name])
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------- writing
def _tmp_prefix(target: Path) -> str:
    return f".{target.name}{_TMP_MARK}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def clean_stale_tmp_dirs(target: Path) -> list[Path]:
    """Remove temporary directories left next to ``target`` by interrupted writers on this host.

    A temporary directory is named ``.<target>.tmp-<host>-<pid>-<token>``; it is stale when its writer process
    no longer runs. Directories from other hosts (shared file systems) are left alone: their pid means nothing
    here. Returns the removed paths.
    """
    removed = []
    host = socket.gethostname()
    prefix = _tmp_prefix(target)
    if not target.parent.is_dir():
        return removed
    for path in target.parent.iterdir():
        if not path.name.startswith(prefix):
            continue
        parts = path.name[len(prefix):].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        if _pid_alive(int(parts[1])):  # includes this process: another thread may be writing it
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _new_tmp_dir(target: Path) -> Path:
    """A new empty hidden directory next to ``target``, named so :func:`clean_stale_tmp_dirs` removes it once its
    writer (this process) is gone; stale ones of ``target`` are removed first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp_dirs(target)
    tmp = target.parent / f"{_tmp_prefix(target)}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


@contextlib.contextmanager
def scratch_dir(target: Path) -> Iterator[Path]:
    """A temporary directory next to ``target`` for the duration of the block, deleted after it (and, should this
    process be killed, by the next :func:`clean_stale_tmp_dirs` of ``target``)."""
    tmp = _new_tmp_dir(Path(target))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def column_on_disk(blocks: Sequence[np.ndarray], *, path: Path) -> StoredColumn:
    """The strings of the 1-D arrays ``blocks``, in order, written as one column to the new npz ``path`` and opened
    as a :class:`StoredColumn`: a step that reads an O(N) column a chunk at a time can then drop the blocks (a
    listing of 1M image paths: 46 MB) while it builds the others, and the blocks are never copied into one array
    (which would hold the strings twice). One array is one block. The caller deletes ``path`` (a
    :func:`scratch_dir` does)."""
    if isinstance(blocks, np.ndarray):
        blocks = [blocks]
    with _npz_members(path) as member, member("values") as file:
        write_strings_npy(file, lambda: iter(blocks), shape=(sum(len(block) for block in blocks),))
    return StoredColumn.open(path, "values")


@contextlib.contextmanager
def atomic_dataset_dir(target: Path, *, keep_existing: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success rename it to ``target``, on error delete it.

    Args:
        target: final dataset directory. An existing one is replaced, unless ``keep_existing(target)`` is
            true at the end: then another writer (thread or process) finished the same dataset first, and
            ours is discarded instead of pulling a finished dataset from under its readers.
    """
    target = Path(target)
    tmp = _new_tmp_dir(target)
    try:
        yield tmp
        if keep_existing is not None and keep_existing(target):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            _move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, target: Path) -> None:
    if target.exists():
        # Move the invalid old directory aside first: rename() cannot replace a non-empty directory.
        trash = target.parent / f"{_tmp_prefix(target)}{socket.gethostname()}-{os.getpid()}-old{uuid.uuid4().hex[:4]}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(target, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, target)
    except OSError:
        if not (target / MANIFEST_FILE).is_file():  # not a concurrent writer winning the race: a real failure
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def write_dataset_files(
    directory: Path,
    *,
    kind: str,
    ids: Sequence[str] | np.ndarray,
    split: Sequence[str] | np.ndarray,
    labels: Mapping[str, np.ndarray],
    attributes: Mapping[str, Sequence[str]],
    params: Mapping[str, Any],
    images: np.ndarray | None = None,
) -> dict[str, Any]:
    """Write ``index.npz``, ``images.npy`` (unless already written there) and, last, ``manifest.json``.

    Args:
        directory: the (temporary) dataset directory, normally from :func:`atomic_dataset_dir`.
        kind: dataset kind for the manifest, e.g. "trifeature".
        ids: (N,) unique sample ids.
        split: (N,) "train" / "test".
        labels: attr -> (N,) int64 class index, -1 where unknown; keys must match ``attributes``.
        attributes: attr -> class names (index i of the list is class i).
        params: JSON-serialisable generation or source parameters.
        images: uint8 (N, H, W, 3). ``None`` when the caller already wrote ``directory/images.npy``.

    Returns:
        The manifest that was written.
    """
    directory = Path(directory)
    image_path = directory / IMAGES_FILE
    if images is not None:
        np.save(image_path, np.ascontiguousarray(images), allow_pickle=False)
    stored = np.load(image_path, mmap_mode="r")
    index = _build_index(ids=ids, split=split, labels=labels, attributes=attributes, num_samples=stored.shape[0])
    _check_images_array(stored, where=str(image_path))
    save_index(directory / INDEX_FILE, index)
    manifest = {
        "kind": kind,
        "num_samples": int(stored.shape[0]),
        "num_train": int(np.count_nonzero(index["split"] == "train")),
        "num_test": int(np.count_nonzero(index["split"] == "test")),
        "image_size": int(stored.shape[1]),
        "attributes": {attr: [str(n) for n in names] for attr, names in attributes.items()},
        "params": json.loads(json.dumps(dict(params), default=str)),
        "digest": compute_digest(images=stored, index=index),
    }
    del stored  # release the memmap before the directory is renamed
    _write_json_atomic(directory / MANIFEST_FILE, manifest)
    return manifest


def _build_index(*, ids, split, labels, attributes, num_samples: int) -> dict[str, np.ndarray]:
    ids_arr = ids if isinstance(ids, StoredColumn) else as_string_array(ids)  # a column on disk: read by chunks
    split_arr = as_string_array(split)
    if set(labels) != set(attributes):
        raise ValueError(f"labels {sorted(labels)} and attributes {sorted(attributes)} name different attributes")
    for name, arr in (("ids", ids_arr), ("split", split_arr)):
        if arr.shape != (num_samples,):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({num_samples},)")
    repeated = repeated_strings(chunks_of(ids_arr), count=len(ids_arr))
    if repeated:
        raise ValueError(f"sample ids are not unique (e.g. {repeated})")
    known = np.zeros(split_arr.shape, dtype=bool)
    for name in SPLITS:
        known |= split_arr == name
    bad_split = sorted(set(split_arr[~known][:1000].tolist()))
    if bad_split:
        raise ValueError(f"split values must be 'train' or 'test', got {bad_split[:3]}")
    index = {"ids": ids_arr, "split": split_arr}
    for attr in attributes:
        arr = np.asarray(labels[attr], dtype=np.int64)
        if arr.shape != (num_samples,):
            raise ValueError(f"label_{attr} has shape {arr.shape}, expected ({num_samples},)")
        if arr.size and (arr.min() < -1 or arr.max() >= len(attributes[attr])):
            raise ValueError(f"label_{attr} outside [-1, {len(attributes[attr]) - 1}]")
        index[LABEL_PREFIX + attr] = arr
    return index


def _check_images_array(images: np.ndarray, *, where: str) -> None:
    # 4 channels: CIFAR-MNIST (RGB + a digit), read by encoders built with model.in_channels=4.
    if images.ndim != 4 or images.shape[-1] not in (3, 4) or images.dtype != np.uint8:
        raise DataError(f"{where} holds {images.dtype} {tuple(images.shape)}, expected uint8 (N, H, W, 3) (or 4 "
                        "channels)")


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of ``directory``, or None when it is missing or not valid JSON."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def is_prepared(directory: Path, *, kind: str, params: Mapping[str, Any]) -> bool:
    """Cheap check that ``directory`` is a complete dataset of ``kind`` made from ``params``.

    Reads the manifest and the array headers (not the pixels), so it is safe to call on every run.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None or manifest.get("kind") != kind:
        return False
    if manifest.get("params") != json.loads(json.dumps(dict(params), default=str)):
        return False
    try:
        images = np.load(directory / IMAGES_FILE, mmap_mode="r")
        with np.load(directory / INDEX_FILE, allow_pickle=False) as index:
            names = set(index.files)
    except (OSError, ValueError):
        return False
    expected = {"ids", "split"} | {LABEL_PREFIX + a for a in manifest.get("attributes", {})}
    return images.shape[0] == manifest.get("num_samples") and expected <= names


# --------------------------------------------------------------------------------------------- reading
def read_storage_index(path: Path, *, storage: str, what: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(manifest, index arrays) of a prepared dataset of ``storage`` (a modality's own format: "text",
    "features"); DataError naming the fix when it is not one or its index is unreadable."""
    manifest = read_manifest(path)
    if manifest is None or manifest.get("storage") != storage:
        raise DataError(f"{path} is not a prepared {what} (manifest.json missing or not storage {storage!r}): rerun "
                        "the pipeline to prepare it")
    try:
        with np.load(path / INDEX_FILE, allow_pickle=False) as stored:
            return manifest, {name: stored[name] for name in stored.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"{what} {path} is damaged ({exc}): delete it and rerun the pipeline") from None


class SampleIndex:
    """What every prepared dataset holds besides its pixels: stable sample ids, the split of each sample and its
    attribute labels, read from the directory's index and manifest. The pipeline's steps only use this part (and
    ``get_batch``), so every storage (the in-memory array, image files, webdataset shards) subclasses it.

    Attributes:
        path: the dataset directory.
        ids: (N,) str sample ids, unique and stable.
        split: (N,) str, "train" or "test".
        labels: attr -> (N,) int64 class index, -1 where unknown.
        (Arrays, or for the file-backed storages :class:`StoredColumn` s read from the index on disk: index them
        with rows or slices, or ``np.asarray`` them to read them whole.)
        attributes: attribute names in manifest order.
        class_names: attr -> list of class names.
        manifest: the parsed ``manifest.json``.
        digest: sha256 hex from the manifest (of what the storage's ``compute_digest`` covers).
    """

    def __init__(self, *, path: Path, index: Mapping[str, np.ndarray], manifest: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.ids: np.ndarray | StoredColumn = index["ids"]
        self.split: np.ndarray | StoredColumn = index["split"]
        self.manifest: dict[str, Any] = dict(manifest)
        self.class_names: dict[str, list[str]] = {a: list(n) for a, n in manifest["attributes"].items()}
        self.attributes: list[str] = list(self.class_names)
        self.labels: dict[str, np.ndarray | StoredColumn] = {a: index[LABEL_PREFIX + a] for a in self.attributes}
        self.digest: str = str(manifest["digest"])

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def index_arrays(self) -> dict[str, np.ndarray]:
        """ids, split and label_<attr>: the index arrays the digests cover."""
        index = {"ids": self.ids, "split": self.split}
        index.update({LABEL_PREFIX + a: v for a, v in self.labels.items()})
        return index

    def compute_digest(self) -> str:
        """The digest of this dataset as its preparation computed it."""
        raise NotImplementedError

    def verify_digest(self) -> None:
        """Re-hash what the digest covers; DataError when it no longer matches the manifest's."""
        actual = self.compute_digest()
        if actual != self.digest:
            raise DataError(f"dataset {self.path} changed after it was written (digest {actual[:12]} != manifest "
                            f"{self.digest[:12]}): delete the directory and run `mclpipe run` again to regenerate it")

    def indices(self, split: str) -> np.ndarray:
        """int64 (n,) row indices of ``split`` ("train", "test" or "all"), ascending."""
        if split == "all":
            return np.arange(len(self), dtype=np.int64)
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}: use 'train', 'test' or 'all'")
        # a chunk at a time: the split may be a column on disk (StoredColumn), never read whole
        rows = [np.flatnonzero(self.split[start:start + ID_CHUNK] == split) + start
                for start in range(0, len(self), ID_CHUNK)]
        return np.concatenate(rows).astype(np.int64, copy=False) if rows else np.zeros(0, dtype=np.int64)

    def verify_ids(self, ids: Sequence[str] | np.ndarray, *, split: str = "all") -> None:
        """Check that ``ids`` are exactly this dataset's ids of ``split``, in the same order.

        Used to prove that a consumer (training) sees rows in the order a producer (embedding export,
        clustering) saw them, so labels keyed by position still belong to the same samples.

        Raises:
            DataError: naming how many ids differ and showing the first mismatch.
        """
        expected = self.ids[self.indices(split)]
        given = np.asarray([str(i) for i in ids], dtype=np.str_)
        fix = ("the ids were produced from a different dataset or sample order; rerun the stages that produced "
               "them (`mclpipe run` redoes what is stale)")
        if given.shape != expected.shape:
            raise DataError(f"got {given.size} ids but dataset {self.path.name} has {expected.size} in split "
                            f"{split!r}: {fix}")
        mismatch = np.flatnonzero(given != expected)
        if mismatch.size == 0:
            return
        first = int(mismatch[0])
        same_set = bool(np.array_equal(np.sort(given), np.sort(expected)))
        what = "same ids in a different order" if same_set else "different ids"
        raise DataError(f"{mismatch.size} of {expected.size} ids differ from dataset {self.path.name} split "
                        f"{split!r} ({what}; first at position {first}: {given[first]!r} != "
                        f"{expected[first]!r}): {fix}")


class ImageArrayDataset(SampleIndex):
    """A prepared dataset opened for reading; images stay on disk (memmap). ``images``: uint8 (N, H, W, 3); the
    digest covers images + index (see :class:`SampleIndex` for the rest)."""

    def __init__(self, *, path: Path, images: np.ndarray, index: Mapping[str, np.ndarray],
                 manifest: Mapping[str, Any]) -> None:
        super().__init__(path=path, index=index, manifest=manifest)
        self.images = images

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: Path, *, verify_digest: bool = False) -> "ImageArrayDataset":
        """Open a prepared dataset directory.

        Args:
            path: directory written by ``prepare_trifeature`` / ``prepare_image_folder``.
            verify_digest: re-hash images and index and compare with the manifest (reads every pixel once).

        Raises:
            DataError: a file is missing or unreadable, or the files disagree with each other or the manifest.
        """
        path = Path(path)
        fix = (f"run `mclpipe run` again to regenerate it, or delete the directory {path} "
               "if it keeps failing")
        if not path.is_dir():
            raise DataError(f"prepared dataset {path} does not exist: {fix}")
        missing = [n for n in (IMAGES_FILE, INDEX_FILE, MANIFEST_FILE) if not (path / n).is_file()]
        if missing:
            raise DataError(f"prepared dataset {path} is incomplete (missing {', '.join(missing)}): {fix}")
        manifest = read_manifest(path)
        if manifest is None or not _manifest_fields_ok(manifest):
            raise DataError(f"{path / MANIFEST_FILE} is corrupt or from an incompatible version: {fix}")
        images = _load_images(path / IMAGES_FILE, fix=fix)
        index = _load_index(path / INDEX_FILE, attributes=list(manifest["attributes"]), fix=fix)
        _check_consistent(path=path, images=images, index=index, manifest=manifest, fix=fix)
        dataset = cls(path=path, images=images, index=index, manifest=manifest)
        if verify_digest:
            dataset.verify_digest()
        return dataset

    def compute_digest(self) -> str:
        return compute_digest(images=self.images, index=self.index_arrays())

    # ----------------------------------------------------------------------------------------- access

    def __repr__(self) -> str:
        return (f"ImageArrayDataset({str(self.path)!r}, kind={self.manifest.get('kind')!r}, n={len(self)}, "
                f"image_size={self.image_size}, attributes={self.attributes})")

    @property
    def image_size(self) -> int:
        return int(self.images.shape[1])

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
        """Gather rows ``indices`` into a uint8 tensor (B, 3, H, W), in the order given.

        The memmap is read in ascending row order (sequential disk access, one fancy-index call) and the rows
        are put back into the requested order afterwards.
        """
        idx = _as_index_array(indices, size=len(self))
        order = np.argsort(idx, kind="stable")
        gathered = self.images[idx[order]]  # (B, H, W, 3), rows ascending
        batch = np.empty_like(gathered)
        batch[order] = gathered
        return torch.from_numpy(batch).permute(0, 3, 1, 2).contiguous()


def _as_index_array(indices, *, size: int) -> np.ndarray:
    if isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy()
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise IndexError(f"indices must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise IndexError(f"indices must lie in [0, {size}), got [{idx.min()}, {idx.max()}]")
    return idx


def _manifest_fields_ok(manifest: Mapping[str, Any]) -> bool:
    required = ("kind", "num_samples", "num_train", "num_test", "image_size", "attributes", "params", "digest")
    return all(k in manifest for k in required) and isinstance(manifest["attributes"], dict)


def _load_images(path: Path, *, fix: str) -> np.ndarray:
    try:
        images = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:  # truncated file, bad header
        raise DataError(f"{path} is unreadable ({err}): {fix}") from err
    _check_images_array(images, where=str(path))
    return images


def _load_index(path: Path, *, attributes: list[str], fix: str) -> dict[str, np.ndarray]:
    # ids and split as <U, as before: an images.npy dataset holds N x S x S x 3 pixels, its ids are not what grows
    # (the file-backed indexes, contrastive.data.image_files, leave them on disk: StoredColumn).
    index = load_arrays(path, names=["ids", "split"] + [LABEL_PREFIX + a for a in attributes], fix=fix)
    return {name: saveable_ids(values) for name, values in index.items()}


def load_arrays(path: Path, *, names: Sequence[str], fix: str) -> dict[str, np.ndarray]:
    """Arrays ``names`` of the npz ``path`` (DataError naming ``fix`` when one is missing or the file is damaged).

    String columns (``<U``, as every version wrote them) come back as StringDType (:data:`STRING_DTYPE`), read a
    chunk at a time: a few tens of bytes a sample in memory, never the 4 bytes a character of ``<U``."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as archive:
            present = {n[:-len(".npy")] for n in archive.namelist() if n.endswith(".npy")}
            missing = [n for n in names if n not in present]
            if missing:
                raise DataError(f"{path} lacks arrays {missing}: {fix}")
            return {n: _read_member(archive, n) for n in names}
    except DataError:
        raise
    except Exception as err:  # zipfile.BadZipFile, OSError, ValueError: all mean a damaged file
        raise DataError(f"{path} is unreadable ({type(err).__name__}: {err}): {fix}") from err


class RowsOf:
    """``values[rows]`` without the copy: the values of a column (an array or a :class:`StoredColumn`) at ``rows``
    (int64 (M,), e.g. the training split's rows), indexed by position in ``rows``. What a stage keeps of its
    training samples' ids: an (M,) copy of 30-character paths is 46 bytes a sample (and 120 as ``<U``); a batch
    looks up only its own rows.

    Attributes:
        values: the column. rows: int64 (M,). shape: (M,). dtype: the column's.
    """

    ndim = 1

    def __init__(self, values, rows: np.ndarray) -> None:
        self.values, self.rows = values, np.asarray(rows, dtype=np.int64)
        self.dtype = values.dtype

    @property
    def shape(self) -> tuple[int]:
        return self.rows.shape

    @property
    def size(self) -> int:
        return int(self.rows.size)

    def __len__(self) -> int:
        return int(self.rows.size)

    def __repr__(self) -> str:
        return f"RowsOf({self.values!r}, {self.rows.size} rows)"

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self.values[int(self.rows[key])]
        return self.values[self.rows[key]]

    def __array__(self, dtype=None, copy=None):
        values = np.asarray(self.values[self.rows])
        return values if dtype is None else values.astype(dtype)

    def __iter__(self) -> Iterator:
        return iter(np.asarray(self).tolist())  # one gather (one read of a column on disk), not one a row


def load_column(path: Path, name: str, *, fix: str) -> StoredColumn | np.ndarray:
    """The 1-D column ``name`` of the npz ``path`` left on disk (a :class:`StoredColumn`), or loaded as
    :func:`load_arrays` loads it when it cannot be read in place (a compressed member); DataError naming ``fix``
    when it is missing or the file is damaged."""
    try:
        column = StoredColumn.open(path, name)
    except KeyError:
        raise DataError(f"{path} lacks arrays {[name]}: {fix}") from None
    except Exception as err:  # zipfile.BadZipFile, OSError, ValueError: all mean a damaged file
        raise DataError(f"{path} is unreadable ({type(err).__name__}: {err}): {fix}") from err
    return column if column is not None else load_arrays(path, names=[name], fix=fix)[name]


def _check_consistent(*, path: Path, images, index, manifest, fix: str) -> None:
    n = images.shape[0]
    if n != manifest["num_samples"]:
        raise DataError(f"{path} has {n} images but its manifest says {manifest['num_samples']}: {fix}")
    for name, arr in index.items():
        if arr.shape != (n,):
            raise DataError(f"{path / INDEX_FILE}: {name} has shape {arr.shape}, expected ({n},): {fix}")
    repeated = repeated_strings(chunks_of(index["ids"]), count=len(index["ids"]))
    if repeated:
        raise DataError(f"{path / INDEX_FILE}: sample ids are not unique (e.g. {repeated}): {fix}")


def is_index_prepared(directory: Path, *, params: dict, storage: str, kind: str | None = None,
                      arrays: Sequence[str] = ()) -> bool:
    """Cheap check that ``directory`` is a complete index (no pixels: ``storage`` files or shards) made from
    ``params``: its manifest says so and its index holds ids, split, one label array per attribute and ``arrays``,
    all for the manifest's number of samples. Reads no image."""
    manifest = read_manifest(directory)
    if (manifest is None or manifest.get("storage") != storage or (kind and manifest.get("kind") != kind)
            or manifest.get("params") != json.loads(json.dumps(params, default=str))):
        return False
    import zipfile
    try:  # the headers only: the ids are not read
        with zipfile.ZipFile(Path(directory) / INDEX_FILE) as index:
            names = {n[:-len(".npy")] for n in index.namelist() if n.endswith(".npy")}
            num = -1
            if "ids" in names:
                member, shape, _, _ = open_npz_member(index, "ids")
                member.close()
                num = shape[0] if len(shape) == 1 else -1
    except Exception:  # noqa: BLE001 - BadZipFile, OSError, ValueError: a damaged index is not prepared
        return False
    expected = {"ids", "split", *arrays} | {LABEL_PREFIX + a for a in manifest.get("attributes", {})}
    return expected <= names and num == manifest.get("num_samples")
