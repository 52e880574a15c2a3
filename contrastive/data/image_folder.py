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
"""
from __future__ import annotations

import csv
import hashlib
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from contrastive.data.dataset import (IMAGES_FILE, atomic_dataset_dir, is_prepared, params_hash,
                                      write_dataset_files)
from contrastive.errors import DataError

KIND = "image_folder"
FORMAT_VERSION = 1
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
MAX_CORRUPT_FRACTION = 0.01  # skip (and warn about) at most this share of unreadable files, else stop
ID_COLUMNS = ("id", "path")
SPLIT_COLUMN = "split"
_COPY_ROWS = 4096


# --------------------------------------------------------------------------------------------- listing
def find_images(source: Path) -> list[str]:
    """Relative paths (forward slashes, sorted) of every image under ``source``, hidden entries skipped.

    Hidden files are skipped because macOS "._name.jpg" resource forks would otherwise count as corrupt images.
    """
    source = Path(source)
    found = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS):
                found.append((Path(dirpath) / name).relative_to(source).as_posix())
    return sorted(found)


def _files_fingerprint(source: Path, rel_paths: Sequence[str]) -> str:
    """sha256 over (path, size, mtime) of every file: any added, removed or edited image changes it."""
    digest = hashlib.sha256()
    for rel in rel_paths:
        stat = (source / rel).stat()
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


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


def read_labels_csv(path: Path, *, source: Path, image_ids: Sequence[str]) -> CsvLabels:
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


def _check_csv_ids(labels: CsvLabels, *, path: Path, source: Path, image_ids: Sequence[str]) -> None:
    known = set(image_ids)
    unknown = [i for i in labels.values if i not in known]
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:3])
        raise DataError(f"labels CSV {path}: {len(unknown)} id(s) match no image under {source} (e.g. {shown}; "
                        f"ids look like {image_ids[0]!r}): write ids as paths relative to the source folder, "
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


def _labels_from_folders(ids: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    classes = [i.split("/", 1)[0] if "/" in i else None for i in ids]
    if all(c is None for c in classes):
        return {}, {}
    loose = sum(c is None for c in classes)
    if loose:
        warnings.warn(f"{loose} image(s) sit directly in the source folder, not in a class subfolder: their "
                      "'class' label is unknown (-1); move them into a subfolder or give a labels CSV",
                      stacklevel=3)
    names = sorted({c for c in classes if c is not None})
    lookup = {name: i for i, name in enumerate(names)}
    return {"class": names}, {"class": np.asarray([lookup.get(c, -1) for c in classes], dtype=np.int64)}


def _assign_split(ids: Sequence[str], *, given: dict[str, str], test_fraction: float, seed: int) -> np.ndarray:
    """(N,) str split: the CSV's where given, else a seeded random split of the remaining ids."""
    split = np.asarray([given.get(i, "") for i in ids], dtype="<U5")
    free = np.flatnonzero(split == "")
    num_test = int(round(len(free) * test_fraction))
    if len(free) >= 2:  # both splits non-empty whenever possible: a probe needs a test set
        num_test = min(max(num_test, 1), len(free) - 1)
    order = np.random.default_rng(seed).permutation(len(free))
    split[free] = "train"
    split[free[order[:num_test]]] = "test"
    return split


# --------------------------------------------------------------------------------------------- decoding
def load_square_rgb(path: Path, *, size: int) -> np.ndarray:
    """Decode one image: EXIF-rotate, RGB, centre square crop, resize -> uint8 (size, size, 3)."""
    with Image.open(path) as img:
        img.draft("RGB", (size, size))  # JPEG: decode at a reduced scale that is still >= size
        img = ImageOps.exif_transpose(img).convert("RGB")
        width, height = img.size
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        img = img.resize((size, size), Image.Resampling.BICUBIC, box=(left, top, left + side, top + side))
        return np.asarray(img, dtype=np.uint8)


def _try_load(path: Path, size: int) -> np.ndarray | str:
    try:
        return load_square_rgb(path, size=size)
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, DecompressionBombError, ...)
        return f"{type(err).__name__}: {err}"


def _decode_all(source: Path, rel_paths: Sequence[str], *, out: np.ndarray, size: int) -> dict[str, str]:
    """Decode into ``out`` (N, size, size, 3) row by row; returns rel path -> error for unreadable files."""
    failures = {}
    workers = min(8, os.cpu_count() or 1)  # PIL decodes outside the GIL, so threads give real parallelism
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for row, (rel, result) in enumerate(zip(rel_paths, pool.map(lambda r: _try_load(source / r, size),
                                                                    rel_paths))):
            if isinstance(result, str):
                failures[rel] = result
            else:
                out[row] = result
    return failures


