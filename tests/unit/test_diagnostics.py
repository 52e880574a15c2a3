"""Embedding diagnostics against closed forms, and one stage's directories end to end."""
import json
import math

import numpy as np
import pytest
import torch

from contrastive import diagnostics as d
from contrastive.modalities.image.diagnostics import diagnose_stage


def test_pair_samplers_respect_groups():
    rng = np.random.default_rng(0)
    groups = np.array([0, 0, 0, 1, 1, 2, -1, -1])  # group 2 is a singleton; -1 unknown
    i, j = d.same_group_pairs(groups=groups, num_pairs=500, rng=rng)
    assert (i != j).all() and (groups[i] == groups[j]).all() and set(groups[i]) == {0, 1}
    assert {(a, b) for a, b in zip(i, j)} == {(a, b) for a in range(5) for b in range(5)
                                              if a != b and groups[a] == groups[b]}
    i, j = d.other_group_pairs(groups=groups, num_pairs=500, rng=rng)
    assert len(i) == 500 and (groups[i] != groups[j]).all() and (groups[i] >= 0).all() and (groups[j] >= 0).all()
    i, j = d.random_pairs(n=3, num_pairs=100, rng=rng)
    assert (i != j).all()


def test_closed_forms():
    assert math.isclose(d.effective_rank(np.outer(np.arange(1, 6), np.ones(4))), 1.0, rel_tol=1e-6)
    assert math.isclose(d.effective_rank(np.eye(6)), 6.0, rel_tol=1e-6)
    x = np.random.default_rng(1).normal(size=(10, 3))
    assert d.alignment(view1=x, view2=2 * x) < 1e-10  # same direction: perfectly aligned
    assert math.isclose(d.alignment(view1=x, view2=-x), 4.0, rel_tol=1e-6)  # antipodal: ||a - b||^2 = 4
    unit = np.array([[1.0, 0.0], [-1.0, 0.0]], dtype=np.float32)
    assert math.isclose(d.uniformity(unit=unit, i=np.array([0]), j=np.array([1])), -8.0, rel_tol=1e-6)
    assert d.rank_auc(positives=np.array([0.9, 0.8]), negatives=np.array([0.1, 0.2, 0.3])) == 1.0
    assert d.rank_auc(positives=np.array([0.5]), negatives=np.array([0.5])) == 0.5


