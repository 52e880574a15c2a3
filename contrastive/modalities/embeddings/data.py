"""A prepared feature dataset: precomputed vectors with the index every other dataset has, so MCL's clustering
and pseudo-label steps read it unchanged.

    <dir>/features.npy    float32 (N, D), read with mmap
    <dir>/index.npz       ids (N,) str, split (N,) "train"/"test", label_<attribute> (N,) int64 (-1 = unknown)
    <dir>/manifest.json   written last: kind, storage "features", dim, attributes, params, digest

Two sources: the user's files (an ``.npy`` of N x D features, optional ids, optional attribute labels in a CSV
keyed by id; a seeded held-out fraction) and a synthetic set whose features mix a dominant and a weaker
attribute, the feature-suppression setting MCL is for.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from contrastive.data.dataset import (INDEX_FILE, MANIFEST_FILE, SampleIndex, _build_index, _write_json_atomic,
                                      atomic_dataset_dir, compute_digest, params_hash, read_manifest,
                                      read_storage_index, save_index)
from contrastive.errors import DataError

STORAGE = "features"
FEATURES_FILE = "features.npy"


class FeatureDataset(SampleIndex):
    """``features`` float32 (N, D) (a memmap) plus the SampleIndex fields (ids, split, labels, attributes,
    digest)."""

    def __init__(self, *, path: Path, index, manifest, features: np.ndarray):
        super().__init__(path=path, index=index, manifest=manifest)
        self.features = features

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    @classmethod
    def load(cls, path: Path | str) -> "FeatureDataset":
        path = Path(path)
        manifest, index = read_storage_index(path, storage=STORAGE, what="feature dataset")
        try:
            features = np.load(path / FEATURES_FILE, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise DataError(f"feature dataset {path} is damaged ({exc}): delete it and rerun the pipeline") from None
        if features.shape[0] != len(index["ids"]):
            raise DataError(f"feature dataset {path}: {features.shape[0]} rows but {len(index['ids'])} ids: delete "
                            "it and rerun the pipeline")
        return cls(path=path, index=index, manifest=manifest, features=features)

    def compute_digest(self) -> str:
        return compute_digest(images=self.features, index=self.index_arrays())


def load_feature_dataset(path: Path | str) -> FeatureDataset:
    return FeatureDataset.load(path)


def write_feature_dataset(directory: Path, *, kind: str, features: np.ndarray, ids, split, labels: dict,
                          attributes: dict[str, list[str]], params: Mapping[str, Any]) -> dict:
    """Write the files of the module docstring into ``directory`` (the manifest last)."""
    features = np.ascontiguousarray(features, dtype=np.float32)
    index = _build_index(ids=ids, split=split, labels=labels, attributes=attributes, num_samples=len(features))
    np.save(directory / FEATURES_FILE, features, allow_pickle=False)
    save_index(directory / INDEX_FILE, index)
    manifest = {"kind": kind, "storage": STORAGE, "num_samples": int(len(features)), "dim": int(features.shape[1]),
                "num_train": int((index["split"] == "train").sum()), "num_test": int((index["split"] == "test").sum()),
                "attributes": {a: list(v) for a, v in attributes.items()},
                "params": json.loads(json.dumps(dict(params), default=str)),
                "digest": compute_digest(images=features, index=index)}
    _write_json_atomic(Path(directory) / MANIFEST_FILE, manifest)
    return manifest


def _is_prepared(directory: Path, *, kind: str, params: Mapping[str, Any]) -> bool:
    manifest = read_manifest(directory)
    return (manifest is not None and manifest.get("storage") == STORAGE and manifest.get("kind") == kind
            and manifest.get("params") == json.loads(json.dumps(dict(params), default=str)))


def _prepare(*, root: Path | str, kind: str, params: dict, build) -> Path:
    """The dataset of ``kind`` made from ``params`` under ``root`` (found, or written once by ``build()`` ->
    write_feature_dataset's keyword arguments, atomically)."""
    target = Path(root).resolve() / f"{kind}-{params_hash(params)}"
    if _is_prepared(target, kind=kind, params=params):
        return target
    fields = build()
    with atomic_dataset_dir(target, keep_existing=lambda t: _is_prepared(t, kind=kind, params=params)) as tmp:
        write_feature_dataset(tmp, kind=kind, params=params, **fields)
    return target


# ---------------------------------------------------------------------------------------------------- synthetic
def synthetic_features(*, num_samples: int, dim: int, classes: Mapping[str, int], scales: Mapping[str, float],
                       noise: float, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Features x_i = sum_a scale_a * P_a[y_ia] + noise * eps_i: each attribute a has ``classes[a]`` random unit
    prototypes P_a (in R^dim) and an independent uniform label y_ia; eps ~ N(0, I). An attribute with a much
    larger scale dominates the features, so plain contrastive learning of a small encoder tends to keep it and
    suppress the others. Returns (float32 (N, dim), {attribute: int64 (N,)})."""
    rng = np.random.default_rng(seed)
    features = noise * rng.standard_normal((num_samples, dim))
    labels = {}
    for name, count in classes.items():
        prototypes = rng.standard_normal((count, dim))
        prototypes /= np.linalg.norm(prototypes, axis=1, keepdims=True)
        labels[name] = rng.integers(0, count, size=num_samples)
        features += scales[name] * prototypes[labels[name]]
    return features.astype(np.float32), labels


def prepare_synthetic(*, root: Path | str, num_train: int, num_test: int, dim: int, classes: Mapping[str, int],
                      scales: Mapping[str, float], noise: float, seed: int) -> Path:
    """Generate (once; later calls find it) :func:`synthetic_features` with a train / test split."""
    params = {"num_train": num_train, "num_test": num_test, "dim": dim, "classes": dict(classes),
              "scales": dict(scales), "noise": noise, "seed": seed}

    def build() -> dict:
        features, labels = synthetic_features(num_samples=num_train + num_test, dim=dim, classes=classes,
                                              scales=scales, noise=noise, seed=seed)
        return {"features": features, "ids": [f"v{i:07d}" for i in range(num_train + num_test)],
                "split": ["train"] * num_train + ["test"] * num_test, "labels": labels,
                "attributes": {name: [f"{name}{c}" for c in range(count)] for name, count in classes.items()}}
    return _prepare(root=root, kind="synthetic_features", params=params, build=build)


# ---------------------------------------------------------------------------------------------------- files
def read_features(path: Path) -> np.ndarray:
    """float32 (N, D) from an ``.npy``; DataError naming the file and the fix when it is not a finite 2-D array."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"data.files.features {path} is not a readable .npy ({exc}): save the features with "
                        "numpy.save(path, array) as an (N, D) float array") from None
    if array.ndim != 2 or array.dtype.kind not in "fiu" or array.shape[0] < 2:
        raise DataError(f"data.files.features {path} holds {array.dtype} {tuple(array.shape)}: expected an (N, D) "
                        "float array with N >= 2 (one row a sample)")
    features = np.asarray(array, dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(features).all(axis=1))
    if bad.size:
        raise DataError(f"data.files.features {path}: {bad.size} rows hold NaN or inf (first: row {bad[0]}): drop "
                        "or fix those rows")
    return features


def read_ids(path: Path | None, *, num_samples: int) -> list[str]:
    """Sample ids: one a line of a text file, or an ``.npy`` of N values; None: the row numbers."""
    if path is None:
        return [str(i) for i in range(num_samples)]
    path = Path(path)
    if path.suffix == ".npy":
        ids = [str(x) for x in np.load(path, allow_pickle=False).ravel().tolist()]
    else:
        ids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(ids) != num_samples:
        raise DataError(f"data.files.ids {path} has {len(ids)} ids but the features have {num_samples} rows: give "
                        "one id per feature row, in the same order")
    seen: set[str] = set()
    for line, sample_id in enumerate(ids, 1):
        if sample_id in seen:
            raise DataError(f"data.files.ids {path}: id {sample_id!r} (entry {line}) appears twice: ids must be "
                            "unique")
        seen.add(sample_id)
    return ids


def read_label_csv(path: Path, *, ids: list[str]) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    """Attribute labels from a CSV with a header: an ``id`` column and one column per attribute (any values; an
    empty cell is unknown, -1). Rows are matched to ``ids``; ids without a row are unknown for every attribute.
    Returns ({attribute: int64 (N,)}, {attribute: sorted class names})."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames or []
        if "id" not in columns or len(columns) < 2:
            raise DataError(f"data.files.labels {path} must have a header with an 'id' column and at least one "
                            f"attribute column (got {columns})")
        rows = {}
        for line, row in enumerate(reader, 2):
            if row["id"] in rows:
                raise DataError(f"data.files.labels {path} line {line}: id {row['id']!r} appears twice")
            rows[row["id"]] = row
    unknown = sorted(set(rows) - set(ids))
    if unknown:
        raise DataError(f"data.files.labels {path}: {len(unknown)} ids are not among the features' ids (first: "
                        f"{unknown[0]!r}): fix the ids or data.files.ids")
    attributes = [c for c in columns if c != "id"]
    names = {a: sorted({r[a] for r in rows.values() if r.get(a)}) for a in attributes}
    labels = {a: np.array([names[a].index(rows[i][a]) if i in rows and rows[i].get(a) else -1 for i in ids],
                          dtype=np.int64) for a in attributes}
    return labels, names


def prepare_feature_files(*, root: Path | str, features_path: Path, ids_path: Path | None, labels_path: Path | None,
                          test_fraction: float, seed: int) -> Path:
    """A dataset from the user's files, keyed by their paths, sizes and modification times; a seeded
    ``test_fraction`` of the rows held out (for the probe and kNN scores)."""
    sources = {"features": features_path, "ids": ids_path, "labels": labels_path}
    stamp = {k: None if p is None else [str(Path(p).resolve()), Path(p).stat().st_size, Path(p).stat().st_mtime_ns]
             for k, p in sources.items()}
    params = {"files": stamp, "test_fraction": test_fraction, "seed": seed}

    def build() -> dict:
        features = read_features(Path(features_path))
        ids = read_ids(ids_path, num_samples=len(features))
        labels, attributes = read_label_csv(Path(labels_path), ids=ids) if labels_path is not None else ({}, {})
        split = np.where(np.random.default_rng(seed).random(len(features)) < test_fraction, "test", "train")
        return {"features": features, "ids": ids, "split": split, "labels": labels, "attributes": attributes}
    return _prepare(root=root, kind="feature_files", params=params, build=build)
