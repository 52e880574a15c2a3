"""The steps between stages, for every modality: k-means per stage and pseudo-labels combining ALL earlier stages,
by sample key; restricted to a subset of the exported samples (a training split) with attributes to compare."""
import numpy as np
import pytest

from contrastive.mcl.steps import KMeansSpec, build_pseudo_labels, cluster_stage
from contrastive.embeddings import save_embeddings


def test_pseudo_labels_combine_every_earlier_stage_by_key(tmp_path):
    rng = np.random.default_rng(0)
    keys = np.array([f"{i:09d}" for i in range(60)])
    # Stage 0 separates on the first coordinate, stage 1 on the second: 4 combined groups of 15.
    first, second = np.repeat([0, 1], 30), np.tile(np.repeat([0, 1], 15), 2)
    features = [np.c_[first * 10 + rng.normal(0, 0.1, 60), rng.normal(0, 0.1, (60, 3))],
                np.c_[second * 10 + rng.normal(0, 0.1, 60), rng.normal(0, 0.1, (60, 3))]]
    exports, clusters = [], []
    for stage, x in enumerate(features):
        order = rng.permutation(60)  # each export lists the samples in its own order: labels must follow keys
        save_embeddings(embeddings=x[order] + 1.0, ids=keys[order], directory=tmp_path / f"emb{stage}")
        exports.append(str(tmp_path / f"emb{stage}"))
        clusters.append(str(tmp_path / f"clu{stage}"))
        summary = cluster_stage(embeddings_dir=exports[-1], out_dir=clusters[-1],
                                kmeans_spec=KMeansSpec(k=2, seed=0, niter=10, spherical=False),
                                earlier_cluster_dirs=clusters[:-1])
        assert sorted(summary["sizes"]) == [30, 30]
    assert abs(summary["ami"]["stage_0"]) < 0.2  # stage 1's clusters differ from stage 0's
    stats = build_pseudo_labels(cluster_dirs=clusters, embeddings_dirs=exports, out_path=str(tmp_path / "p.npz"),
                                min_group_size=8, small_group_policy="merge_nearest")
    assert stats["num_groups"] == 4 and stats["stages_combined"] == 2 and stats["small_groups"] == 0
    stored = np.load(tmp_path / "p.npz")
    truth = dict(zip(keys.tolist(), (2 * first + second).tolist()))
    pairs = {(truth[k], int(g)) for k, g in zip(stored["ids"].tolist(), stored["groups"].tolist())}
    assert len(pairs) == 4  # the groups are exactly the (stage 0, stage 1) combinations


def test_a_subset_of_samples_is_clustered_and_compared_with_its_attributes(tmp_path):
    rng = np.random.default_rng(1)
    keys = np.array([f"s{i}" for i in range(40)])
    attribute = np.repeat([0, 1], 20)
    x = np.c_[attribute * 10 + rng.normal(0, 0.1, 40), rng.normal(0, 0.1, (40, 2))] + 1.0
    save_embeddings(embeddings=x, ids=keys, directory=tmp_path / "emb")
    train = keys[::2][::-1]  # the training split, in its own order
    summary = cluster_stage(embeddings_dir=tmp_path / "emb", out_dir=tmp_path / "clu",
                            kmeans_spec=KMeansSpec(k=2, seed=0, spherical=False), earlier_cluster_dirs=[],
                            ids=train, attributes={"side": attribute[::2][::-1]})
    assert sum(summary["sizes"]) == 20 and summary["ami"]["attr_side"] > 0.99
    stats = build_pseudo_labels(cluster_dirs=[tmp_path / "clu"], embeddings_dirs=[tmp_path / "emb"],
                                out_path=tmp_path / "p.npz", min_group_size=4, small_group_policy="none", ids=train)
    stored = np.load(tmp_path / "p.npz")
    assert stats["samples"] == 20 and stored["ids"].tolist() == train.tolist()