def test_diagnose_separated_groups_and_plot(tmp_path):
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(4, 16)) * 5
    labels = np.repeat(np.arange(4), 50)
    x = centres[labels] + rng.normal(size=(200, 16))
    diagnosis = d.diagnose_embeddings(embeddings=x, groupings={"cluster": labels, "noise": rng.integers(0, 4, 200)},
                                      views=(x, x + 0.01), num_pairs=2_000)
    m = diagnosis.metrics
    assert m["diag/cluster/auc"] > 0.95 and m["diag/cluster/gap"] > 0.5
    assert abs(m["diag/noise/auc"] - 0.5) < 0.1  # labels unrelated to the geometry
    assert m["diag/alignment"] < 1e-3 and 1 < m["diag/effective_rank"] <= 16 and m["diag/uniformity"] < 0
    assert abs(m["diag/anisotropy"] - np.mean(diagnosis.random_cosines)) < 1e-9
    path = d.plot_similarity_histograms(diagnosis=diagnosis, path=tmp_path / "sim.png", title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"


def _tiny_exported_stage(tmp_path, *, image_size):
    """A tiny Trifeature set, an untrained SimCLR model saved as a stage's model.pt, and its export in
    tmp_path / "emb": what diagnose_stage reads of a finished stage. Returns (dataset_dir, dataset)."""
    from contrastive.data.dataset import ImageArrayDataset
    from contrastive.embeddings import save_embeddings
    from contrastive.methods import build_method
    from contrastive.modalities.image.datasets.trifeature import prepare_trifeature

    dataset_dir = prepare_trifeature(root=tmp_path / "data", num_train=48, num_test=16, image_size=image_size,
                                     num_colors=2, num_shapes=2, num_textures=2)
    dataset = ImageArrayDataset.load(dataset_dir)
    model_kwargs = dict(encoder="small_cnn", widths=[4, 8], projection_hidden=8, projection_dim=4)
    method_kwargs = {"name": "simclr", "temperature": 0.5}
    method = build_method(model_kwargs=model_kwargs, method_kwargs=method_kwargs).eval()
    torch.save({"state_dict": method.state_dict(), "model_kwargs": model_kwargs, "method_kwargs": method_kwargs},
               tmp_path / "model.pt")
    with torch.no_grad():
        embeddings = method.embed(dataset.get_batch(np.arange(len(dataset))).float() / 255).numpy()
    save_embeddings(embeddings=embeddings, ids=dataset.ids, directory=tmp_path / "emb")
    return dataset_dir, dataset


def test_diagnose_stage_reads_a_stage(tmp_path):
    from contrastive.mcl.clustering import KMeansResult, save_clusters

    dataset_dir, dataset = _tiny_exported_stage(tmp_path, image_size=16)
    train = dataset.indices("train")
    assignments = np.arange(len(train)) % 3
    save_clusters(result=KMeansResult(assignments=assignments, centroids=np.zeros((3, 8), np.float32),
                                      sizes=np.bincount(assignments), inertia=0.0, k=3, seed=0),
                  ids=dataset.ids[train], directory=tmp_path / "clusters")
    result = diagnose_stage(dataset_dir=dataset_dir, embeddings_dir=tmp_path / "emb", out_dir=tmp_path / "out",
                              clusters_dir=tmp_path / "clusters", model_path=tmp_path / "model.pt",
                              augment_kwargs=dict(crop_scale=(0.3, 1.0), crop_ratio=(0.75, 1.33), hflip=False,
                                                  color_jitter=0.0), num_pairs=500, alignment_samples=20)
    metrics = result["metrics"]
    expected = {"diag/color/auc", "diag/shape/gap", "diag/clusters/auc", "diag/alignment", "diag/effective_rank"}
    assert expected <= set(metrics)
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == metrics
    assert (tmp_path / "out" / "similarity.png").exists()

    # Encoded as the export encodes (the stage's precision and memory format): the same alignment up to bf16's
    # rounding, and bf16 does run (autocast's bf16 convolutions round differently from fp32's)
    as_exported = diagnose_stage(dataset_dir=dataset_dir, embeddings_dir=tmp_path / "emb", out_dir=tmp_path / "bf16",
                                 clusters_dir=tmp_path / "clusters", model_path=tmp_path / "model.pt",
                                 augment_kwargs=dict(crop_scale=(0.3, 1.0), crop_ratio=(0.75, 1.33), hflip=False,
                                                     color_jitter=0.0), num_pairs=500, alignment_samples=20,
                                 precision="bf16", channels_last=True)["metrics"]
    assert as_exported["diag/alignment"] == pytest.approx(metrics["diag/alignment"], rel=0.05, abs=1e-3)
    assert as_exported["diag/alignment"] != metrics["diag/alignment"]
    assert as_exported["diag/color/auc"] == metrics["diag/color/auc"]  # from the export's embeddings, not re-encoded


def test_diagnose_stage_in_bf16_augments_views_with_blur_outside_autocast(tmp_path):
    """The photos preset's augmentation (blur_p 0.5) under bf16 autocast: the blur's convolutions returned bf16
    into the float32 batch (RuntimeError in `mclpipe plan photos` on an AVX512-BF16 CPU); views are augmented in
    float32 and only the encoder runs in bf16, so the bf16 alignment is the fp32 one up to bf16's rounding."""
    dataset_dir, _ = _tiny_exported_stage(tmp_path, image_size=32)
    augment = dict(crop_scale=(0.3, 1.0), crop_ratio=(0.75, 1.33), hflip=True, color_jitter=0.4, blur_p=0.5)
    alignment = {precision: diagnose_stage(dataset_dir=dataset_dir, embeddings_dir=tmp_path / "emb",
                                           out_dir=tmp_path / precision, model_path=tmp_path / "model.pt",
                                           augment_kwargs=augment, num_pairs=200, alignment_samples=20,
                                           precision=precision)["metrics"]["diag/alignment"]
                 for precision in ("fp32", "bf16")}
    assert alignment["bf16"] == pytest.approx(alignment["fp32"], rel=0.05, abs=1e-3)
