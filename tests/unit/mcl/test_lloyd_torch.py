"""contrastive.mcl.lloyd_torch, the GPU k-means where faiss has no GPU: run on the CPU here against faiss-cpu from
the same seeds (the algorithm is faiss's, so the clusters must be faiss's), its empty-cluster split, its chunked
search, and the dispatch of contrastive.mcl.clustering.kmeans to it."""
from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch

from contrastive.errors import ConfigError
from contrastive.mcl import clustering
from contrastive.mcl.clustering import adjusted_mutual_information, kmeans
from contrastive.mcl.lloyd_torch import exact_fp32_matmul, lloyd, nearest_centroids


def _clustered(*, num: int = 6000, dim: int = 16, centers: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((centers, dim)).astype(np.float32)
    return means[rng.integers(0, centers, num)] + 0.7 * rng.standard_normal((num, dim)).astype(np.float32)


@pytest.mark.parametrize("spherical", [False, True])
def test_lloyd_gives_faiss_clusters_from_the_same_seeds(spherical):
    x = _clustered()
    if spherical:
        faiss.normalize_L2(x)
    k = 48
    seeds = x[np.random.default_rng(1).choice(len(x), k, replace=False)].copy()
    reference = faiss.Kmeans(x.shape[1], k, niter=15, seed=1, spherical=spherical, max_points_per_centroid=10 ** 6)
    reference.train(x, init_centroids=seeds)
    index = faiss.IndexFlatIP(x.shape[1]) if spherical else faiss.IndexFlatL2(x.shape[1])
    index.add(reference.centroids)
    faiss_scores, faiss_labels = index.search(x, 1)

    centroids = lloyd(torch.from_numpy(x), torch.from_numpy(seeds), niter=15, spherical=spherical, seed=1)
    labels, scores = nearest_centroids(torch.from_numpy(x), centroids, inner_product=spherical)
    np.testing.assert_allclose(centroids.numpy(), reference.centroids, atol=1e-4)
    assert (labels.numpy() == faiss_labels[:, 0]).mean() > 0.999
    assert float(scores.double().sum()) == pytest.approx(float(faiss_scores.astype(np.float64).sum()), rel=1e-5)
    if spherical:
        np.testing.assert_allclose(np.linalg.norm(centroids.numpy(), axis=1), 1.0, rtol=1e-5)


def test_an_empty_cluster_is_reseeded_by_splitting_a_populated_one():
    """A seed far from every point gets none at the first assignment: faiss's rule copies a populated cluster
    into it (both nudged apart), so Lloyd ends with every cluster in use, as faiss does."""
    x = _clustered(num=2000, dim=8, centers=6)
    seeds = x[:6].copy()
    seeds[2] = 1000.0  # nothing is nearest to it
    centroids = lloyd(torch.from_numpy(x), torch.from_numpy(seeds), niter=10, spherical=False, seed=0)
    labels, _ = nearest_centroids(torch.from_numpy(x), centroids, inner_product=False)
    assert np.bincount(labels.numpy(), minlength=6).min() > 0
    assert float(centroids[2].abs().max()) < 100  # the far seed was replaced, not kept


def test_one_point_a_cluster_makes_the_points_the_centroids():
    x = torch.randn(5, 3)
    np.testing.assert_array_equal(lloyd(x, torch.zeros(5, 3), niter=5, spherical=False, seed=0).numpy(), x.numpy())


@pytest.mark.parametrize("inner_product", [False, True])
def test_the_chunked_search_equals_the_exact_nearest_centroid(inner_product):
    generator = torch.Generator().manual_seed(0)
    x, centroids = torch.randn(1000, 8, generator=generator), torch.randn(30, 8, generator=generator)
    labels, scores = nearest_centroids(x, centroids, inner_product=inner_product, chunk_rows=7)
    x64, c64 = x.double(), centroids.double()
    if inner_product:
        expected_scores, expected = (x64 @ c64.T).max(dim=1)
    else:
        expected_scores, expected = torch.cdist(x64, c64).pow(2).min(dim=1)
    assert torch.equal(labels, expected)
    torch.testing.assert_close(scores.double(), expected_scores, atol=1e-4, rtol=1e-5)


def test_tf32_is_off_inside_the_search_and_restored_after():
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with exact_fp32_matmul():
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def test_kmeans_runs_lloyd_in_torch_on_a_cuda_device_that_faiss_cannot_use(monkeypatch):
    """faiss sees no GPU, torch sees 2: k-means takes torch on the step's GPU (cuda:1 here), with the same
    k-means++ seeds as faiss-cpu, so the two agree; with device=cpu (no GPU ids) or use_gpu=False, faiss-cpu.
    CUDA is simulated: the torch device is swapped for the CPU where the tensors are made."""
    x = _clustered(num=3000, dim=8, centers=5)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)
    monkeypatch.setattr(clustering, "_cuda_device_count", lambda: 2)
    devices = []
    real_train_torch = clustering._train_torch

    def on_cpu(*, device, **kwargs):
        devices.append(device)
        return real_train_torch(device=torch.device("cpu"), **kwargs)
    monkeypatch.setattr(clustering, "_train_torch", on_cpu)
    from contrastive.engine import loop
    released = []
    monkeypatch.setattr(loop, "release_device_memory", released.append)
    on_gpu = kmeans(features=x, k=5, seed=0, spherical=True, gpu_devices=(1,))
    assert devices == [torch.device("cuda", 1)] and on_gpu.backend == "torch-cuda"
    assert released == [torch.device("cuda", 1)]  # the flow's process keeps no cached GPU memory after it
    on_cpu_faiss = kmeans(features=x, k=5, seed=0, spherical=True, gpu_devices=())
    assert on_cpu_faiss.backend == "faiss-cpu" and devices == [torch.device("cuda", 1)]
    assert kmeans(features=x, k=5, seed=0, spherical=True, use_gpu=False).backend == "faiss-cpu"
    assert adjusted_mutual_information(a=on_gpu.assignments, b=on_cpu_faiss.assignments) > 0.99
    assert on_gpu.inertia == pytest.approx(on_cpu_faiss.inertia, rel=1e-4)
    # a large k (random seeding): k distinct training points, then the same search for every point
    many = kmeans(features=x, k=300, seed=0, spherical=False, gpu_devices=(0,), max_train_points=1000)
    assert many.backend == "torch-cuda" and many.assignments.shape == (3000,) and many.sizes.sum() == 3000