def test_pseudo_labels_read_the_embeddings_only_when_a_group_must_be_merged(tmp_path, monkeypatch):
    """merge_nearest needs the stages' embeddings (M x D per stage, float32) only for groups smaller than a batch;
    with none, the step holds the ids and labels alone (bench/scale.py measured it growing with M x D before)."""
    import contrastive.mcl.steps as steps

    rng = np.random.default_rng(2)
    keys = np.array([f"k{i}" for i in range(40)])
    x = np.c_[np.repeat([0, 10], [30, 10]) + rng.normal(0, 0.1, 40), rng.normal(0, 0.1, (40, 2))] + 1.0
    save_embeddings(embeddings=x, ids=keys, directory=tmp_path / "emb")
    cluster_stage(embeddings_dir=tmp_path / "emb", out_dir=tmp_path / "clu",
                  kmeans_spec=KMeansSpec(k=2, seed=0, spherical=False), earlier_cluster_dirs=[])
    loads = []
    real = steps.embeddings_for
    monkeypatch.setattr(steps, "embeddings_for", lambda **kw: loads.append(kw) or real(**kw))
    common = {"cluster_dirs": [tmp_path / "clu"], "embeddings_dirs": [tmp_path / "emb"],
              "small_group_policy": "merge_nearest"}
    stats = build_pseudo_labels(**common, out_path=tmp_path / "a.npz", min_group_size=10)
    assert stats["small_groups"] == 0 and stats["num_groups"] == 2 and loads == []
    stats = build_pseudo_labels(**common, out_path=tmp_path / "b.npz", min_group_size=31)  # both small: one group
    assert stats["small_groups"] == 2 and stats["num_groups"] == 1 and loads == []
    stats = build_pseudo_labels(**common, out_path=tmp_path / "c.npz", min_group_size=20)  # 10 merged into 30
    assert stats["small_groups"] == 1 and stats["num_groups"] == 1 and len(loads) == 1


def test_pseudo_labels_hold_the_ids_and_labels_but_not_the_embeddings_nor_a_second_id_table(tmp_path):
    """Peak traced memory of the step with no group to merge: one id table ((M,) <U9, 36 B a sample) and a few
    (M,) int64 label arrays, not the export's (M, D) embeddings (loaded once for its ids: 220 MiB at M = 1M, D = 32,
    where 49 MiB remain) nor the clusters' copy of the ids (compared as they are read)."""
    import tracemalloc

    from contrastive.mcl.clustering import KMeansResult, save_clusters
    m, d = 100_000, 64
    keys = np.array([f"{i:09d}" for i in range(m)])
    save_embeddings(embeddings=np.zeros((m, d), np.float16), ids=keys, directory=tmp_path / "emb")
    labels = np.arange(m) % 4
    save_clusters(result=KMeansResult(assignments=labels, centroids=np.zeros((4, d), np.float32), inertia=0.0, k=4, sizes=np.bincount(labels),
                                      seed=0), ids=keys, directory=tmp_path / "clu")
    id_bytes = keys.nbytes
    del keys, labels
    tracemalloc.start()
    try:
        build_pseudo_labels(cluster_dirs=[tmp_path / "clu"], embeddings_dirs=[tmp_path / "emb"],
                            out_path=tmp_path / "p.npz", min_group_size=8, small_group_policy="merge_nearest")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # ids, plus numpy's copy of them while np.savez writes (its chunks are up to 16 MiB), plus a few (M,) int64:
    # 11.9 MB; the embeddings as float32 alone are 4 * d * m = 25.6 MB
    assert peak < 2 * id_bytes + 6 * 8 * m, (peak, id_bytes)


