"""Trifeature balanced as Hermann & Lampinen: every shape x texture x colour equally often in both splits."""
import numpy as np

from contrastive.data.loading import load_dataset
from contrastive.modalities.image.datasets.trifeature_paper import balanced_labels, prepare_trifeature_paper


def test_balanced_labels_cover_every_combination_equally():
    labels = balanced_labels(per_combination=3, rng=np.random.default_rng(0))
    codes = labels["color"] * 100 + labels["shape"] * 10 + labels["texture"]
    assert np.bincount(codes, minlength=1000).tolist() == [3] * 1000


def test_prepared_dataset_is_balanced_per_split(tmp_path):
    path = prepare_trifeature_paper(root=tmp_path, per_combination=1, test_per_combination=1, image_size=16)
    ds = load_dataset(path, verify_digest=True)
    assert len(ds.indices("train")) == 1000 and len(ds.indices("test")) == 1000
    for split in ("train", "test"):
        rows = ds.indices(split)
        codes = ds.labels["color"][rows] * 100 + ds.labels["shape"][rows] * 10 + ds.labels["texture"][rows]
        assert sorted(codes.tolist()) == list(range(1000))
    # The colour label is the colour drawn: red images are redder than blue ones on average.
    red, blue = ds.labels["color"] == 0, ds.labels["color"] == 2
    assert ds.images[red][..., 0].mean() > ds.images[blue][..., 0].mean() + 10
    assert prepare_trifeature_paper(root=tmp_path, per_combination=1, test_per_combination=1, image_size=16) == path
