"""Tests for contrastive.mcl.clustering: seeded faiss k-means, AMI, and the cluster files."""
from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from contrastive.mcl.clustering import (
    KMeansResult,
    adjusted_mutual_information,
    kmeans,
    load_assignments,
    save_clusters,
)
from contrastive.errors import ConfigError, DataError


def _blobs(*, centers: np.ndarray, per_blob: int, std: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs around centers (k, D): features float32 (k * per_blob, D), truth int64, shuffled."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(centers)), per_blob)
    x = centers[truth] + std * rng.standard_normal((truth.size, centers.shape[1]))
    perm = rng.permutation(truth.size)
    return x[perm].astype(np.float32), truth[perm]


@pytest.fixture
def blobs():
    centers = 10.0 * np.eye(4, 8)  # 4 well-separated blobs in 8-D
    return _blobs(centers=centers, per_blob=150, std=0.5)


def _sq_dist(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    x64, c64 = x.astype(np.float64), c.astype(np.float64)
    return (x64**2).sum(1)[:, None] + (c64**2).sum(1)[None, :] - 2 * x64 @ c64.T


def test_kmeans_recovers_separated_blobs(blobs):
    x, truth = blobs
    result = kmeans(features=x, k=4, seed=0, spherical=False)
    assert isinstance(result, KMeansResult)
    assert result.assignments.shape == (x.shape[0],) and result.assignments.dtype == np.int64
    assert result.centroids.shape == (4, 8) and result.centroids.dtype == np.float32
    assert adjusted_mutual_information(a=result.assignments, b=truth) == pytest.approx(1.0, abs=1e-12)
    assert result.sizes.dtype == np.int64 and result.sizes.sum() == x.shape[0]
    np.testing.assert_array_equal(result.sizes, np.bincount(result.assignments, minlength=4))
    np.testing.assert_array_equal(np.sort(result.sizes), [150] * 4)
    assert (result.k, result.seed, result.spherical) == (4, 0, False)


def test_every_point_is_assigned_to_its_nearest_centroid_and_inertia_matches(blobs):
    x, _ = blobs
    result = kmeans(features=x, k=4, seed=1, spherical=False)
    d2 = _sq_dist(x, result.centroids)
    np.testing.assert_array_equal(result.assignments, d2.argmin(1))
    expected = ((x.astype(np.float64) - result.centroids[result.assignments]) ** 2).sum()
    assert result.inertia == pytest.approx(expected, rel=1e-4)


def test_all_points_train_the_centroids_no_subsampling():
    # faiss trains on at most k * 256 points by default; with 2 clusters of 1,000 points each the
    # centroids of a subsample differ from the means of all points by ~ std / sqrt(256).
    centers = np.array([[5.0, 0.0], [-5.0, 0.0]])
    x, _ = _blobs(centers=centers, per_blob=1000, std=1.0, seed=3)
    result = kmeans(features=x, k=2, seed=0, spherical=False)
    for j in range(2):
        np.testing.assert_allclose(result.centroids[j], x[result.assignments == j].mean(0), atol=1e-4)


def test_training_sample_trains_on_a_subset_but_assigns_and_scores_every_point():
    centers = np.array([[5.0, 0.0], [-5.0, 0.0]])
    x, truth = _blobs(centers=centers, per_blob=2000, std=1.0, seed=4)
    result = kmeans(features=x, k=2, seed=0, spherical=False, max_train_points=200)
    assert adjusted_mutual_information(a=result.assignments, b=truth) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(result.assignments, _sq_dist(x, result.centroids).argmin(1))
    expected = ((x.astype(np.float64) - result.centroids[result.assignments]) ** 2).sum()
    assert result.inertia == pytest.approx(expected, rel=1e-4)
    # Centroids are means of the 200 sampled points, not of all 4,000: off by ~ std / sqrt(100).
    full_means = np.stack([x[result.assignments == j].mean(0) for j in range(2)])
    assert np.abs(result.centroids - full_means).max() > 1e-3
    again = kmeans(features=x, k=2, seed=0, spherical=False, max_train_points=200)
    np.testing.assert_array_equal(again.centroids, result.centroids)
    with pytest.raises(ConfigError, match="max_train_points=1 is below k=2"):
        kmeans(features=x, k=2, seed=0, spherical=False, max_train_points=1)


def test_kmeans_plus_plus_finds_small_far_clusters_that_random_seeding_misses():
    # One big blob and three 5-point blobs far away: random seeding puts (almost) every seed in the big
    # blob and Lloyd splits it; k-means++ seeds in proportion to squared distance, so it picks the far ones.
    big, _ = _blobs(centers=np.zeros((1, 2)), per_blob=2000, std=1.0, seed=0)
    small, small_truth = _blobs(centers=np.array([[60.0, 0.0], [0.0, 60.0], [-60.0, -60.0]]), per_blob=5,
                                std=0.1, seed=1)
    x = np.concatenate([big, small])
    truth = np.concatenate([np.zeros(len(big), np.int64), small_truth + 1])
    recovered = {}
    for init in ("k-means++", "random"):
        recovered[init] = [
            adjusted_mutual_information(a=kmeans(features=x, k=4, seed=seed, spherical=False, init=init)
                                        .assignments, b=truth) > 0.99
            for seed in range(5)
        ]
    assert all(recovered["k-means++"])
    assert not all(recovered["random"])
    auto = kmeans(features=x, k=4, seed=0, spherical=False, init="auto")  # k <= 256: k-means++
    np.testing.assert_array_equal(auto.centroids, kmeans(features=x, k=4, seed=0, spherical=False,
                                                         init="k-means++").centroids)
    with pytest.raises(ConfigError, match="init 'kmeans' is not one of"):
        kmeans(features=x, k=4, seed=0, init="kmeans")


def test_seed_determinism(blobs):
    x, _ = blobs
    noisy = x + np.random.default_rng(5).standard_normal(x.shape).astype(np.float32) * 4  # overlapping blobs
    a = kmeans(features=noisy, k=6, seed=123, spherical=False)
    b = kmeans(features=noisy, k=6, seed=123, spherical=False)
    np.testing.assert_array_equal(a.assignments, b.assignments)
    np.testing.assert_array_equal(a.centroids, b.centroids)
    assert a.inertia == b.inertia


def test_spherical_clusters_directions_and_ignores_norms():
    rng = np.random.default_rng(0)
    directions = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    x, truth = _blobs(centers=directions, per_blob=100, std=0.05, seed=1)
    scaled = x * rng.uniform(0.1, 50.0, size=(x.shape[0], 1)).astype(np.float32)
    original = scaled.copy()
    result = kmeans(features=scaled, k=3, seed=0, spherical=True)
    np.testing.assert_array_equal(scaled, original)  # input not normalised in place
    assert adjusted_mutual_information(a=result.assignments, b=truth) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(np.linalg.norm(result.centroids, axis=1), 1.0, atol=1e-5)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_array_equal(kmeans(features=unit, k=3, seed=0).assignments, result.assignments)
    expected = ((unit.astype(np.float64) - result.centroids[result.assignments]) ** 2).sum()
    assert result.inertia == pytest.approx(expected, rel=1e-3)
    by_default = kmeans(features=scaled, k=3, seed=0)  # spherical unless asked otherwise: the norms play no part
    assert by_default.spherical and not kmeans(features=scaled, k=3, seed=0, spherical=False).spherical
    np.testing.assert_array_equal(by_default.assignments, result.assignments)


def test_a_centroid_no_point_is_nearest_to_counts_as_an_empty_cluster(monkeypatch):
    """After the last centroid update a centroid can be nearest to no point (of all M when trained on a sample):
    ``sizes`` still has k entries, the empty one 0."""
    import contrastive.mcl.clustering as clustering

    def third_centroid_opposite(*, train_x, **unused):
        centroids = np.array([[1, 0], [0, 1], [-1, 0]], dtype=np.float32)
        index = faiss.IndexFlatIP(2)
        index.add(centroids)
        return centroids, lambda rows: index.search(rows, 1)
    monkeypatch.setattr(clustering, "_train_faiss", third_centroid_opposite)
    x = np.array([[1, 0.1], [1, 0.2], [0.1, 1], [0.2, 1], [0.3, 1]], dtype=np.float32)
    result = kmeans(features=x, k=3, seed=0)
    assert result.sizes.tolist() == [2, 3, 0] and result.assignments.tolist() == [0, 0, 1, 1, 1]


def test_float16_and_k_equal_m(blobs):
    x, truth = blobs
    result = kmeans(features=x.astype(np.float16), k=4, seed=0, spherical=False)
    assert adjusted_mutual_information(a=result.assignments, b=truth) == pytest.approx(1.0, abs=1e-12)
    tiny = np.eye(3, dtype=np.float32)
    assert sorted(kmeans(features=tiny, k=3, seed=0).assignments.tolist()) == [0, 1, 2]


def test_k_out_of_range_is_a_config_error(blobs):
    x, _ = blobs
    with pytest.raises(ConfigError, match="lower k"):
        kmeans(features=x[:5], k=6, seed=0)
    with pytest.raises(ConfigError):
        kmeans(features=x, k=0, seed=0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_embeddings_are_a_data_error(blobs, bad):
    x, _ = blobs
    x = x.copy()
    x[7, 3] = bad
    with pytest.raises(DataError, match="learning rate") as info:
        kmeans(features=x, k=4, seed=0)
    assert "row 7" in str(info.value)


@pytest.mark.filterwarnings("ignore:overflow encountered")  # scikit-learn's k-means++ on values near 3e38
def test_huge_finite_embeddings_are_not_mistaken_for_non_finite(blobs):
    # Row sums of float32 values near the float32 maximum overflow to inf; the entries are still finite.
    x, _ = blobs
    x = x.copy()
    x[5, :] = 3e38
    x[6, :2] = [np.inf, -np.inf]  # inf - inf sums to NaN: still reported
    with pytest.raises(DataError, match=r"1 of 600 embedding rows .* \(e.g. row 6\)"):
        kmeans(features=x, k=4, seed=0, spherical=False)
    x[6, :2] = 0.0
    assert kmeans(features=x, k=4, seed=0, spherical=False).sizes.sum() == 600


def test_bad_shapes_and_gpu_request_without_gpu(blobs):
    x, _ = blobs
    with pytest.raises(DataError, match="shape"):
        kmeans(features=x[:, 0], k=2, seed=0)
    if faiss.get_num_gpus() == 0:
        with pytest.raises(ConfigError, match="faiss-gpu"):
            kmeans(features=x, k=4, seed=0, use_gpu=True)


def test_adjusted_mutual_information():
    a = np.array([0, 0, 1, 1, 2, 2])
    assert adjusted_mutual_information(a=a, b=np.array([5, 5, 3, 3, 9, 9])) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    independent = adjusted_mutual_information(a=rng.integers(0, 4, 4000), b=rng.integers(0, 4, 4000))
    assert abs(independent) < 0.01
    with pytest.raises(DataError, match="align"):
        adjusted_mutual_information(a=a, b=a[:3])


def test_save_and_load_roundtrip(tmp_path, blobs):
    x, _ = blobs
    result = kmeans(features=x, k=4, seed=7, spherical=False)
    ids = np.array([f"img_{i:05d}" for i in range(x.shape[0])])
    directory = tmp_path / "stage0" / "clusters"
    summary = save_clusters(result=result, ids=ids, directory=directory)

    assert sorted(p.name for p in directory.iterdir()) == ["assignments.npz", "centroids.npy", "summary.json"]
    assert json.loads((directory / "summary.json").read_text()) == summary
    assert summary["k"] == 4 and summary["seed"] == 7 and summary["num_points"] == x.shape[0]
    assert summary["sizes"] == result.sizes.tolist() and summary["empty_clusters"] == 0
    assert summary["inertia"] == pytest.approx(result.inertia)
    np.testing.assert_array_equal(np.load(directory / "centroids.npy"), result.centroids)

    loaded_ids, loaded = load_assignments(directory=directory)
    np.testing.assert_array_equal(loaded_ids, ids)
    np.testing.assert_array_equal(loaded, result.assignments)
    assert loaded.dtype == np.int64


def test_save_counts_empty_clusters_and_checks_ids(tmp_path):
    result = KMeansResult(
        assignments=np.array([0, 0, 2], dtype=np.int64), centroids=np.zeros((3, 2), np.float32),
        sizes=np.array([2, 0, 1], dtype=np.int64), inertia=0.5, k=3, seed=0,
    )
    summary = save_clusters(result=result, ids=np.array([10, 11, 12]), directory=tmp_path)
    assert summary["empty_clusters"] == 1
    ids, _ = load_assignments(directory=tmp_path)
    np.testing.assert_array_equal(ids, [10, 11, 12])
    with pytest.raises(DataError, match="ids"):
        save_clusters(result=result, ids=np.array([1, 2]), directory=tmp_path)


def test_load_missing_directory_says_to_rerun_clustering(tmp_path):
    with pytest.raises(DataError, match="re-run the clustering stage"):
        load_assignments(directory=tmp_path / "nope")


def test_sampled_kmeans_assigns_chunk_by_chunk_like_one_pass(blobs, monkeypatch):
    # After training on a sample the points are converted and assigned a chunk at a time (peak memory: a chunk,
    # not an (M, D) float32 copy); with tiny chunks the result must equal nearest-centroid assignment of all rows.
    import contrastive.mcl.clustering as clustering

    x, truth = blobs
    scaled = (x * np.random.default_rng(2).uniform(0.5, 4.0, size=(x.shape[0], 1))).astype(np.float16)
    original = scaled.copy()
    monkeypatch.setattr(clustering, "_ASSIGN_CHUNK", 64)
    result = kmeans(features=scaled, k=4, seed=0, spherical=True, max_train_points=200)
    np.testing.assert_array_equal(scaled, original)
    unit = scaled.astype(np.float32) / np.linalg.norm(scaled.astype(np.float32), axis=1, keepdims=True)
    np.testing.assert_array_equal(result.assignments, _sq_dist(unit, result.centroids).argmin(1))
    expected = ((unit.astype(np.float64) - result.centroids[result.assignments]) ** 2).sum()
    assert result.inertia == pytest.approx(expected, rel=1e-3)
    assert adjusted_mutual_information(a=result.assignments, b=truth) == pytest.approx(1.0, abs=1e-12)
    # A NaN outside the training sample and two chunks in is still found, counted over all rows and named.
    sample = set(clustering._training_rows(num_points=len(x), k=4, seed=0, max_train_points=200).tolist())
    late = [row for row in range(300, len(x)) if row not in sample][:2]
    broken = x.copy()
    broken[late] = np.nan
    with pytest.raises(DataError, match=rf"2 of 600 embedding rows .* \(e.g. row {late[0]}\)"):
        kmeans(features=broken, k=4, seed=0, spherical=False, max_train_points=200)


def test_kmeans_puts_its_index_on_the_named_gpus_only(blobs, monkeypatch):
    """faiss sees 4 GPUs: k-means takes only the devices it is given (faiss.Kmeans(gpu=True), or gpu=1, which
    faiss reads as True, would take all 4), none with use_gpu=False, and a GPU it cannot see is no GPU."""
    x, _ = blobs
    placed = []

    def to_gpus(index, gpus=None, **kwargs):
        placed.append(list(gpus))
        return index  # stays a CPU index, so the rest runs here
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 4)
    monkeypatch.setattr(faiss, "index_cpu_to_gpus_list", to_gpus, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda *a, **k: pytest.fail("every GPU taken"),
                        raising=False)
    on_one = kmeans(features=x, k=4, seed=0, spherical=False)
    assert placed == [[0]]
    kmeans(features=x, k=4, seed=0, spherical=False, gpu_devices=(2,))
    kmeans(features=x, k=4, seed=0, spherical=False, use_gpu=False)
    assert placed == [[0], [2]]
    with pytest.raises(ConfigError, match=r"neither faiss \(4 GPU\(s\)\) nor torch \(\d+ CUDA device\(s\)\) sees any of "
                                          r"\[7\]"):
        kmeans(features=x, k=4, seed=0, use_gpu=True, gpu_devices=(7,))
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)
    np.testing.assert_array_equal(kmeans(features=x, k=4, seed=0, spherical=False).assignments, on_one.assignments)


# ------------------------------------------------------------------ the helpers, against closed forms (mutants)
def test_the_inertia_is_the_sum_of_squared_distances_chunk_by_chunk(monkeypatch):
    from contrastive.mcl import clustering
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    centroids = rng.normal(size=(2, 3)).astype(np.float32)
    assignments = np.array([0, 1, 1, 0, 1])
    expected = float(((x.astype(np.float64) - centroids[assignments]) ** 2).sum())
    monkeypatch.setattr(clustering, "_ROW_CHUNK", 2)  # three chunks, the last one short
    scores = np.einsum("ij,ij->i", x, centroids[assignments])  # what the spherical (IP) index returns
    got = clustering._inertia(x=x, centroids=centroids, assignments=assignments, scores=scores, inner_product=True)
    assert got == pytest.approx(expected, rel=1e-6)
    assert clustering._inertia(x=x, centroids=centroids, assignments=assignments, inner_product=False,
                               scores=np.array([1.0, -1e-7, 2.0, 0.5, 0.0], np.float32)) == pytest.approx(3.5)


def test_rows_are_normalised_chunk_by_chunk_and_non_finite_rows_found_without_warnings(monkeypatch):
    import warnings

    from contrastive.mcl import clustering
    monkeypatch.setattr(clustering, "_ROW_CHUNK", 2)
    x = np.array([[3, 4], [0, 0], [1, 0], [0, 2], [6, 8]], dtype=np.float32)
    big = np.array([[3e38, 3e38], [np.inf, -np.inf], [1, np.nan], [1, 2]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflowing sum, inf - inf: expected here, so not reported
        clustering._l2_normalize_rows_(x)
        bad = clustering._non_finite_rows(big)
        inf_row = np.array([[np.inf, 1.0]], dtype=np.float32)
        clustering._l2_normalize_rows_(inf_row)
    np.testing.assert_allclose(x, [[0.6, 0.8], [0, 0], [1, 0], [0, 1], [0.6, 0.8]], rtol=1e-6)
    assert bad.dtype == bool and bad.tolist() == [False, True, True, False]
    assert np.isnan(inf_row).any()


def test_the_training_sample_edges_and_messages(tmp_path):
    import torch

    from contrastive.mcl.clustering import _placement, _training_rows, assignments_for
    assert _training_rows(num_points=5, k=2, seed=0, max_train_points=5) is None
    rows = _training_rows(num_points=10, k=3, seed=0, max_train_points=3)
    assert rows.tolist() == sorted(set(rows.tolist())) and len(rows) == 3  # at the limit k: distinct rows
    assert all(len(set(_training_rows(num_points=10, k=2, seed=s, max_train_points=8).tolist())) == 8
               for s in range(5))  # without replacement
    with pytest.raises(ConfigError) as refused:
        _training_rows(num_points=10, k=3, seed=0, max_train_points=2)
    assert str(refused.value) == ("max_train_points=2 is below k=3: k-means needs at least one training point per "
                                  "cluster; raise it (or leave it unset to train on every point).")
    with pytest.raises(ConfigError) as refused:
        _placement(True, gpu_devices=())
    assert str(refused.value) == "use_gpu=True but no GPU was given to k-means (gpu_devices is empty: device=cpu)"
    if not torch.cuda.is_available():  # a GPU that neither faiss (CPU build) nor torch sees
        with pytest.raises(ConfigError) as refused:
            _placement(True, gpu_devices=(0,))
        assert str(refused.value).endswith("or install faiss-gpu: docs/gpu.md), or set use_gpu to false/auto.")
    (tmp_path / "assignments.npz").write_bytes(b"not an npz")
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(DataError) as refused:
        assignments_for(directory=tmp_path, ids=np.array(["a"]))
    assert str(refused.value).startswith(f"{tmp_path / 'assignments.npz'} is corrupt or not a cluster file (")
    assert str(refused.value).endswith("); re-run the clustering stage.")


def test_loading_clusters_needs_both_files_and_matching_lengths_and_ami_flattens(tmp_path):
    from contrastive.mcl.clustering import ASSIGNMENTS_FILE, SUMMARY_FILE, load_assignments
    np.savez(tmp_path / ASSIGNMENTS_FILE, ids=np.arange(3), assignments=np.zeros(2, dtype=np.int64))
    with pytest.raises(DataError) as refused:
        load_assignments(directory=tmp_path)  # no summary: an interrupted save
    assert str(refused.value) == (f"no complete clustering in {tmp_path} (missing {ASSIGNMENTS_FILE} or "
                                  f"{SUMMARY_FILE}); re-run the clustering stage.")
    (tmp_path / SUMMARY_FILE).write_text("{}")
    with pytest.raises(DataError) as refused:
        load_assignments(directory=tmp_path)
    assert str(refused.value) == (f"{tmp_path / ASSIGNMENTS_FILE} holds 3 ids but 2 assignments; re-run "
                                  "clustering.")
    a = np.array([[0, 0, 1], [1, 2, 2]])
    b = np.array([[1, 1, 0], [0, 2, 0]])
    assert adjusted_mutual_information(a=a, b=b) == pytest.approx(
        adjusted_mutual_information(a=a.ravel(), b=b.ravel()))
    with pytest.raises(DataError) as refused:
        adjusted_mutual_information(a=np.zeros(3), b=np.zeros(2))
    assert str(refused.value) == ("cannot compare clusterings of 3 and 2 samples; align both to the same sample "
                                  "ids first (align_labels_to_ids).")


def test_the_summary_s_fields_object_ids_and_the_feature_checks_messages(tmp_path):
    from contrastive.mcl.clustering import KMeansResult, _validated_features, assignments_for, save_clusters
    result = KMeansResult(assignments=np.array([0, 0, 3]), centroids=np.zeros((4, 2), np.float32),
                          sizes=np.array([2, 0, 0, 1]), inertia=1.5, k=4, seed=4, spherical=True, backend="faiss-cpu")
    summary = save_clusters(result=result, ids=np.array(["a", "b", "c"], dtype=object), directory=tmp_path)
    assert summary == {"k": 4, "sizes": [2, 0, 0, 1], "inertia": 1.5, "seed": 4, "spherical": True,
                       "num_points": 3, "empty_clusters": 2, "backend": "faiss-cpu"}
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "summary.json").read_text().startswith('{\n  "k": 4,')  # indented for a reader
    assert assignments_for(directory=tmp_path, ids=np.array(["c", "a"])).tolist() == [3, 0]
    (tmp_path / "summary.json").unlink()  # an interrupted save: the assignments alone are not read
    with pytest.raises(DataError, match="no complete clustering"):
        assignments_for(directory=tmp_path, ids=np.array(["a", "b", "c"]))
    with pytest.raises(DataError) as refused:
        save_clusters(result=result, ids=np.array(["a"]), directory=tmp_path)
    assert str(refused.value) == ("1 ids for 3 assignments; pass the sample ids exported with the embeddings that "
                                  "were clustered.")
    # a disk full at any of its writes: test_a_disk_full_at_any_write_names_that_file_and_leaves_no_summary
    assert _validated_features(features=np.zeros((2, 1)), k=1).shape == (2, 1)  # one dimension, one cluster
    assert _validated_features(features=np.zeros((1, 3)), k=1).shape == (1, 3)  # one point
    for features, k, message in [
            (np.zeros((0, 3)), 1, "features must be a non-empty (M, D) array, got shape (0, 3)."),
            (np.zeros((3, 0)), 1, "features must be a non-empty (M, D) array, got shape (3, 0)."),
            (np.array([["a"]]), 1, "features must be numeric, got dtype <U1."),
            (np.zeros((2, 2)), 3, "k=3 clusters for 2 points: k must be in [1, 2]; lower k (MCL also needs K^N <= "
                                  "M / batch_size so every cluster can fill a batch).")]:
        with pytest.raises((DataError, ConfigError)) as refused:
            _validated_features(features=features, k=k)
        assert str(refused.value) == message


def test_rows_are_float32_c_contiguous_viewed_where_they_can_be_and_faiss_runs_the_iterations_asked():
    """``_unit_float32``: float32, C order, a view of float32 C rows when not normalising (no copy of M x D);
    ``_train_faiss`` with niter=1 is one Lloyd step from the given seeds (assign, then average)."""
    from contrastive.mcl.clustering import _train_faiss, _unit_float32
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.shares_memory(_unit_float32(rows, spherical=False), rows)
    transposed = _unit_float32(np.arange(12, dtype=np.float64).reshape(4, 3).T, spherical=False)
    assert transposed.dtype == np.float32 and transposed.flags.c_contiguous
    x = np.array([[0, 0], [1, 0], [2, 0], [10, 0]], dtype=np.float32)
    seeds = np.array([[0, 0], [1, 0]], dtype=np.float32)  # a second step would move both: [1, 0], [10, 0]
    centroids, _ = _train_faiss(train_x=x, init_centroids=seeds, k=2, niter=1, seed=0, spherical=False, devices=())
    np.testing.assert_allclose(centroids, [[0, 0], [13 / 3, 0]], rtol=1e-6)


@pytest.mark.parametrize("full_at, file_named", [(1, "assignments.npz"), (2, "centroids.npy"), (3, "summary.json")])
def test_a_disk_full_at_any_write_names_that_file_and_leaves_no_summary(tmp_path, monkeypatch, full_at, file_named):
    """The summary is written last, so its presence means a complete clustering: a disk that fills at the
    assignments', the centroids' or the summary's own write is named in one line (which file of a clustering), no
    summary and no temporary file are left, and the clustering stage's rerun is not misled by the earlier files."""
    import errno

    from contrastive.engine import files
    from contrastive.errors import DiskFullError
    result = KMeansResult(assignments=np.array([0, 1, 1]), centroids=np.eye(2, dtype=np.float32),
                          sizes=np.array([1, 2]), inertia=0.5, k=2, seed=0, spherical=True, backend="faiss-cpu")
    fsync, calls = files.os.fsync, []

    def fills_at_the_chosen_write(fd):
        calls.append(fd)
        if len(calls) == full_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)
    monkeypatch.setattr(files.os, "fsync", fills_at_the_chosen_write)
    with pytest.raises(DiskFullError, match=rf"while writing a clustering \({file_named}\)"):
        save_clusters(result=result, ids=np.array(["a", "b", "c"]), directory=tmp_path)
    assert not (tmp_path / "summary.json").exists() and not list(tmp_path.glob("*.tmp*"))
    with pytest.raises(DataError, match="no complete clustering"):
        load_assignments(directory=tmp_path)
