"""STL-10 from tiny files in the binary release's layout (column-major 96 x 96 x 3 images, 1-based labels)."""
import numpy as np
import pytest

from contrastive.data.loading import load_dataset
from contrastive.modalities.image.datasets.stl10 import prepare_stl10, read_images
from contrastive.errors import DataError


def write_stl10(root, *, n_train=4, n_test=3, n_unlabeled=5, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    truth = {}
    for name, n in (("train", n_train), ("test", n_test), ("unlabeled", n_unlabeled)):
        images = rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)  # (H, W, C)
        # The file stores each image as (C, W, H) in C order, i.e. every channel column-major.
        images.transpose(0, 3, 2, 1).tofile(folder / f"{name}_X.bin")
        truth[name] = images
        if name != "unlabeled":
            labels = rng.integers(1, 11, n).astype(np.uint8)
            labels.tofile(folder / f"{name}_y.bin")
            truth[name + "_y"] = labels.astype(np.int64) - 1
    (folder / "class_names.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    return truth


def test_reader_undoes_the_column_major_layout(tmp_path):
    truth = write_stl10(tmp_path)
    np.testing.assert_array_equal(read_images(tmp_path / "stl10_binary" / "test_X.bin"), truth["test"])
    np.testing.assert_array_equal(read_images(tmp_path / "stl10_binary" / "unlabeled_X.bin", start=2, count=2),
                                  truth["unlabeled"][2:4])


def test_unlabeled_train_and_test_splits(tmp_path):
    truth = write_stl10(tmp_path)
    ds = load_dataset(prepare_stl10(source=tmp_path, root=tmp_path / "cache"), verify_digest=True)
    assert len(ds) == 12 and ds.class_names["class"] == [f"c{i}" for i in range(10)]
    train, test = ds.indices("train"), ds.indices("test")
    assert [str(i) for i in ds.ids[train]] == [f"unlabeled-{i:06d}" for i in range(5)] + \
        [f"train-{i:06d}" for i in range(4)]
    np.testing.assert_array_equal(ds.images[train[:5]], truth["unlabeled"])
    np.testing.assert_array_equal(ds.labels["class"][train], [-1] * 5 + truth["train_y"].tolist())
    np.testing.assert_array_equal(ds.images[test], truth["test"])
    np.testing.assert_array_equal(ds.labels["class"][test], truth["test_y"])
    small = load_dataset(prepare_stl10(source=tmp_path / "stl10_binary", root=tmp_path / "cache", max_unlabeled=2))
    assert len(small.indices("train")) == 6
    labelled = load_dataset(prepare_stl10(source=tmp_path, root=tmp_path / "cache", use_unlabeled=False))
    assert len(labelled) == 7


def test_missing_and_truncated_files(tmp_path):
    with pytest.raises(DataError, match=r"stanford.*--set data.stl10.root"):
        prepare_stl10(source=tmp_path, root=tmp_path / "cache")
    write_stl10(tmp_path)
    with open(tmp_path / "stl10_binary" / "test_X.bin", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(DataError, match="truncated"):
        prepare_stl10(source=tmp_path, root=tmp_path / "cache")