def _check_failures(failures: dict[str, str], *, total: int, source: Path) -> None:
    if not failures:
        return
    shown = "; ".join(f"{rel} ({err})" for rel, err in list(failures.items())[:3])
    if len(failures) > MAX_CORRUPT_FRACTION * total:
        raise DataError(f"{len(failures)} of {total} images under {source} are unreadable (more than "
                        f"{MAX_CORRUPT_FRACTION:.0%}), e.g. {shown}: re-export or delete these files")
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
def _check_source(source: Path) -> list[str]:
    if not source.exists():
        raise DataError(f"image folder {source} does not exist: set data.image_folder.source to a directory "
                        "of images")
    if not source.is_dir():
        raise DataError(f"image folder {source} is a file, not a directory: set data.image_folder.source to "
                        "the folder that holds the images")
    rel_paths = find_images(source)
    if not rel_paths:
        raise DataError(f"no images found under {source} (looked for {', '.join(IMAGE_EXTENSIONS)}, any case, "
                        "in all subfolders): point data.image_folder.source at the folder that holds them")
    return rel_paths


def prepare_image_folder(*, source: Path, root: Path, image_size: int, labels_csv: Path | None = None,
                         test_fraction: float = 0.25, seed: int = 0) -> Path:
    """Convert a folder of images into a prepared dataset under ``root``, or reuse one made from the same files.

    The cache key covers the source path, every file's path, size and mtime, the CSV's bytes and the params,
    so editing, adding or removing an image, or editing the CSV, prepares a new dataset.

    Args:
        source: folder searched recursively for jpg/jpeg/png/webp/bmp files.
        root: where prepared datasets live; the result is ``root / "image_folder-<hash>"``.
        image_size: output side in pixels (centre square crop, then resize).
        labels_csv: optional CSV of labels (see the module docstring).
        test_fraction: share of images (without a split in the CSV) put in "test", seeded by ``seed``.

    Returns:
        The dataset directory, ready for :meth:`ImageArrayDataset.load`.

    Raises:
        DataError: missing source, no images, bad CSV, or more than 1 % unreadable images.
    """
    source = Path(source).expanduser()
    rel_paths = _check_source(source)
    csv_labels = None
    if labels_csv is not None:
        csv_labels = read_labels_csv(Path(labels_csv), source=source, image_ids=rel_paths)
    params = {
        "format_version": FORMAT_VERSION, "source": str(source.resolve()), "image_size": int(image_size),
        "test_fraction": float(test_fraction), "seed": int(seed), "num_files": len(rel_paths),
        "files_sha256": _files_fingerprint(source, rel_paths),
        "labels_csv": None if labels_csv is None else str(Path(labels_csv).resolve()),
        "labels_csv_sha256": None if labels_csv is None else hashlib.sha256(Path(labels_csv).read_bytes()).hexdigest(),
    }
    target = Path(root) / f"{KIND}-{params_hash(params)}"
    if is_prepared(target, kind=KIND, params=params):
        return target
    with atomic_dataset_dir(target, keep_existing=lambda t: is_prepared(t, kind=KIND, params=params)) as tmp:
        _write_image_folder(tmp, source=source, rel_paths=rel_paths, csv_labels=csv_labels, params=params)
    return target


def _write_image_folder(tmp: Path, *, source: Path, rel_paths: list[str], csv_labels: CsvLabels | None,
                        params: dict) -> None:
    size = params["image_size"]
    images = np.lib.format.open_memmap(tmp / IMAGES_FILE, mode="w+", dtype=np.uint8,
                                       shape=(len(rel_paths), size, size, 3))
    failures = _decode_all(source, rel_paths, out=images, size=size)
    images.flush()
    del images
    _check_failures(failures, total=len(rel_paths), source=source)
    keep = np.asarray([i for i, rel in enumerate(rel_paths) if rel not in failures], dtype=np.int64)
    if failures:
        _compact_rows(tmp, keep=keep)
    ids = [rel_paths[i] for i in keep]
    if csv_labels is not None:
        attributes, labels = _labels_from_csv(csv_labels, ids)
        given_split = csv_labels.split
    else:
        attributes, labels = _labels_from_folders(ids)
        given_split = {}
    split = _assign_split(ids, given=given_split, test_fraction=params["test_fraction"], seed=params["seed"])
    write_dataset_files(tmp, kind=KIND, ids=ids, split=split, labels=labels, attributes=attributes,
                        params=params)
