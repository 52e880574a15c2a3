"""Seeded faiss k-means over stage embeddings (torch's on a GPU that faiss cannot use), and the on-disk format of
its results.

MCL clusters the embeddings Z_j of stage j into K groups (k-means; the paper uses faiss on GPU) and
uses the assignments y_j, combined over stages, as pseudo-labels for the next stage. Unlike the
public reference code (scikit-learn on CPU, no seed) this is seeded, uses the GPU when present and
assigns every point. Lloyd's iterations run on every point or, when asked (the pipeline's default is
1024 points per cluster), on a seeded uniform sample, stated in the arguments rather than faiss's
silent k * 256 subsample; k-means++ seeding (scikit-learn's ``kmeans_plusplus`` on a small sample) for
small k, random seeding (k distinct points) for large k, where k-means++ would cost more than Lloyd itself. Both
seedings are drawn here, so every backend (faiss-cpu, faiss-gpu, torch on a GPU faiss cannot use) starts from the
same seeds and ends on the same clusters up to float rounding.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import faiss
import numpy as np
from sklearn.cluster import kmeans_plusplus
from sklearn.metrics import adjusted_mutual_info_score
from threadpoolctl import threadpool_limits

from contrastive.data.dataset import npz_column_for_ids, save_index
from contrastive.engine.files import atomic_write_bytes
from contrastive.errors import ConfigError, DataError

__all__ = [
    "KMeansResult",
    "adjusted_mutual_information",
    "kmeans",
    "load_assignments",
    "save_clusters",
]

ASSIGNMENTS_FILE = "assignments.npz"
CENTROIDS_FILE = "centroids.npy"
SUMMARY_FILE = "summary.json"

_ROW_CHUNK = 1 << 16  # rows per chunk when normalising, so temporaries stay chunk x D
_ASSIGN_CHUNK = 1 << 17  # rows converted and assigned at a time after training on a sample (0.4 GB at D = 768)

KMEANS_INITS = ("auto", "k-means++", "random")
# k-means++ costs O(seeding points x k x log k x D) on the CPU; above this k (auto) random seeding
# is used, which at large k (e.g. 20,000 on a GPU) costs nothing and matters less (many centroids per mode).
_KMEANSPP_MAX_K = 256
# Seeding (bench/kmeans.py measured the choice): several k-means++ candidates, each polished by a few Lloyd
# iterations on a small sample (256 points per cluster), keep the one with the lowest inertia on that sample.
# Which local minimum Lloyd ends in depends mostly on the seeds; picking the best of a few candidates on a
# small sample is far cheaper than restarting Lloyd on the training points (scikit-learn's n_init).
_SEEDING_CANDIDATES = 3
_SEEDING_POINTS_PER_CLUSTER = 256
_SEEDING_LLOYD_ITERATIONS = 5


@dataclass
class KMeansResult:
    """Output of kmeans.

    assignments: int64 (M,) cluster id of every point. centroids: float32 (k, D) (unit rows when
    spherical). sizes: int64 (k,) points per cluster (zeros = empty clusters). inertia: sum over all
    points of ||x_i - c_{a_i}||^2 in the space clustered (after L2 normalisation when spherical).
    backend: faiss-cpu, faiss-gpu, or torch-cuda (contrastive.mcl.lloyd_torch, on a GPU that faiss cannot use).
    """

    assignments: np.ndarray
    centroids: np.ndarray
    sizes: np.ndarray
    inertia: float
    k: int
    seed: int
    spherical: bool = True
    backend: str = "faiss-cpu"  # where Lloyd ran: faiss-cpu, faiss-gpu, or torch-cuda (faiss without a GPU)


def kmeans(
    *,
    features: np.ndarray,
    k: int,
    seed: int,
    niter: int = 25,
    spherical: bool = True,
    use_gpu: bool | None = None,
    gpu_devices: tuple[int, ...] = (0,),
    max_train_points: int | None = None,
    init: Literal["auto", "k-means++", "random"] = "auto",
) -> KMeansResult:
    """Lloyd's k-means (faiss.Kmeans) on the M points or a seeded sample of them, then assign every point to its
    nearest centroid.

    features: float (M, D), any float dtype (cast to float32 C-contiguous; float16 exports are fine).
    spherical: L2-normalise rows first and keep unit centroids (cosine k-means), the usual choice for
        contrastive embeddings, which live on the sphere.
    use_gpu: None = use a GPU when there is one; True = require one; False = the CPU. On a GPU, faiss-gpu when
        faiss sees it, else the same Lloyd iterations in torch on ``gpu_devices[0]``
        (:mod:`contrastive.mcl.lloyd_torch`: the faiss GPU wheels do not install beside the pinned CUDA 13 torch).
    gpu_devices: the GPUs (device ids: positions among the visible devices) k-means may use when it uses the
        GPU; the pipeline passes its step's own (one, see tasks/steps.py). faiss.Kmeans(gpu=True) would take
        every visible GPU, and gpu=1 too (faiss reads 1 == True as "all").
    max_train_points: None (default) = train on all M points. An int = train on a seeded uniform sample of at
        most that many points (each Lloyd iteration then costs sample/M of a full pass); every point is still
        assigned and counted in the inertia. bench/kmeans.py measures the trade-off.
    init: "k-means++" = the best of 3 k-means++ seedings, each polished by 5 Lloyd iterations on a seeded sample
        of 256 k training points (see _initial_centroids); "random" = k distinct training points drawn with seed;
        "auto" = k-means++ for k <= 256, random above.
    """
    if init not in KMEANS_INITS:
        raise ConfigError(f"k-means init {init!r} is not one of {KMEANS_INITS}.")
    arr = _validated_features(features=features, k=k)
    devices, torch_device = _placement(use_gpu, gpu_devices=gpu_devices)
    num_points, dim = arr.shape
    rows = _training_rows(num_points=num_points, k=k, seed=seed, max_train_points=max_train_points)
    train_x = _unit_float32(arr if rows is None else arr[rows], spherical=spherical)
    if _non_finite_rows(train_x).any():
        raise _non_finite_error(arr)
    init_centroids = _initial_centroids(train_x=train_x, k=k, seed=seed, init=init, spherical=spherical)
    if torch_device is not None:
        centroids, search = _train_torch(train_x=train_x, init_centroids=init_centroids, niter=niter, seed=seed,
                                         spherical=spherical, device=torch_device)
        backend = "torch-cuda"
    else:
        centroids, search = _train_faiss(train_x=train_x, init_centroids=init_centroids, k=k, niter=niter,
                                         seed=seed, spherical=spherical, devices=devices)
        backend = "faiss-gpu" if devices else "faiss-cpu"
    inner_product = spherical  # faiss.Kmeans clusters with an inner-product index when spherical, L2 otherwise
    if rows is None:
        chunks = [(0, train_x)]  # already converted (and checked): one search over all points
    else:
        # Trained on a sample: convert, check and assign the points a chunk at a time, so peak memory is a chunk
        # in float32 (not an (M, D) copy; 10M x 768 CC12M embeddings would be 30 GB), with the input untouched.
        chunks = ((start, _unit_float32(arr[start:start + _ASSIGN_CHUNK], spherical=spherical))
                  for start in range(0, num_points, _ASSIGN_CHUNK))
    assignments = np.empty(num_points, dtype=np.int64)
    inertia = 0.0
    for start, chunk in chunks:
        if rows is not None and _non_finite_rows(chunk).any():
            raise _non_finite_error(arr)
        scores, labels = search(chunk)
        assignments[start:start + chunk.shape[0]] = labels[:, 0]
        inertia += _inertia(x=chunk, centroids=centroids, assignments=labels[:, 0], scores=scores[:, 0],
                            inner_product=inner_product)
    if torch_device is not None:  # the caching allocator would keep the points' GPU memory in this process
        from contrastive.engine.loop import release_device_memory
        del search  # holds the centroids on the GPU
        release_device_memory(torch_device)
    return KMeansResult(
        assignments=assignments,
        centroids=centroids,
        sizes=np.bincount(assignments, minlength=k).astype(np.int64),
        inertia=inertia,
        k=int(k),
        seed=int(seed),
        spherical=bool(spherical),
        backend=backend,
    )


Search = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _train_faiss(*, train_x: np.ndarray, init_centroids: np.ndarray, k: int, niter: int, seed: int,
                 spherical: bool, devices: tuple[int, ...]) -> tuple[np.ndarray, Search]:
    """faiss.Kmeans on train_x (its index on ``devices``, the CPU when empty): float32 (k, D) centroids and the
    index's search (rows (n, D) -> (scores (n, 1), labels (n, 1)))."""
    dim = train_x.shape[1]
    km = faiss.Kmeans(
        dim,
        k,
        niter=niter,
        seed=seed % 2**31,  # faiss takes a C int
        spherical=spherical,
        gpu=False,  # the index goes to exactly these devices below
        verbose=False,
        # faiss trains on a random subset of k * max_points_per_centroid points (default 256 per
        # centroid) and says so only on stdout; raise the cap so every training point is used.
        max_points_per_centroid=math.ceil(train_x.shape[0] / k) + 1,
    )
    if devices:
        km.index = faiss.index_cpu_to_gpus_list(km.index, gpus=list(devices))
    km.train(train_x, init_centroids=init_centroids)
    return np.asarray(km.centroids, dtype=np.float32).reshape(k, dim), lambda rows: km.index.search(rows, 1)


