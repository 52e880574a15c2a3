"""CelebA from tiny files in the official layout; the three attributes come out independent and balanced."""
import itertools

import numpy as np
import pytest
from PIL import Image

from contrastive.modalities.image.datasets.celeba import balanced_rows, prepare_celeba
from contrastive.data.loading import load_dataset
from contrastive.errors import ConfigError, DataError

ALL = ["5_o_Clock_Shadow", "Black_Hair", "Male", "Smiling", "Young"]


def write_celeba(root, *, n=120, seed=0):
    """img_align_celeba/ (178 x 218 JPEGs whose colour encodes the row), list_attr_celeba.txt, list_eval_partition.txt
    with correlated attributes (male -> more often black hair) so the resampling has work to do."""
    rng = np.random.default_rng(seed)
    (root / "img_align_celeba").mkdir(parents=True)
    male = rng.random(n) < 0.5
    black = rng.random(n) < np.where(male, 0.7, 0.3)
    smiling = rng.random(n) < 0.5
    values = np.where(rng.random((n, len(ALL))) < 0.5, 1, -1)
    values[:, 1], values[:, 2], values[:, 3] = np.where(black, 1, -1), np.where(male, 1, -1), np.where(smiling, 1, -1)
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    for i, name in enumerate(names):
        Image.new("RGB", (178, 218), (i % 256, 100, 50)).save(root / "img_align_celeba" / name, quality=95)
    lines = [str(n), " ".join(ALL)] + [f"{name} " + " ".join(f"{v:2d}" for v in row)
                                       for name, row in zip(names, values)]
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    partition = np.where(np.arange(n) < int(n * 0.6), 0, np.where(np.arange(n) < int(n * 0.7), 1, 2))
    (root / "list_eval_partition.txt").write_text("".join(f"{m} {p}\n" for m, p in zip(names, partition)))
    return names, values, partition


def test_balanced_rows_keeps_the_rarest_count_of_every_code():
    codes = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3])
    rows = balanced_rows(codes, num_codes=4, rng=np.random.default_rng(0))
    assert np.bincount(codes[rows], minlength=4).tolist() == [2, 2, 2, 2]
    capped = balanced_rows(codes, num_codes=4, rng=np.random.default_rng(0), cap=1)
    assert np.bincount(codes[capped], minlength=4).tolist() == [1, 1, 1, 1]


def test_resampled_attributes_are_independent_and_balanced(tmp_path):
    names, values, partition = write_celeba(tmp_path / "celeba")
    path = prepare_celeba(source=tmp_path, root=tmp_path / "cache", image_size=32)  # the parent folder works too
    ds = load_dataset(path, verify_digest=True)
    assert ds.attributes == ["Black_Hair", "Male", "Smiling"] and ds.images.shape[1:] == (32, 32, 3)
    for split in ("train", "test"):
        rows = ds.indices(split)
        combos = [tuple(int(ds.labels[a][r]) for a in ds.attributes) for r in rows]
        counts = {c: combos.count(c) for c in itertools.product([0, 1], repeat=3)}
        assert len(set(counts.values())) == 1 and min(counts.values()) >= 1, counts  # uniform joint: independent
    for row in range(len(ds)):
        i = names.index(str(ds.ids[row]))
        assert ds.split[row] == ("test" if partition[i] == 2 else "train")
        assert ds.labels["Male"][row] == (values[i, 2] > 0)
        assert abs(int(ds.images[row, 16, 16, 0]) - i % 256) <= 3  # the pixels are that file's (JPEG rounding)


def test_without_resampling_every_image_is_kept(tmp_path):
    write_celeba(tmp_path)
    path = prepare_celeba(source=tmp_path, root=tmp_path / "cache", image_size=16, resample=False,
                          attributes=["Young"])
    assert len(load_dataset(path)) == 120


def test_errors_name_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"mmlab.*--set data.celeba.root"):
        prepare_celeba(source=tmp_path, root=tmp_path / "cache")
    write_celeba(tmp_path, n=16)
    with pytest.raises(ConfigError, match="Blond"):
        prepare_celeba(source=tmp_path, root=tmp_path / "cache", attributes=["Blond"])
