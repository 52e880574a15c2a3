"""CIFAR-MNIST from tiny files written in torchvision's exact layouts (pickled CIFAR batches, IDX MNIST files)."""
import gzip
import pickle
import struct

import numpy as np
import pytest

from contrastive.modalities.image.datasets.cifar_mnist import pair_indices, prepare_cifar_mnist, read_cifar10, read_idx, read_mnist
from contrastive.data.loading import load_dataset
from contrastive.errors import DataError

NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_cifar(root, *, per_batch=3, seed=0):
    """cifar-10-batches-py/ with data_batch_1..5 (per_batch each), test_batch (per_batch) and batches.meta."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    truth = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        # The python version's row layout: 1024 red values, 1024 green, 1024 blue, each row-major.
        data = images.transpose(0, 3, 1, 2).reshape(per_batch, 3072)
        with open(folder / name, "wb") as handle:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"x.png"] * per_batch}, handle)
        truth[name] = (images, labels)
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({b"label_names": [n.encode() for n in NAMES], b"num_cases_per_batch": per_batch}, handle)
    return truth


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">i", s) for s in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(root, *, n_train=20, n_test=4, seed=1, gz=False):
    rng = np.random.default_rng(seed)
    folder = root / "MNIST" / "raw"
    folder.mkdir(parents=True)
    truth = {}
    for split, n, prefix in (("train", n_train, "train"), ("test", n_test, "t10k")):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        for name, array in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
            payload = idx_bytes(array)
            if gz:
                with gzip.open(folder / f"{name}.gz", "wb") as handle:
                    handle.write(payload)
            else:
                (folder / name).write_bytes(payload)
        truth[split] = (images, labels)
    return truth


def test_cifar_reader_matches_the_written_pixels(tmp_path):
    truth = write_cifar(tmp_path)
    images, labels, names = read_cifar10(tmp_path, split="train")
    assert names == NAMES
    expected = np.concatenate([truth[f"data_batch_{i}"][0] for i in range(1, 6)])
    np.testing.assert_array_equal(images, expected)
    assert labels.tolist() == sum((truth[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    test_images, _, _ = read_cifar10(tmp_path / "cifar-10-batches-py", split="test")  # the folder itself works too
    np.testing.assert_array_equal(test_images, truth["test_batch"][0])


@pytest.mark.parametrize("gz", [False, True])
def test_idx_reader(tmp_path, gz):
    truth = write_mnist(tmp_path, gz=gz)
    images, labels = read_mnist(tmp_path, split="train")
    np.testing.assert_array_equal(images, truth["train"][0])
    np.testing.assert_array_equal(labels, truth["train"][1])
    raw = tmp_path / "MNIST" / "raw" / ("t10k-labels-idx1-ubyte" + (".gz" if gz else ""))
    assert read_idx(raw).shape == (4,)


def test_pairing_uses_each_digit_once_while_there_are_enough():
    pairs = pair_indices(num_cifar=15, num_mnist=20, rng=np.random.default_rng(0))
    assert len(set(pairs.tolist())) == 15
    more = pair_indices(num_cifar=30, num_mnist=20, rng=np.random.default_rng(0))
    assert sorted(set(more[:20].tolist())) == list(range(20)) and more.max() < 20


def test_prepare_builds_four_channel_pairs_with_both_labels(tmp_path):
    cifar = write_cifar(tmp_path / "c")
    mnist = write_mnist(tmp_path / "m")
    path = prepare_cifar_mnist(cifar_root=tmp_path / "c", mnist_root=tmp_path / "m", root=tmp_path / "cache", seed=3)
    ds = load_dataset(path, verify_digest=True)
    assert ds.images.shape == (18, 32, 32, 4) and ds.attributes == ["cifar", "digit"]
    assert ds.class_names["cifar"] == NAMES
    train_cifar = np.concatenate([cifar[f"data_batch_{i}"][0] for i in range(1, 6)])
    train_labels = sum((cifar[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    for row in ds.indices("train"):
        _, split, c, m = str(ds.ids[row]).split("-")
        c, m = int(c), int(m)
        assert split == "train"
        np.testing.assert_array_equal(ds.images[row, :, :, :3], train_cifar[c])
        assert ds.labels["cifar"][row] == train_labels[c]
        assert ds.labels["digit"][row] == mnist["train"][1][m]
        # The digit channel is the 28 px digit resized to 32 px: same mean brightness within rounding.
        assert abs(float(ds.images[row, :, :, 3].mean()) - float(mnist["train"][0][m].mean())) < 3.0
    assert len(ds.indices("test")) == 3
    again = prepare_cifar_mnist(cifar_root=tmp_path / "c", mnist_root=tmp_path / "m", root=tmp_path / "cache", seed=3)
    assert again == path
    other = prepare_cifar_mnist(cifar_root=tmp_path / "c", mnist_root=tmp_path / "m", root=tmp_path / "cache", seed=4)
    assert other != path and not np.array_equal(load_dataset(other).ids, ds.ids)


def test_subsets_are_seeded(tmp_path):
    write_cifar(tmp_path / "c")
    write_mnist(tmp_path / "m")
    path = prepare_cifar_mnist(cifar_root=tmp_path / "c", mnist_root=tmp_path / "m", root=tmp_path / "cache",
                               num_train=16, num_test=None)
    assert len(load_dataset(path).indices("train")) == 15  # fewer than asked: all of them


def test_missing_data_names_where_to_get_it_and_the_key(tmp_path):
    write_mnist(tmp_path / "m")
    with pytest.raises(DataError, match=r"cs.toronto.edu.*--set data.cifar_mnist.cifar_root"):
        prepare_cifar_mnist(cifar_root=tmp_path / "nothing", mnist_root=tmp_path / "m", root=tmp_path / "cache")
    write_cifar(tmp_path / "c")
    with pytest.raises(DataError, match=r"--set data.cifar_mnist.mnist_root"):
        prepare_cifar_mnist(cifar_root=tmp_path / "c", mnist_root=tmp_path / "nothing", root=tmp_path / "cache")