def _train_torch(*, train_x: np.ndarray, init_centroids: np.ndarray, niter: int, seed: int,
                 spherical: bool, device) -> tuple[np.ndarray, Search]:
    """Lloyd in torch on ``device`` (contrastive.mcl.lloyd_torch) from ``init_centroids``, as
    :func:`_train_faiss` returns it."""
    import torch

    from contrastive.mcl.lloyd_torch import lloyd, nearest_centroids
    points = torch.from_numpy(train_x).to(device)
    centroids = lloyd(points, torch.from_numpy(np.ascontiguousarray(init_centroids)).to(device), niter=niter,
                      spherical=spherical, seed=seed)
    del points

    def search(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels, scores = nearest_centroids(torch.from_numpy(rows).to(device), centroids, inner_product=spherical)
        return scores.cpu().numpy()[:, None], labels.cpu().numpy()[:, None]
    return centroids.cpu().numpy(), search


def _initial_centroids(*, train_x: np.ndarray, k: int, seed: int, init: str, spherical: bool) -> np.ndarray:
    """float32 (k, D) seeds for Lloyd on train_x.

    random: k distinct training points drawn with ``seed`` (faiss's random seeding, drawn here so that faiss-cpu,
    faiss-gpu and torch start from the same seeds: where k-means runs is placement, not part of a step's key).
    k-means++: _SEEDING_CANDIDATES candidate seedings (scikit-learn's kmeans_plusplus, Arthur & Vassilvitskii
    2007) on a seeded sample of 256 k rows of train_x, each refined by 5 Lloyd iterations on that sample; the
    candidate with the lowest inertia on the sample wins.
    """
    if init == "random" or (init == "auto" and k > _KMEANSPP_MAX_K):
        rows = np.random.default_rng([seed, 3]).choice(train_x.shape[0], size=k, replace=False)
        return np.ascontiguousarray(train_x[rows])
    num_points, dim = train_x.shape
    size = min(num_points, _SEEDING_POINTS_PER_CLUSTER * k)
    rows = np.random.default_rng([seed, 1]).choice(num_points, size=size, replace=False)
    sample = train_x[np.sort(rows)]
    best_inertia, best = math.inf, None
    for candidate in range(_SEEDING_CANDIDATES):
        state = int(np.random.SeedSequence([seed, candidate]).generate_state(1)[0] >> 1)  # faiss: C int
        # One BLAS thread: k-means++'s products are small (candidates x sample), and a thread team spin-waiting on
        # them took 2-6x longer than one thread on 2 cores (8,000 x 256, k = 100: 1.9-4.4 s against 0.7 s).
        with threadpool_limits(limits=1, user_api="blas"):
            seeds, _ = kmeans_plusplus(sample, n_clusters=k, random_state=state)
        refine = faiss.Kmeans(dim, k, niter=_SEEDING_LLOYD_ITERATIONS, seed=state, spherical=spherical,
                              max_points_per_centroid=size // k + 1)
        refine.train(sample, init_centroids=np.ascontiguousarray(seeds, dtype=np.float32))
        centroids = np.asarray(refine.centroids, dtype=np.float32).reshape(k, dim)
        # Squared L2 to the nearest centroid: the objective of both variants (rows are unit when spherical).
        index = faiss.IndexFlatL2(dim)
        index.add(centroids)
        inertia = float(index.search(sample, 1)[0].astype(np.float64).sum())
        if inertia < best_inertia:
            best_inertia, best = inertia, centroids
    return best


def _training_rows(*, num_points: int, k: int, seed: int, max_train_points: int | None) -> np.ndarray | None:
    """None (train on every point), or the sorted indices of a seeded uniform sample of max_train_points rows."""
    if max_train_points is None or max_train_points >= num_points:
        return None
    if max_train_points < k:
        raise ConfigError(f"max_train_points={max_train_points} is below k={k}: k-means needs at least one "
                          "training point per cluster; raise it (or leave it unset to train on every point).")
    rows = np.random.default_rng(seed).choice(num_points, size=max_train_points, replace=False)
    rows.sort()
    return rows


def _validated_features(*, features: np.ndarray, k: int) -> np.ndarray:
    """features as an (M, D) numeric array (no copy), with 1 <= k <= M."""
    arr = np.asarray(features)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise DataError(f"features must be a non-empty (M, D) array, got shape {arr.shape}.")
    if arr.dtype.kind not in "fiu":
        raise DataError(f"features must be numeric, got dtype {arr.dtype}.")
    num_points = arr.shape[0]
    if not 1 <= k <= num_points:
        raise ConfigError(
            f"k={k} clusters for {num_points} points: k must be in [1, {num_points}]; lower k "
            "(MCL also needs K^N <= M / batch_size so every cluster can fill a batch)."
        )
    return arr


def _unit_float32(rows: np.ndarray, *, spherical: bool) -> np.ndarray:
    """float32 C-contiguous copy-or-view of rows (n, D); L2-normalised when spherical (a copy: the caller's
    array is never modified)."""
    x = np.array(rows, dtype=np.float32, order="C", copy=spherical or None)
    if spherical:
        _l2_normalize_rows_(x)
    return x


def _non_finite_rows(x: np.ndarray) -> np.ndarray:
    """bool (n,): rows of float32 x (n, D) holding a NaN or inf.

    A row with a NaN or inf entry has a non-finite sum (NaN and inf propagate; a float32 sum is 2x faster than a
    float64 one and needs no (n, D) boolean temporary). A non-finite sum can also be a float32 overflow of finite
    entries, so only the flagged rows are then checked entry by entry. Not a BLAS ``x @ 1``: between faiss
    searches its spinning thread pool took the cores from faiss's (+30 % on the assignment pass). Normalising
    keeps NaN/inf rows non-finite (inf / inf is NaN).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        suspect = np.flatnonzero(~np.isfinite(x.sum(axis=1)))
    bad = np.zeros(x.shape[0], dtype=bool)
    bad[suspect] = ~np.isfinite(x[suspect]).all(axis=1)
    return bad


def _non_finite_error(arr: np.ndarray) -> DataError:
    """The error for embeddings with NaN/inf rows: how many of all M rows (counted a chunk at a time) and the
    first one."""
    bad = np.concatenate([_non_finite_rows(_unit_float32(arr[start:start + _ASSIGN_CHUNK], spherical=False))
                          for start in range(0, arr.shape[0], _ASSIGN_CHUNK)])
    return DataError(
        f"{int(bad.sum())} of {arr.shape[0]} embedding rows contain NaN or inf (e.g. row "
        f"{int(np.flatnonzero(bad)[0])}); the encoder of the stage that exported them has probably "
        "diverged: lower its learning rate (or enable gradient clipping) and retrain that stage."
    )


def _l2_normalize_rows_(x: np.ndarray) -> None:
    """In place: x[i] /= ||x[i]||; all-zero rows stay zero."""
    for start in range(0, x.shape[0], _ROW_CHUNK):
        rows = x[start : start + _ROW_CHUNK]
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        with np.errstate(invalid="ignore"):  # an inf row becomes NaN here; the caller reports it right after
            rows /= np.maximum(norms, 1e-12)[:, None]


def _placement(use_gpu: bool | None, *, gpu_devices: tuple[int, ...]):
    """Where k-means runs: (faiss GPU ids, None) for faiss-gpu, ((), torch device) for torch on a CUDA device
    that faiss cannot use, ((), None) for faiss on the CPU. A GPU is one of ``gpu_devices`` (none: the CPU)."""
    available = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    devices = tuple(device for device in gpu_devices if 0 <= device < available)
    if use_gpu is False or not gpu_devices:
        if use_gpu:
            raise ConfigError("use_gpu=True but no GPU was given to k-means (gpu_devices is empty: device=cpu)")
        return (), None
    if devices:
        return devices, None
    cuda = _cuda_device_count()
    if 0 <= gpu_devices[0] < cuda:
        import torch
        return (), torch.device("cuda", gpu_devices[0])
    if use_gpu:
        raise ConfigError(
            f"use_gpu=True but neither faiss ({available} GPU(s)) nor torch ({cuda} CUDA device(s)) sees any of "
            f"{list(gpu_devices)}; run on a GPU machine with a CUDA build of torch (or install faiss-gpu: "
            "docs/gpu.md), or set use_gpu to false/auto."
        )
    return (), None


def _cuda_device_count() -> int:
    """CUDA devices this process's torch can use (0 without CUDA; torch is imported only to ask)."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _inertia(
    *, x: np.ndarray, centroids: np.ndarray, assignments: np.ndarray, scores: np.ndarray, inner_product: bool
) -> float:
    """Sum of squared distances of all points to their assigned centroid, as float.

    scores: (M,) what index.search returned: squared L2 distances, or inner products for the
    spherical (IndexFlatIP) index, converted with ||x - c||^2 = ||x||^2 + ||c||^2 - 2 <x, c>.
    """
    if not inner_product:
        return float(np.maximum(scores, 0).astype(np.float64).sum())
    centroid_sq = np.einsum("ij,ij->i", centroids, centroids).astype(np.float64)
    total = 0.0
    for start in range(0, x.shape[0], _ROW_CHUNK):
        rows = x[start : start + _ROW_CHUNK]
        point_sq = np.einsum("ij,ij->i", rows, rows).astype(np.float64)
        sq = point_sq + centroid_sq[assignments[start : start + _ROW_CHUNK]]
        sq -= 2.0 * scores[start : start + _ROW_CHUNK].astype(np.float64)
        total += float(np.maximum(sq, 0).sum())
    return total


def adjusted_mutual_information(*, a: np.ndarray, b: np.ndarray) -> float:
    """AMI between two clusterings of the same samples (1.0 = identical up to relabelling, ~0 = independent).

    a, b: int (M,). Used to check that a later stage's clusters differ from earlier ones'.
    """
    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    if a.size != b.size:
        raise DataError(
            f"cannot compare clusterings of {a.size} and {b.size} samples; align both to the same sample "
            "ids first (align_labels_to_ids)."
        )
    return float(adjusted_mutual_info_score(a, b))


def save_clusters(*, result: KMeansResult, ids: np.ndarray, directory: Path) -> dict:
    """Write assignments.npz (ids, assignments), centroids.npy and summary.json into directory.

    ids: (M,) str or int sample ids, aligned with result.assignments. Every file is written to a temp
    file in the same directory and renamed (atomic), summary.json last, so a present summary means the
    other files are complete. Returns the summary dict.
    """
    directory = Path(directory)
    ids = np.asarray(ids)
    if ids.dtype.kind == "O":
        ids = ids.astype(str)  # object arrays would need pickle to load
    if ids.shape != result.assignments.shape:
        raise DataError(
            f"{ids.size} ids for {result.assignments.size} assignments; pass the sample ids exported with "
            "the embeddings that were clustered."
        )
    directory.mkdir(parents=True, exist_ok=True)
    assignments = result.assignments
    atomic_write_bytes(directory / ASSIGNMENTS_FILE, lambda f: save_index(f, {"ids": ids, "assignments": assignments}),
                       what="a clustering")
    atomic_write_bytes(directory / CENTROIDS_FILE, lambda f: np.save(f, result.centroids, allow_pickle=False),
                       what="a clustering")
    summary = {
        "k": int(result.k),
        "sizes": [int(s) for s in result.sizes],
        "inertia": float(result.inertia),
        "seed": int(result.seed),
        "spherical": bool(result.spherical),
        "num_points": int(result.assignments.size),
        "empty_clusters": int((result.sizes == 0).sum()),
        "backend": result.backend,
    }
    atomic_write_bytes(directory / SUMMARY_FILE, json.dumps(summary, indent=2).encode(), what="a clustering")
    return summary


def load_assignments(*, directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read (ids (M,), assignments int64 (M,)) written by save_clusters."""
    path = Path(directory) / ASSIGNMENTS_FILE
    if not path.is_file() or not (Path(directory) / SUMMARY_FILE).is_file():
        raise DataError(f"no complete clustering in {directory} (missing {path.name} or {SUMMARY_FILE}); "
                        "re-run the clustering stage.")
    try:
        with np.load(path, allow_pickle=False) as data:
            ids, assignments = data["ids"], data["assignments"].astype(np.int64, copy=False)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(
            f"{path} is corrupt or not a cluster file ({exc}); re-run the clustering stage."
        ) from exc
    if ids.shape != assignments.shape:
        raise DataError(f"{path} holds {ids.size} ids but {assignments.size} assignments; re-run clustering.")
    return ids, assignments


def assignments_for(*, directory: Path, ids: np.ndarray) -> np.ndarray:
    """The cluster ids (M,) int64 written by save_clusters, aligned to ``ids`` (M,) by sample id.

    When the file's ids are ``ids`` in the same order (clusters and pseudo-labels of one export: the usual case),
    they are compared chunk by chunk as they are read and never held whole (at CC12M a second id table is ~0.4 GB);
    otherwise the file's ids are loaded and joined (``align_labels_to_ids``, which names missing ids).
    """
    from contrastive.mcl.ids import align_labels_to_ids
    path = Path(directory) / ASSIGNMENTS_FILE
    if path.is_file() and (Path(directory) / SUMMARY_FILE).is_file():
        try:
            assignments = npz_column_for_ids(path, ids=ids, name="assignments")
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"{path} is corrupt or not a cluster file ({exc}); re-run the clustering stage.") from exc
        if assignments is not None:
            return assignments.astype(np.int64, copy=False)
    stored_ids, assignments = load_assignments(directory=directory)
    return align_labels_to_ids(label_ids=stored_ids, labels=assignments, dataset_ids=ids)


