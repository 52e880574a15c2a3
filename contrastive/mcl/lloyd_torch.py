"""Lloyd's k-means in torch: the GPU path of :func:`contrastive.mcl.clustering.kmeans` where faiss has no GPU.

Why it exists: the faiss GPU wheels on PyPI are CUDA 12 builds and the one CUDA 13 wheel pins other CUDA libraries
than the pinned torch (docs/gpu.md), so a default GPU install clusters with faiss-cpu: at CC12M scale (10M x 768,
K = 20,000) an iteration is ~300 TFLOP of distance products, minutes each on a CPU, a fraction of a second on a GPU.
faiss-gpu is still used whenever faiss sees the GPU; this module is the same algorithm on torch's matrix product.

It follows faiss's ``Clustering::train`` step for step, so the two give the same clusters from the same seeds (up
to float rounding and the draws of the empty-cluster split, tested against faiss-cpu):

1. assignment: each point to the centroid of largest inner product (``spherical``: faiss's IndexFlatIP) or
   smallest squared L2 distance (IndexFlatL2); exact fp32 products (no TF32), in chunks of rows so the (rows, k)
   score block stays ~1 GB;
2. update: each centroid the mean of its points (sums accumulated in float64);
3. empty clusters: faiss's own ``reassign_centroids`` (``faiss.contrib.clustering``, its Python port of
   ``split_clusters``, which takes torch centroids): an empty cluster copies a cluster drawn with probability
   proportional to (size - 1), the two pulled apart by a relative 1/1024 on alternate coordinates, sizes halved;
4. ``spherical``: centroids renormalised to unit length after the split.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from faiss.contrib.clustering import reassign_centroids

#: Scores per assignment chunk (rows x k float32): ~1 GB.
_SCORES_PER_CHUNK = 1 << 28
#: Rows per chunk of the float64 centroid sums (a float64 copy of all n points would be twice their size).
_SUM_ROWS = 1 << 16


@contextlib.contextmanager
def exact_fp32_matmul():
    """Float32 matrix products on CUDA exact fp32 inside, not TF32 (the engine enables TF32 for training in this
    process; a 10-bit mantissa would move points that lie near a boundary between two clusters); restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def nearest_centroids(x: torch.Tensor, centroids: torch.Tensor, *, inner_product: bool,
                      chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels int64 (n,), scores float32 (n,)) of points x (n, D) against centroids (k, D), on their device: the
    largest inner product (``inner_product``) or the smallest squared L2 distance, as faiss's flat index search
    returns them (k = 1). ||x - c||^2 = ||x||^2 - 2 <x, c> + ||c||^2, the argmin taken over ||c||^2 - 2 <x, c>."""
    k = centroids.shape[0]
    rows = chunk_rows or max(1, _SCORES_PER_CHUNK // k)
    centroid_sq = None if inner_product else (centroids * centroids).sum(dim=1)
    labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    scores = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    with exact_fp32_matmul():
        for start in range(0, x.shape[0], rows):
            block = x[start:start + rows]
            products = block @ centroids.T  # (rows, k)
            if inner_product:
                best, label = products.max(dim=1)
            else:
                best, label = (centroid_sq - 2 * products).min(dim=1)
                best = (best + (block * block).sum(dim=1)).clamp_(min=0)
            labels[start:start + rows], scores[start:start + rows] = label, best
    return labels, scores


def lloyd(x: torch.Tensor, initial: torch.Tensor, *, niter: int, spherical: bool, seed: int) -> torch.Tensor:
    """float32 (k, D) centroids after ``niter`` Lloyd iterations of points x (n, D) from ``initial`` (k, D), both on
    the device it runs on. The draws of the empty-cluster split are seeded by ``seed``."""
    if x.shape[0] == initial.shape[0]:
        return x.clone()  # one point a cluster: faiss's Clustering copies the points as the centroids
    centroids = initial.clone()
    draws = np.random.RandomState(seed % 2**32)  # what reassign_centroids draws from
    for _ in range(niter):
        labels, _ = nearest_centroids(x, centroids, inner_product=spherical)
        sums = torch.zeros(centroids.shape, dtype=torch.float64, device=x.device)
        for start in range(0, x.shape[0], _SUM_ROWS):
            sums.index_add_(0, labels[start:start + _SUM_ROWS], x[start:start + _SUM_ROWS].double())
        counts = torch.bincount(labels, minlength=centroids.shape[0])
        updated = (sums / counts.clamp(min=1).unsqueeze(1)).float()
        sizes = counts.cpu().numpy()
        if (sizes == 0).any():  # faiss keeps no stale centroid: an empty one is re-seeded by splitting a big one
            reassign_centroids(sizes, updated, draws)
        if spherical:
            updated = torch.nn.functional.normalize(updated, dim=1, eps=1e-12)
        centroids = updated
    return centroids
