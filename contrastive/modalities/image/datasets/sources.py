"""What the readers of standard on-disk datasets share (CIFAR-MNIST, CelebA, STL-10, ImageNet): locating the files
a layout promises, the error that says where to get them, a cheap fingerprint of the source files for the cache
key, and the one writer that turns decoded arrays into a prepared dataset (see :mod:`contrastive.data.dataset`).

Nothing here downloads: a missing file is a :class:`~contrastive.errors.DataError` naming the file, the page to
get the data from and the ``--set`` key that points mclpipe at it.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contrastive.data.dataset import atomic_dataset_dir, is_prepared, params_hash, write_dataset_files
from contrastive.errors import DataError


def missing_data(*, what: str, path: Path, expected: str, get_from: str, key: str) -> DataError:
    """The DataError for a dataset that is not where the config points: what was looked for, where to get the data
    (mclpipe never downloads) and the ``--set`` key to fix."""
    return DataError(f"{what} not found: {path} should hold {expected}. mclpipe downloads nothing: get it from "
                     f"{get_from}, then point at it with --set {key}=/path/to/it")


def find_in(root: Path, *, relative: str, accept_self: bool = True) -> Path | None:
    """``root/relative`` if it exists; ``root`` itself when it already is that folder (its name is the last part
    of ``relative``) and ``accept_self``; else None. Lets users point at the dataset folder or at its parent."""
    root = Path(root).expanduser()
    candidate = root / relative
    if candidate.exists():
        return candidate
    if accept_self and root.name == Path(relative).name and root.exists():
        return root
    return None


def files_fingerprint(paths: Sequence[Path]) -> str:
    """sha256 over (name, size, mtime) of ``paths``: a replaced or edited source file changes the cache key,
    without reading the (large) files."""
    digest = hashlib.sha256()
    for path in paths:
        stat = Path(path).stat()
        digest.update(f"{Path(path).resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def write_prepared(*, root: Path, kind: str, params: Mapping[str, Any], images: np.ndarray, ids: Sequence[str],
                   split: Sequence[str] | np.ndarray, labels: Mapping[str, np.ndarray],
                   attributes: Mapping[str, Sequence[str]]) -> Path:
    """Write (atomically) or reuse ``root/<kind>-<hash of params>``; images: uint8 (N, H, W, C), C = 3 or 4.

    Returns the dataset directory, ready for :func:`contrastive.data.loading.load_dataset`.
    """
    target = Path(root) / f"{kind}-{params_hash(dict(params))}"
    if is_prepared(target, kind=kind, params=params):
        return target
    with atomic_dataset_dir(target, keep_existing=lambda t: is_prepared(t, kind=kind, params=params)) as tmp:
        write_dataset_files(tmp, kind=kind, images=images, ids=list(ids), split=split, labels=labels,
                            attributes=attributes, params=params)
    return target


def prepared_dir(*, root: Path, kind: str, params: Mapping[str, Any]) -> Path | None:
    """The finished dataset directory for ``params`` if there is one (so a rerun reads no source file)."""
    target = Path(root) / f"{kind}-{params_hash(dict(params))}"
    return target if is_prepared(target, kind=kind, params=params) else None


def subsample(n: int, limit: int | None, *, rng: np.random.Generator) -> np.ndarray:
    """Sorted int64 rows: all ``n`` when ``limit`` is None or >= n, else a seeded draw of ``limit`` of them."""
    if limit is None or limit >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=limit, replace=False)).astype(np.int64)
