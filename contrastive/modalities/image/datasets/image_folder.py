"""A user's own folder of images -> a prepared dataset (see :mod:`contrastive.data.dataset` for the format).

Images are found recursively (hidden files and folders skipped), sorted by relative path, decoded with PIL,
EXIF-rotated, converted to RGB, centre-cropped to a square and resized to ``image_size``. The sample id of an
image is its path relative to the source folder with forward slashes, so labels and clusters stay attached to
the same file however the folder is listed.

Labels come from, in order of preference:

1. a CSV with a header: column ``id`` (or ``path``) = the relative path, one column per attribute holding
   class names (empty = unknown), and optionally a ``split`` column of train/test;
2. class subfolders (``source/<class>/.../img.png``): attribute ``class`` from the first path component;
3. nothing: the dataset has no attributes (self-supervised training still works; probes are skipped).

With ``split_from_folders`` the folder follows ImageNet's layout, ``train/<class>/*.JPEG`` + ``val/<class>/*.JPEG``:
the split comes from the top folder (train -> "train"; val, valid, validation, test -> "test") and the class
from the folder below it (a CSV, when given, still supplies the labels instead).

Two storages (``storage``):

- ``memory``: every image is decoded once into ``images.npy`` (see :mod:`contrastive.data.dataset`), read back
  as a memmap by :class:`~contrastive.data.dataset.ImageArrayDataset`. Fastest to train from, but the array
  holds N x S x S x 3 bytes: fine for a few hundred thousand small images, not for ImageNet. Unreadable files
  are found here, dropped and warned about (an error above ``max_skip_fraction``).
- ``files``: only ``index.npz`` (ids, split, labels: O(N) bytes, no pixels) and ``manifest.json`` (with the
  source folder) are written; :class:`~contrastive.data.image_files.ImageFileDataset` decodes each file when it
  is read, with the same decoder (:func:`load_square_rgb`), so both storages give identical pixels. Nothing is
  decoded while preparing, so unreadable files stay in the index and are skipped (and counted) when read.

Two decodings (``decode_scale``), the same for both storages: see :mod:`contrastive.data.image_decode`.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import itertools
import json
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from contrastive.data.dataset import (ID_CHUNK, IMAGES_FILE, INDEX_FILE, MANIFEST_FILE, STRING_DTYPE, _build_index,
                                      _write_json_atomic, atomic_dataset_dir, column_on_disk, is_index_prepared,
                                      is_prepared, params_hash, save_index, scratch_dir, write_dataset_files)
from contrastive.data.image_decode import (AUTO_DECODER, DECODE_SCALES, IMAGE_EXTENSIONS, _decode_all,
                                           _files_fingerprint, decode_scale_of, file_index_digest)
from contrastive.errors import ConfigError, DataError

KIND = "image_folder"
FORMAT_VERSION = 1
MAX_CORRUPT_FRACTION = 0.01  # skip (and warn about) at most this share of unreadable files, else stop
STORAGES = ("memory", "files")
# Top-level folder name (lower case) -> split, for split_from_folders (ImageNet: train/ and val/).
SPLIT_FOLDERS = {"train": "train", "val": "test", "valid": "test", "validation": "test", "test": "test"}
ID_COLUMNS = ("id", "path")
SPLIT_COLUMN = "split"
_COPY_ROWS = 4096


# --------------------------------------------------------------------------------------------- listing
def _walk_sorted(folder: Path, prefix: str) -> Iterator[str]:
    """The image paths under ``folder`` (each ``prefix`` + its path below ``folder``), in code-point order of the
    whole path, as ``sorted`` would order them all; one folder's entry names held at a time.

    A folder's entries are visited in the order of their name, plus "/" for a folder: whole paths compare as these
    keys do ("a.jpg" < "a/b.jpg", since "." < "/"), so the walk needs no sort of the whole listing. Hidden entries
    are skipped (macOS "._name.jpg" resource forks would otherwise count as corrupt images), and, as ``os.walk``
    does, linked folders are not entered; a subfolder that cannot be read is skipped with a warning.
    """
    entries = []
    with os.scandir(folder) as listing:
        for entry in listing:
            if entry.name.startswith("."):
                continue
            try:
                is_dir, linked = entry.is_dir(), entry.is_symlink()
            except OSError:
                is_dir = linked = False
            if is_dir and not linked:
                entries.append(entry.name + "/")
            elif not is_dir and entry.name.lower().endswith(IMAGE_EXTENSIONS):
                entries.append(entry.name)
    entries.sort()
    for name in entries:
        if not name.endswith("/"):
            yield prefix + name
            continue
        try:
            yield from _walk_sorted(folder / name[:-1], prefix + name)
        except OSError as err:
            warnings.warn(f"skipped the folder {folder / name[:-1]} ({err}): its images are not listed; make it "
                          "readable and run again to include them", stacklevel=2)


def list_images(source: Path) -> list[np.ndarray]:
    """Relative paths (forward slashes, sorted by code point as ``sorted`` sorts str) of every image under
    ``source``, hidden entries skipped, in blocks of ID_CHUNK: 1-D StringDType arrays
    (``contrastive.data.dataset.STRING_DTYPE``, elements are str), a few tens of bytes a path rather than a Python
    str and list slot (~80 bytes) each, never copied into one array (``column_on_disk`` writes the blocks; for a
    small folder ``np.concatenate`` them)."""
    blocks: list[np.ndarray] = []
    pending: list[str] = []
    for path in _walk_sorted(Path(source), ""):
        pending.append(path)
        if len(pending) == ID_CHUNK:
            blocks.append(np.asarray(pending, dtype=STRING_DTYPE))
            pending = []
    blocks.append(np.asarray(pending, dtype=STRING_DTYPE))
    return blocks


# --------------------------------------------------------------------------------------------- labels CSV
@dataclass
class CsvLabels:
    """Parsed labels CSV: per-id attribute values (None = unknown) and optional split."""

    attributes: list[str]
    values: dict[str, dict[str, str | None]] = field(default_factory=dict)  # id -> attr -> class name
    split: dict[str, str] = field(default_factory=dict)  # id -> "train" / "test" (only where given)


def _normalise_id(raw: str) -> str:
    rel = raw.strip().replace("\\", "/")
    while rel.startswith("./"):
        rel = rel[2:]
    return rel


def read_labels_csv(path: Path, *, source: Path, image_ids: Iterable[str]) -> CsvLabels:
    """Read and check a labels CSV against the images found in ``source``.

    Raises:
        DataError: file missing, no header / no id column, duplicate ids, bad split values, or ids that match
            no image (up to 3 shown).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"labels CSV {path} does not exist: fix data.image_folder.labels_csv or leave it unset")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in (reader.fieldnames or [])]
        id_column = next((c for c in ID_COLUMNS if c in header), None)
        if id_column is None:
            raise DataError(f"labels CSV {path} has no 'id' (or 'path') column (header: {header}): add a column "
                            f"'id' holding each image's path relative to {source}, e.g. 'cats/001.png'")
        attributes = [h for h in header if h and h not in ID_COLUMNS and h != SPLIT_COLUMN]
        labels = CsvLabels(attributes=attributes)
        for line, row in enumerate(reader, start=2):
            row = {(k or "").strip(): (v or "").strip() for k, v in row.items() if k is not None}
            _add_csv_row(labels, row=row, id_column=id_column, path=path, line=line)
    _check_csv_ids(labels, path=path, source=source, image_ids=image_ids)
    return labels


