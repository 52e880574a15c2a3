"""The feature dataset: the user's files in their on-disk layout (an .npy, ids, a labels CSV), the synthetic set,
and the messages for the mistakes a user makes with them."""
import numpy as np
import pytest

from contrastive.data.dataset import params_hash
from contrastive.errors import DataError
from contrastive.modalities.embeddings.data import (load_feature_dataset, prepare_feature_files, prepare_synthetic,
                                                    synthetic_features)


def _files(tmp_path, *, n=40, dim=6):
    features = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float64)
    np.save(tmp_path / "features.npy", features)
    (tmp_path / "ids.txt").write_text("".join(f"img_{i:03d}\n" for i in range(n)))
    rows = ["id,colour,size"] + [f"img_{i:03d},{'red' if i % 2 else 'blue'},{'' if i % 5 == 0 else 'big'}"
                                 for i in range(n)]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    return features


def test_user_files_become_a_dataset_keyed_by_id(tmp_path):
    features = _files(tmp_path)
    path = prepare_feature_files(root=tmp_path / "cache", features_path=tmp_path / "features.npy",
                                 ids_path=tmp_path / "ids.txt", labels_path=tmp_path / "labels.csv",
                                 test_fraction=0.25, seed=0)
    dataset = load_feature_dataset(path)
    assert dataset.features.dtype == np.float32 and dataset.dim == 6
    np.testing.assert_allclose(dataset.features, features.astype(np.float32))
    assert dataset.ids[7] == "img_007" and set(dataset.split) == {"train", "test"}
    assert dataset.class_names == {"colour": ["blue", "red"], "size": ["big"]}
    assert dataset.labels["colour"][:3].tolist() == [0, 1, 0]
    assert dataset.labels["size"][:2].tolist() == [-1, 0]  # an empty cell is unknown
    dataset.verify_digest()
    again = prepare_feature_files(root=tmp_path / "cache", features_path=tmp_path / "features.npy",
                                  ids_path=tmp_path / "ids.txt", labels_path=tmp_path / "labels.csv",
                                  test_fraction=0.25, seed=0)
    assert again == path  # found, not rewritten


def test_without_ids_or_labels_rows_are_numbered(tmp_path):
    _files(tmp_path)
    dataset = load_feature_dataset(prepare_feature_files(root=tmp_path / "c", features_path=tmp_path / "features.npy",
                                                         ids_path=None, labels_path=None, test_fraction=0.0, seed=0))
    assert dataset.ids[:3].tolist() == ["0", "1", "2"] and dataset.attributes == []
    assert set(dataset.split) == {"train"}


@pytest.mark.parametrize("mistake, message", [
    ("not_npy", "is not a readable .npy"),
    ("three_axes", r"expected an \(N, D\) float array"),
    ("nan_row", "1 rows hold NaN or inf"),
    ("short_ids", "has 39 ids but the features have 40 rows"),
    ("duplicate_id", "appears twice"),
    ("unknown_label_id", "not among the features' ids"),
    ("no_id_column", "an 'id' column"),
])
def test_mistakes_in_user_files_name_the_fix(tmp_path, mistake, message):
    features = _files(tmp_path)
    if mistake == "not_npy":
        (tmp_path / "features.npy").write_text("not numpy")
    elif mistake == "three_axes":
        np.save(tmp_path / "features.npy", features.reshape(40, 3, 2))
    elif mistake == "nan_row":
        features[4, 2] = np.nan
        np.save(tmp_path / "features.npy", features)
    elif mistake == "short_ids":
        (tmp_path / "ids.txt").write_text("".join(f"img_{i:03d}\n" for i in range(39)))
    elif mistake == "duplicate_id":
        (tmp_path / "ids.txt").write_text("".join(f"img_{min(i, 38):03d}\n" for i in range(40)))
    elif mistake == "unknown_label_id":
        with open(tmp_path / "labels.csv", "a") as handle:
            handle.write("img_999,red,big\n")
    elif mistake == "no_id_column":
        (tmp_path / "labels.csv").write_text("name,colour\nimg_000,red\n")
    with pytest.raises(DataError, match=message):
        prepare_feature_files(root=tmp_path / "cache", features_path=tmp_path / "features.npy",
                              ids_path=tmp_path / "ids.txt", labels_path=tmp_path / "labels.csv",
                              test_fraction=0.25, seed=0)
    assert not list((tmp_path / "cache").glob("*")) if (tmp_path / "cache").exists() else True


def test_synthetic_features_follow_their_prototypes():
    """x = sum_a scale_a P_a[y_a] + noise eps: with no noise, the class means of each attribute are its scaled
    prototypes plus the other attribute's mean, and the dominant attribute's means are further apart."""
    x, labels = synthetic_features(num_samples=4000, dim=16, classes={"dominant": 3, "weak": 3},
                                   scales={"dominant": 3.0, "weak": 1.0}, noise=0.0, seed=1)
    assert x.shape == (4000, 16) and x.dtype == np.float32
    spread = {}
    for name in labels:
        means = np.stack([x[labels[name] == c].mean(axis=0) for c in range(3)])
        spread[name] = np.linalg.norm(means[0] - means[1])
    assert spread["dominant"] > 2 * spread["weak"] > 0
    again, _ = synthetic_features(num_samples=4000, dim=16, classes={"dominant": 3, "weak": 3},
                                  scales={"dominant": 3.0, "weak": 1.0}, noise=0.0, seed=1)
    np.testing.assert_array_equal(x, again)


def test_synthetic_dataset_is_split_and_cached(tmp_path):
    kwargs = dict(num_train=64, num_test=32, dim=8, classes={"a": 2, "b": 3}, scales={"a": 2.0, "b": 1.0},
                  noise=0.1, seed=0)
    path = prepare_synthetic(root=tmp_path, **kwargs)
    dataset = load_feature_dataset(path)
    assert len(dataset.indices("train")) == 64 and len(dataset.indices("test")) == 32
    assert dataset.class_names["b"] == ["b0", "b1", "b2"]
    assert path.name == f"synthetic_features-{params_hash(kwargs)}"
    assert prepare_synthetic(root=tmp_path, **kwargs) == path


def test_a_directory_that_is_not_a_feature_dataset_says_so(tmp_path):
    with pytest.raises(DataError, match="not a prepared feature dataset"):
        load_feature_dataset(tmp_path)