def test_assignments_for_reads_in_the_given_order_whether_or_not_the_file_lists_the_ids_alike(tmp_path):
    from contrastive.errors import DataError
    from contrastive.mcl.clustering import KMeansResult, assignments_for, save_clusters
    keys = np.array([f"s{i}" for i in range(50)])
    labels = np.arange(50) % 3
    save_clusters(result=KMeansResult(assignments=labels, centroids=np.zeros((3, 2), np.float32), inertia=0.0, k=3, sizes=np.bincount(labels),
                                      seed=0), ids=keys, directory=tmp_path)
    np.testing.assert_array_equal(assignments_for(directory=tmp_path, ids=keys), labels)  # same order
    order = np.random.default_rng(0).permutation(50)
    np.testing.assert_array_equal(assignments_for(directory=tmp_path, ids=keys[order]), labels[order])
    np.testing.assert_array_equal(assignments_for(directory=tmp_path, ids=keys[:7]), labels[:7])  # a subset
    wide = keys.astype("<U12")  # the same ids in another width: compared after loading, not as bytes
    np.testing.assert_array_equal(assignments_for(directory=tmp_path, ids=wide), labels)
    with pytest.raises(DataError, match="have no label"):
        assignments_for(directory=tmp_path, ids=np.array(["s1", "nope"]))
    (tmp_path / "assignments.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="corrupt"):
        assignments_for(directory=tmp_path, ids=keys)


def _dataset_ids(m: int) -> np.ndarray:
    """(m,) ids as a prepared dataset holds them: StringDType paths of 30 characters."""
    return np.asarray([f"class_{i % 7}/image_{i:012d}.jpg" for i in range(m)], dtype=np.dtypes.StringDType())


def test_pseudo_labels_of_a_datasets_ids_are_written_and_read_without_a_u_copy_of_them(tmp_path):
    """The training split's ids as the dataset holds them (StringDType): clusters and pseudo-labels are written
    without pickle (<U on disk, as every version wrote them), and reading them back for the same ids compares the
    file's ids a chunk at a time: no (M,) <U table (120 B a sample here) is held."""
    import tracemalloc

    from contrastive.mcl.clustering import KMeansResult, save_clusters
    from contrastive.mcl.steps import load_pseudo_labels
    m = 300_000
    ids = _dataset_ids(m)
    labels = np.arange(m) % 4
    save_embeddings(embeddings=np.zeros((m, 2), np.float16), ids=ids, directory=tmp_path / "emb")
    save_clusters(result=KMeansResult(assignments=labels, centroids=np.zeros((4, 2), np.float32), inertia=0.0, k=4,
                                      sizes=np.bincount(labels), seed=0), ids=ids, directory=tmp_path / "clu")
    u_table = m * 4 * 30
    tracemalloc.start()
    try:
        build_pseudo_labels(cluster_dirs=[tmp_path / "clu"], embeddings_dirs=[tmp_path / "emb"], ids=ids,
                            out_path=tmp_path / "p.npz", min_group_size=8, small_group_policy="merge_nearest")
        written = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        groups = load_pseudo_labels(path=tmp_path / "p.npz", ids=ids)
        read = tracemalloc.get_traced_memory()[1] - tracemalloc.get_traced_memory()[0] + groups.nbytes
    finally:
        tracemalloc.stop()
    with np.load(tmp_path / "p.npz", allow_pickle=False) as stored:
        assert stored["ids"].dtype == np.dtype("<U30") and stored["ids"].tolist() == ids.tolist()
    with np.load(tmp_path / "clu" / "assignments.npz", allow_pickle=False) as stored:
        assert stored["ids"].dtype == np.dtype("<U30")
    assert np.bincount(groups).tolist() == [m // 4] * 4 and (groups == labels).all()
    assert written < u_table / 2 and read < u_table / 3, (written, read, u_table)


def test_pseudo_labels_listed_in_another_order_are_joined_by_id(tmp_path, monkeypatch):
    from contrastive.mcl import steps
    from contrastive.data.dataset import save_index
    ids = _dataset_ids(40)
    order = np.random.default_rng(0).permutation(40)
    save_index(tmp_path / "p.npz", {"ids": ids[order], "groups": order % 5})
    assert steps.load_pseudo_labels(path=tmp_path / "p.npz", ids=ids).tolist() == (np.arange(40) % 5).tolist()
    save_index(tmp_path / "q.npz", {"ids": ids, "groups": np.arange(40) % 3})
    monkeypatch.setattr(steps, "align_labels_to_ids", None)  # the same ids in the same order: no join
    assert steps.load_pseudo_labels(path=tmp_path / "q.npz", ids=ids).tolist() == (np.arange(40) % 3).tolist()