def _add_csv_row(labels: CsvLabels, *, row: dict[str, str], id_column: str, path: Path, line: int) -> None:
    sample_id = _normalise_id(row.get(id_column, ""))
    if not sample_id:
        raise DataError(f"labels CSV {path} line {line}: empty '{id_column}': give every row an image path")
    if sample_id in labels.values:
        raise DataError(f"labels CSV {path} line {line}: id {sample_id!r} appears twice: keep one row per image")
    labels.values[sample_id] = {a: (row.get(a) or None) for a in labels.attributes}
    split = row.get(SPLIT_COLUMN, "").lower()
    if split:
        if split not in ("train", "test"):
            raise DataError(f"labels CSV {path} line {line}: split {split!r} is not 'train' or 'test': fix the "
                            "value or leave it empty for a random split")
        labels.split[sample_id] = split


def _check_csv_ids(labels: CsvLabels, *, path: Path, source: Path, image_ids: Iterable[str]) -> None:
    known: set[str] = set()
    first = None
    for image_id in image_ids:
        first = image_id if first is None else first
        known.add(image_id)
    unknown = [i for i in labels.values if i not in known]
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:3])
        raise DataError(f"labels CSV {path}: {len(unknown)} id(s) match no image under {source} (e.g. {shown}; "
                        f"ids look like {first!r}): write ids as paths relative to the source folder, "
                        "with forward slashes and the file extension")