def test_asking_for_a_gpu_that_neither_faiss_nor_torch_sees_names_the_fix(monkeypatch):
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)
    monkeypatch.setattr(clustering, "_cuda_device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"neither faiss \(0 GPU\(s\)\) nor torch \(1 CUDA device\(s\)\) sees any "
                                          r"of \[3\].*faiss-gpu"):
        kmeans(features=_clustered(num=100, dim=4, centers=2), k=2, seed=0, use_gpu=True, gpu_devices=(3,))


def _reference_lloyd(x: np.ndarray, c: np.ndarray, *, niter: int, spherical: bool) -> np.ndarray:
    """Lloyd's iterations written out in float64 (no cluster empties in the data this is used on)."""
    x, c = x.astype(np.float64), c.astype(np.float64)
    for _ in range(niter):
        near = (x @ c.T).argmax(1) if spherical else ((x[:, None] - c[None]) ** 2).sum(-1).argmin(1)
        c = np.stack([x[near == j].mean(0) for j in range(len(c))])
        if spherical:
            c /= np.linalg.norm(c, axis=1, keepdims=True)
    return c


@pytest.mark.parametrize("spherical", [False, True])
def test_lloyd_is_the_written_out_iteration_summed_in_chunks(spherical, monkeypatch):
    """Two blobs and a lone point (a cluster of one), rows of other norms; sums over chunks of 2 rows."""
    from contrastive.mcl import lloyd_torch
    monkeypatch.setattr(lloyd_torch, "_SUM_ROWS", 2)
    x = np.array([[1, 0.1], [3, -0.2], [2, 0.3], [0.1, 1], [-0.2, 4], [0.3, 2], [-1, -1.2]], dtype=np.float32)
    # spherical: seeds of other norms, so that the nearest by inner product is not the nearest by distance
    initial = x[[0, 3, 6]] * (np.float32([[1.0], [5.0], [0.2]]) if spherical else np.float32(1.5))
    for niter in (1, 3):  # one: the first assignment (from the seeds) is checked before iterations converge
        got = lloyd_torch.lloyd(torch.from_numpy(x), torch.from_numpy(initial), niter=niter, spherical=spherical,
                                seed=0)
        np.testing.assert_allclose(got.numpy(), _reference_lloyd(x, initial, niter=niter, spherical=spherical),
                                   rtol=1e-5)


def test_an_empty_last_cluster_is_reseeded_too():
    from contrastive.mcl.lloyd_torch import lloyd, nearest_centroids
    x = torch.tensor([[0.0, 0], [0.1, 0], [0.2, 0], [5, 0], [5.1, 0], [5.2, 0]])
    initial = torch.tensor([[0.0, 0], [5, 0], [100, 100]])  # the last centroid wins no point
    centroids = lloyd(x, initial, niter=2, spherical=False, seed=0)
    labels, _ = nearest_centroids(x, centroids, inner_product=False)
    assert torch.bincount(labels, minlength=3).min() > 0 and centroids[2].abs().max() < 10
    split = lloyd(x, initial, niter=1, spherical=False, seed=0)  # split off a populated centroid
    assert split[2].abs().max() > 0.05  # the zero vector is what a mean of no points would leave


def test_the_split_of_empty_clusters_draws_from_the_seed_alone():
    from contrastive.mcl.lloyd_torch import lloyd
    rng = np.random.default_rng(0)
    corners = np.array([[0, 0], [10, 0], [0, 10], [10, 10]], dtype=np.float32)
    x = torch.from_numpy(np.repeat(corners, 5, axis=0) + rng.normal(scale=0.1, size=(20, 2)).astype(np.float32))
    initial = torch.from_numpy(np.concatenate([corners, 1000 + np.arange(8, dtype=np.float32).reshape(4, 2)]))
    runs = []
    for global_seed in (0, 1, 2):
        np.random.seed(global_seed)  # numpy's global generator, which an unseeded split would draw from
        runs.append(lloyd(x, initial, niter=1, spherical=False, seed=3))
    assert all(torch.equal(runs[0], run) for run in runs[1:])
