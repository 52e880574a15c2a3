"""STL-10 (Coates et al., 2011) from its binary release, nothing downloaded:

    <root>/stl10_binary/{train_X.bin, train_y.bin, test_X.bin, test_y.bin, unlabeled_X.bin, class_names.txt}

``*_X.bin``: uint8, 96 x 96 x 3 per image, each image stored channel by channel in column-major order (so a row
reshaped to (3, 96, 96) is (C, W, H)); ``*_y.bin``: one uint8 label 1..10 per image.

The MCL paper trains on the unlabeled images and evaluates with linear probes on train / test: the "train" split
here is the 100k unlabeled images (label -1, which the probes ignore) plus the 5k labelled train images, the "test"
split the 8k test images. Set ``eval.probe_max_train`` above the train split's size so the probe sees all 5k
labelled images (the probe draws its subset from the whole train split).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from contrastive.data.dataset import IMAGES_FILE, atomic_dataset_dir, is_prepared, params_hash, write_dataset_files
from contrastive.modalities.image.datasets.sources import files_fingerprint, find_in, missing_data
from contrastive.errors import DataError

KIND = "stl10"
FORMAT_VERSION = 1
SIDE = 96
FOLDER = "stl10_binary"
FILES = ("train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin", "unlabeled_X.bin")
STL10_URL = "https://cs.stanford.edu/~acoates/stl10/ (stl10_binary.tar.gz)"
DEFAULT_CLASSES = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")
_ROW_BYTES = 3 * SIDE * SIDE
_CHUNK = 4096


def stl10_dir(root: Path, *, need_unlabeled: bool = True) -> Path:
    """The ``stl10_binary`` folder under ``root`` (or ``root`` itself); DataError naming the fix."""
    found = find_in(Path(root), relative=FOLDER)
    wanted = [f for f in FILES if need_unlabeled or f != "unlabeled_X.bin"]
    missing = wanted if found is None else [f for f in wanted if not (found / f).is_file()]
    if missing:
        raise missing_data(what="STL-10 (binary version)", path=Path(root), get_from=STL10_URL, key="data.stl10.root",
                           expected=f"{FOLDER}/ with {', '.join(wanted)} (missing {', '.join(missing)})")
    return found


def count_images(path: Path) -> int:
    size = Path(path).stat().st_size
    if size % _ROW_BYTES:
        raise DataError(f"{path} is {size} bytes, not a whole number of 96 x 96 x 3 images: the file is truncated, "
                        "extract stl10_binary.tar.gz again")
    return size // _ROW_BYTES


def read_images(path: Path, *, start: int = 0, count: int | None = None) -> np.ndarray:
    """Images ``start .. start + count`` of an ``*_X.bin`` file as uint8 (n, 96, 96, 3) (H, W, C)."""
    total = count_images(path)
    count = total - start if count is None else count
    raw = np.fromfile(path, dtype=np.uint8, count=count * _ROW_BYTES, offset=start * _ROW_BYTES)
    return np.ascontiguousarray(raw.reshape(count, 3, SIDE, SIDE).transpose(0, 3, 2, 1))  # (C, W, H) -> (H, W, C)


def read_labels(path: Path) -> np.ndarray:
    """``*_y.bin`` -> int64 (n,) class index 0..9 (the file stores 1..10)."""
    labels = np.fromfile(path, dtype=np.uint8).astype(np.int64) - 1
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{path} holds labels outside 1..10: it is not an STL-10 label file")
    return labels


def class_names(folder: Path) -> list[str]:
    names_file = folder / "class_names.txt"
    if names_file.is_file():
        names = [n.strip() for n in names_file.read_text().splitlines() if n.strip()]
        if len(names) == 10:
            return names
    return list(DEFAULT_CLASSES)


def prepare_stl10(*, source: Path, root: Path, use_unlabeled: bool = True, max_unlabeled: int | None = None) -> Path:
    """Build (or reuse) the STL-10 dataset under ``root``; images stream into ``images.npy`` chunk by chunk.

    Args:
        source: folder holding ``stl10_binary/`` (or that folder).
        use_unlabeled: put the unlabeled images into the train split (the paper's setting).
        max_unlabeled: only the first this many unlabeled images (smoke runs); None = all 100 000.

    Returns:
        The dataset directory: ids ``unlabeled-<i>``, ``train-<i>``, ``test-<i>``; attribute ``class``.
    """
    folder = stl10_dir(source, need_unlabeled=use_unlabeled)
    params = {"format_version": FORMAT_VERSION, "source": str(folder.resolve()), "use_unlabeled": bool(use_unlabeled),
              "max_unlabeled": max_unlabeled,
              "files_sha256": files_fingerprint([folder / f for f in FILES
                                                 if use_unlabeled or f != "unlabeled_X.bin"])}
    target = Path(root) / f"{KIND}-{params_hash(params)}"
    if is_prepared(target, kind=KIND, params=params):
        return target
    parts = []  # (file, id prefix, split, labels or None, count)
    if use_unlabeled:
        total = count_images(folder / "unlabeled_X.bin")
        parts.append(("unlabeled_X.bin", "unlabeled", "train", None,
                      total if max_unlabeled is None else min(total, max_unlabeled)))
    for name, split in (("train", "train"), ("test", "test")):
        labels = read_labels(folder / f"{name}_y.bin")
        if labels.size != count_images(folder / f"{name}_X.bin"):
            raise DataError(f"{folder} has {count_images(folder / f'{name}_X.bin')} {name} images but "
                            f"{labels.size} labels: extract stl10_binary.tar.gz again")
        parts.append((f"{name}_X.bin", name, split, labels, labels.size))
    n = sum(p[4] for p in parts)
    with atomic_dataset_dir(target, keep_existing=lambda t: is_prepared(t, kind=KIND, params=params)) as tmp:
        images = np.lib.format.open_memmap(tmp / IMAGES_FILE, mode="w+", dtype=np.uint8, shape=(n, SIDE, SIDE, 3))
        ids, split, labels, row = [], [], [], 0
        for file, prefix, part_split, part_labels, count in parts:
            for start in range(0, count, _CHUNK):
                block = read_images(folder / file, start=start, count=min(_CHUNK, count - start))
                images[row:row + len(block)] = block
                row += len(block)
            ids += [f"{prefix}-{i:06d}" for i in range(count)]
            split += [part_split] * count
            labels.append(np.full(count, -1, np.int64) if part_labels is None else part_labels)
        images.flush()
        del images
        write_dataset_files(tmp, kind=KIND, ids=ids, split=np.asarray(split), labels={"class": np.concatenate(labels)},
                            attributes={"class": class_names(folder)}, params=params)
    return target