# --------------------------------------------------------------------------------------------- labels
def _labels_from_csv(csv_labels: CsvLabels, ids: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    attributes, labels = {}, {}
    for attr in csv_labels.attributes:
        names = sorted({v[attr] for v in csv_labels.values.values() if v[attr] is not None})
        lookup = {name: i for i, name in enumerate(names)}
        attributes[attr] = names
        labels[attr] = np.asarray([lookup.get(csv_labels.values.get(i, {}).get(attr), -1) for i in ids],
                                  dtype=np.int64)
    return attributes, labels


def _path_component(ids: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(component ``depth`` of each path, whether the path has a component after it): StringDType and bool (n,)."""
    rest = np.asarray(ids, dtype=STRING_DTYPE)
    slash = np.asarray("/", dtype=STRING_DTYPE)  # partition has no loop for StringDType with a str separator
    for _ in range(depth):
        rest = np.strings.partition(rest, slash)[2]
    head, sep, _ = np.strings.partition(rest, slash)
    return head, sep == "/"


def _labels_from_folders(ids: Sequence[str], *, depth: int = 0) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    """Attribute ``class`` = path component ``depth`` (0: ``<class>/img``; 1: ``train/<class>/img``); computed
    ID_CHUNK paths at a time (int64 codes, no per-path Python objects)."""
    codes = np.full(len(ids), -1, dtype=np.int64)
    seen: dict[str, int] = {}  # class name -> code in order of first appearance
    for start in range(0, len(ids), ID_CHUNK):
        head, nested = _path_component(ids[start:start + ID_CHUNK], depth)
        if not nested.any():
            continue
        names, inverse = np.unique(head[nested], return_inverse=True)
        lookup = np.asarray([seen.setdefault(str(n), len(seen)) for n in names.tolist()], dtype=np.int64)
        chunk = codes[start:start + ID_CHUNK]
        chunk[nested] = lookup[inverse.reshape(-1)]
    if not seen:
        return {}, {}
    loose = int(np.count_nonzero(codes < 0))
    if loose:
        where = "the source folder" if depth == 0 else "a split folder (train/, val/)"
        warnings.warn(f"{loose} image(s) sit directly in {where}, not in a class subfolder: their "
                      "'class' label is unknown (-1); move them into a subfolder or give a labels CSV",
                      stacklevel=3)
    names = sorted(seen)
    to_sorted = np.empty(len(seen), dtype=np.int64)
    to_sorted[[seen[n] for n in names]] = np.arange(len(names))
    labelled = codes >= 0
    codes[labelled] = to_sorted[codes[labelled]]
    return {"class": names}, {"class": codes}


def _assign_split(ids: Sequence[str], *, given: dict[str, str], test_fraction: float, seed: int) -> np.ndarray:
    """(N,) str split: the CSV's where given, else a seeded random split of the remaining ids."""
    # only a CSV gives splits; without one every id is free (the same draw, without the (N,) row list)
    split = np.full(len(ids), "", dtype=STRING_DTYPE)
    if given:
        for start in range(0, len(ids), ID_CHUNK):
            split[start:start + ID_CHUNK] = [given.get(i, "") for i in ids[start:start + ID_CHUNK].tolist()]
    free = np.flatnonzero(split == "") if given else None  # None: every row
    num_free = len(ids) if free is None else len(free)
    num_test = int(round(num_free * test_fraction))
    if num_free >= 2:  # both splits non-empty whenever possible: a probe needs a test set
        num_test = min(max(num_test, 1), num_free - 1)
    test = np.random.default_rng(seed).permutation(num_free)[:num_test]
    split[slice(None) if free is None else free] = "train"
    split[test if free is None else free[test]] = "test"
    return split


def _split_from_folders(ids: Sequence[str], *, source: Path) -> np.ndarray:
    """(N,) str split from each id's top folder (ImageNet: train/..., val/...); DataError for any other. ID_CHUNK
    paths at a time (``ids`` may be a column on disk)."""
    split = np.empty(len(ids), dtype=STRING_DTYPE)
    outside, shown = 0, []
    for start in range(0, len(ids), ID_CHUNK):
        chunk = ids[start:start + ID_CHUNK]
        head, nested = _path_component(chunk, 0)
        tops = np.where(nested, np.strings.lower(head), "")
        part = np.full(len(chunk), "", dtype=STRING_DTYPE)
        for folder, name in SPLIT_FOLDERS.items():
            part[tops == folder] = name
        unknown = part == ""
        outside += int(np.count_nonzero(unknown))
        shown += [repr(str(b)) for b in chunk[unknown][:3 - len(shown)].tolist()]
        split[start:start + len(chunk)] = part
    if outside:
        raise DataError(f"data.image_folder.split_from_folders is set but {outside} image(s) under {source} are "
                        f"not in a split folder ({', '.join(sorted(SPLIT_FOLDERS))}), e.g. {', '.join(shown)}: lay "
                        "the folder out as train/<class>/... and val/<class>/... (ImageNet), or unset "
                        "split_from_folders to draw a random split")
    return split


def _labels_and_split(ids: Sequence[str], *, csv_labels: CsvLabels | None, params: dict, source: Path,
                      ) -> tuple[dict[str, list[str]], dict[str, np.ndarray], np.ndarray]:
    """(attributes, labels, split) of the kept ``ids``: the same rule for both storages."""
    from_folders = bool(params.get("split_from_folders", False))
    folder_split = _split_from_folders(ids, source=source) if from_folders else None  # fails before any warning
    if csv_labels is not None:
        attributes, labels = _labels_from_csv(csv_labels, ids)
        given_split = csv_labels.split
    else:
        attributes, labels = _labels_from_folders(ids, depth=1 if from_folders else 0)
        given_split = {}
    if folder_split is None:
        split = _assign_split(ids, given=given_split, test_fraction=params["test_fraction"], seed=params["seed"])
        return attributes, labels, split
    if given_split:
        warnings.warn("data.image_folder.split_from_folders is set: the labels CSV's 'split' column is ignored "
                      "(the split comes from the train/ and val/ folders)", stacklevel=3)
    return attributes, labels, folder_split



def _check_failures(failures: dict[str, str], *, total: int, source: Path,
                    max_fraction: float = MAX_CORRUPT_FRACTION) -> None:
    if not failures:
        return
    shown = "; ".join(f"{rel} ({err})" for rel, err in list(failures.items())[:3])
    if len(failures) > max_fraction * total:
        raise DataError(f"{len(failures)} of {total} images under {source} are unreadable (more than "
                        f"{max_fraction:.0%}), e.g. {shown}: re-export or delete these files, or raise "
                        "data.image_folder.max_skip_fraction")
    warnings.warn(f"skipped {len(failures)} unreadable image(s) of {total} under {source}: {shown}", stacklevel=3)


def _compact_rows(directory: Path, *, keep: np.ndarray) -> None:
    """Rewrite ``directory/images.npy`` with only rows ``keep`` (ascending), streaming through a memmap."""
    src = np.load(directory / IMAGES_FILE, mmap_mode="r")
    tmp_path = directory / ("compact-" + IMAGES_FILE)
    dst = np.lib.format.open_memmap(tmp_path, mode="w+", dtype=np.uint8, shape=(len(keep),) + src.shape[1:])
    for start in range(0, len(keep), _COPY_ROWS):
        dst[start:start + _COPY_ROWS] = src[keep[start:start + _COPY_ROWS]]
    dst.flush()
    del src, dst
    os.replace(tmp_path, directory / IMAGES_FILE)


# --------------------------------------------------------------------------------------------- prepare
def _check_source(source: Path) -> list[np.ndarray]:
    if not source.exists():
        raise DataError(f"image folder {source} does not exist: set data.image_folder.source to a directory "
                        "of images")
    if not source.is_dir():
        raise DataError(f"image folder {source} is a file, not a directory: set data.image_folder.source to "
                        "the folder that holds the images")
    listing = list_images(source)
    if not any(len(block) for block in listing):
        raise DataError(f"no images found under {source} (looked for {', '.join(IMAGE_EXTENSIONS)}, any case, "
                        "in all subfolders): point data.image_folder.source at the folder that holds them")
    return listing


def prepare_image_folder(*, source: Path, root: Path, image_size: int, labels_csv: Path | None = None,
                         test_fraction: float = 0.25, seed: int = 0, storage: str = "memory",
                         split_from_folders: bool = False, max_skip_fraction: float = MAX_CORRUPT_FRACTION,
                         decode_scale: str = "full") -> Path:
    """Convert a folder of images into a prepared dataset under ``root``, or reuse one made from the same files.

    The cache key covers the source path, every file's path, size and mtime, the CSV's bytes and the params,
    so editing, adding or removing an image, or editing the CSV, prepares a new dataset.

    Args:
        source: folder searched recursively for jpg/jpeg/png/webp/bmp files.
        root: where prepared datasets live; the result is ``root / "image_folder-<hash>"``.
        image_size: output side in pixels (centre square crop, then resize).
        labels_csv: optional CSV of labels (see the module docstring).
        test_fraction: share of images (without a split in the CSV) put in "test", seeded by ``seed``.
        storage: "memory" (decode everything into ``images.npy``) or "files" (write only the index; images are
            decoded when read). See the module docstring.
        split_from_folders: take the split from top folders train/ and val/ (ImageNet layout) and the class
            from the folder below; ``test_fraction`` and ``seed`` are then unused.
        decode_scale: "full" (PIL, every pixel) or "auto" (JPEGs by libjpeg-turbo, at a reduced DCT scale where
            that keeps the square's detail, resampled by torch: about 1.6x faster; see the module docstring).
        max_skip_fraction: "memory": largest share of unreadable images dropped with a warning (above it:
            DataError). "files" decodes nothing here; the readers apply their own threshold.

    Returns:
        The dataset directory, ready for :func:`contrastive.data.loading.load_dataset` (an
        ``ImageArrayDataset`` for "memory", an ``ImageFileDataset`` for "files").

    Raises:
        DataError: missing source, no images, bad CSV, images outside train/ and val/ with
            ``split_from_folders``, or ("memory") more than ``max_skip_fraction`` unreadable images.
    """
    if decode_scale not in DECODE_SCALES:
        raise ConfigError(f"unknown decode_scale {decode_scale!r}: set data.image_folder.decode_scale to 'auto' "
                          "(JPEGs by libjpeg-turbo, about 1.6x faster) or 'full' (PIL)")
    if storage not in STORAGES:
        raise ConfigError(f"unknown storage {storage!r}: set data.image_folder.storage to 'memory' (decode once "
                          "into images.npy) or 'files' (index only, for ImageNet-size folders)")
    source = Path(source).expanduser()
    listing = _check_source(source)  # sorted StringDType blocks
    csv_labels = None if labels_csv is None else read_labels_csv(Path(labels_csv), source=source,
                                                                 image_ids=_each_path(listing))
    params = _folder_params(source, listing, image_size=image_size, test_fraction=test_fraction, seed=seed,
                            labels_csv=labels_csv, storage=storage, split_from_folders=split_from_folders,
                            decode_scale=decode_scale)
    target = Path(root) / f"{KIND}-{params_hash(params)}"
    prepared = functools.partial(_is_folder_prepared, params=params, storage=storage)
    if prepared(target):  # nothing written: a cache of prepared folders may be read-only
        return target
    # The listing is read back from disk a chunk at a time from here on: held in memory it would sit beside every
    # column built from it (46 of the ~90 bytes a sample that preparing a folder of 1M files held at its peak).
    with scratch_dir(Path(root) / f"{KIND}-listing") as scratch:
        rel_paths = column_on_disk(listing, path=scratch / "ids.npz")
        del listing
        with atomic_dataset_dir(target, keep_existing=prepared) as tmp:
            if storage == "files":
                _write_file_index(tmp, source=source, rel_paths=rel_paths, csv_labels=csv_labels, params=params)
            else:
                _write_image_folder(tmp, source=source, rel_paths=rel_paths, csv_labels=csv_labels, params=params,
                                    max_skip_fraction=max_skip_fraction)
    return target


def _each_path(listing: list[np.ndarray]) -> Iterator[str]:
    """The paths of the blocks ``listing``, one str at a time."""
    return itertools.chain.from_iterable(block.tolist() for block in listing)


def _folder_params(source: Path, listing: list[np.ndarray], *, image_size: int, test_fraction: float, seed: int,
                   labels_csv: Path | None, storage: str, split_from_folders: bool, decode_scale: str) -> dict:
    """What a prepared folder is made from (its directory is named by their hash): the options, and every file's
    path (the blocks ``listing``), size and mtime and the CSV's bytes."""
    params = {
        "format_version": FORMAT_VERSION, "source": str(source.resolve()), "image_size": int(image_size),
        "test_fraction": float(test_fraction), "seed": int(seed), "num_files": sum(len(b) for b in listing),
        "files_sha256": _files_fingerprint(source, _each_path(listing)),
        "labels_csv": None if labels_csv is None else str(Path(labels_csv).resolve()),
        "labels_csv_sha256": None if labels_csv is None else hashlib.sha256(Path(labels_csv).read_bytes()).hexdigest(),
    }
    # Added only when not the default, so folders prepared before these options existed keep their directory.
    if storage != "memory":
        params["storage"] = storage
    if split_from_folders:
        params["split_from_folders"] = True
    if decode_scale != "full":
        params["decode_scale"] = decode_scale
        params["auto_decoder"] = AUTO_DECODER
    return params


def _is_folder_prepared(target: Path, *, params: dict, storage: str) -> bool:
    if storage == "files":
        return is_index_prepared(target, params=params, storage="files", kind=KIND)
    return is_prepared(target, kind=KIND, params=params)


def _write_image_folder(tmp: Path, *, source: Path, rel_paths: Sequence[str], csv_labels: CsvLabels | None,
                        params: dict, max_skip_fraction: float = MAX_CORRUPT_FRACTION) -> None:
    size = params["image_size"]
    images = np.lib.format.open_memmap(tmp / IMAGES_FILE, mode="w+", dtype=np.uint8,
                                       shape=(len(rel_paths), size, size, 3))
    failures = _decode_all(source, rel_paths, out=images, size=size, decode_scale=decode_scale_of(params))
    images.flush()
    del images
    _check_failures(failures, total=len(rel_paths), source=source, max_fraction=max_skip_fraction)
    keep = np.asarray([i for i, rel in enumerate(rel_paths) if rel not in failures], dtype=np.int64)
    if failures:
        _compact_rows(tmp, keep=keep)
    ids = rel_paths[keep]
    attributes, labels, split = _labels_and_split(ids, csv_labels=csv_labels, params=params, source=source)
    write_dataset_files(tmp, kind=KIND, ids=ids, split=split, labels=labels, attributes=attributes,
                        params=params)


def _write_file_index(tmp: Path, *, source: Path, rel_paths: Sequence[str], csv_labels: CsvLabels | None,
                      params: dict) -> None:
    """``index.npz`` + ``manifest.json`` (storage "files", source folder), no pixels: every file found is indexed."""
    ids = rel_paths
    attributes, labels, split = _labels_and_split(ids, csv_labels=csv_labels, params=params, source=source)
    index = _build_index(ids=ids, split=split, labels=labels, attributes=attributes, num_samples=len(ids))
    del split, labels
    save_index(tmp / INDEX_FILE, index)
    manifest = {
        "kind": KIND,
        "storage": "files",
        "source": str(Path(source).resolve()),
        "num_samples": len(ids),
        "num_train": int(np.count_nonzero(index["split"] == "train")),
        "num_test": int(np.count_nonzero(index["split"] == "test")),
        "image_size": int(params["image_size"]),
        "attributes": {attr: [str(n) for n in names] for attr, names in attributes.items()},
        "params": json.loads(json.dumps(params, default=str)),
        "digest": file_index_digest(index=index, params=params),
    }
    _write_json_atomic(tmp / MANIFEST_FILE, manifest)

