"""CIFAR-MNIST (Chen et al., 2021, "Intriguing properties of contrastive losses"; the MCL paper's Sec. 5.1): a
CIFAR-10 image and an MNIST digit concatenated channel-wise into one 4-channel 32 x 32 image.

Read from torchvision's on-disk layouts, nothing downloaded:

    <cifar_root>/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}   (python pickles)
    <mnist_root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]           (IDX files)

Each CIFAR image of a split is paired with an MNIST digit of the same split drawn at random (seeded; a digit is
used at most once while the MNIST split has enough). The digit (28 x 28) is resized to 32 x 32 bilinearly and
becomes channel 3 after CIFAR's R, G, B. Because the pairing is random, the CIFAR class and the digit are
independent features: attributes ``cifar`` (10 classes) and ``digit`` (10 classes).
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from contrastive.modalities.image.datasets.sources import files_fingerprint, find_in, missing_data, prepared_dir, subsample, write_prepared
from contrastive.engine.safe_load import UnsafeFileError, load_array_pickle
from contrastive.errors import DataError

KIND = "cifar_mnist"
FORMAT_VERSION = 1
IMAGE_SIZE = 32
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = ("test_batch",)
CIFAR_META = "batches.meta"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html (the python version, cifar-10-python.tar.gz)"
MNIST_DIR = "MNIST/raw"
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
MNIST_URL = "http://yann.lecun.com/exdb/mnist/ (or torchvision.datasets.MNIST(root, download=True) once)"
DIGITS = tuple(str(d) for d in range(10))


# --------------------------------------------------------------------------------------------- CIFAR-10
def cifar_dir(root: Path) -> Path:
    """The ``cifar-10-batches-py`` folder under ``root`` (or ``root`` itself); DataError naming the fix."""
    found = find_in(Path(root), relative=CIFAR_DIR)
    missing = [] if found is None else [n for n in (*CIFAR_TRAIN, *CIFAR_TEST, CIFAR_META) if not (found / n).is_file()]
    if found is None or missing:
        raise missing_data(what="CIFAR-10 (python version)", path=Path(root), get_from=CIFAR_URL,
                           expected=f"{CIFAR_DIR}/ with data_batch_1..5, test_batch and batches.meta"
                                    + (f" (missing {', '.join(missing)})" if missing else ""),
                           key="data.cifar_mnist.cifar_root")
    return found


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:  # numpy arrays and plain data only: a planted pickle runs nothing
            return load_array_pickle(handle, path=path, what="CIFAR-10 python batch", encoding="bytes",
                                     fix="Re-extract cifar-10-python.tar.gz from cs.toronto.edu/~kriz/cifar.html")
    except UnsafeFileError:
        raise
    except Exception as err:  # truncated download, wrong file
        raise DataError(f"{path} is not a CIFAR-10 python batch ({type(err).__name__}: {err}): re-extract "
                        "cifar-10-python.tar.gz") from err


def read_cifar10(root: Path, *, split: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """CIFAR-10 ``split`` ("train" = data_batch_1..5 in order, "test" = test_batch).

    Returns:
        images uint8 (N, 32, 32, 3) RGB, labels int64 (N,), class names (10).
    """
    folder = cifar_dir(root)
    images, labels = [], []
    for name in CIFAR_TRAIN if split == "train" else CIFAR_TEST:
        batch = _unpickle(folder / name)
        data = np.asarray(batch[b"data"], dtype=np.uint8)  # (n, 3072): 1024 R, then G, then B, row-major
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in _unpickle(folder / CIFAR_META)[b"label_names"]]
    return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels), names


# --------------------------------------------------------------------------------------------- MNIST
def _mnist_file(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def mnist_dir(root: Path) -> Path:
    """The ``MNIST/raw`` folder under ``root`` (or ``root`` itself / ``root/raw``); DataError naming the fix."""
    root = Path(root).expanduser()
    names = [n for pair in MNIST_FILES.values() for n in pair]
    for folder in (root / MNIST_DIR, root / "raw", root):
        if all(_mnist_file(folder, n) for n in names):
            return folder
    raise missing_data(what="MNIST", path=root, get_from=MNIST_URL, key="data.cifar_mnist.mnist_root",
                       expected=f"{MNIST_DIR}/ with {', '.join(names)} (optionally .gz)")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format): big-endian magic (0, 0, dtype code, ndim), ndim int32 sizes, data.
    Only unsigned bytes (code 0x08) occur in MNIST."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file (magic {raw[:4].hex()}): re-download MNIST")
    ndim = raw[3]
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise DataError(f"{path} holds {body.size} bytes of data but its header says {shape}: the file is "
                        "truncated, re-download MNIST")
    return body.reshape(shape)


def read_mnist(root: Path, *, split: str) -> tuple[np.ndarray, np.ndarray]:
    """MNIST ``split`` ("train" 60k, "test" 10k): uint8 (N, 28, 28) digits and int64 (N,) labels."""
    folder = mnist_dir(root)
    image_name, label_name = MNIST_FILES[split]
    images, labels = read_idx(_mnist_file(folder, image_name)), read_idx(_mnist_file(folder, label_name))
    if images.ndim != 3 or labels.shape != (images.shape[0],):
        raise DataError(f"MNIST {split} files in {folder} disagree: images {images.shape}, labels {labels.shape}")
    return images, labels.astype(np.int64)


def resize_digits(digits: np.ndarray, *, size: int = IMAGE_SIZE) -> np.ndarray:
    """uint8 (N, 28, 28) -> uint8 (N, size, size), bilinear (half-pixel centres), rounded."""
    tensor = torch.from_numpy(np.ascontiguousarray(digits)).float().unsqueeze(1)
    out = F.interpolate(tensor, size=(size, size), mode="bilinear", align_corners=False)
    return out.squeeze(1).round_().clamp_(0, 255).to(torch.uint8).numpy()


# --------------------------------------------------------------------------------------------- pairing
def pair_indices(*, num_cifar: int, num_mnist: int, rng: np.random.Generator) -> np.ndarray:
    """int64 (num_cifar,) MNIST row for each CIFAR row: a random permutation (each digit once) while MNIST has
    enough, topped up with draws with replacement otherwise."""
    order = rng.permutation(num_mnist)
    if num_cifar <= num_mnist:
        return order[:num_cifar].astype(np.int64)
    extra = rng.integers(0, num_mnist, num_cifar - num_mnist)
    return np.concatenate([order, extra]).astype(np.int64)


def combine(cifar: np.ndarray, digits: np.ndarray) -> np.ndarray:
    """uint8 (N, 32, 32, 3) CIFAR + uint8 (N, 32, 32) digits -> uint8 (N, 32, 32, 4), the digit as channel 3."""
    return np.concatenate([cifar, digits[..., None]], axis=-1)


def prepare_cifar_mnist(*, cifar_root: Path, mnist_root: Path, root: Path, num_train: int | None = None,
                        num_test: int | None = None, seed: int = 0) -> Path:
    """Build (or reuse) the CIFAR-MNIST dataset under ``root``.

    Args:
        cifar_root: folder holding ``cifar-10-batches-py/`` (or that folder).
        mnist_root: folder holding ``MNIST/raw/`` (torchvision's root), or the raw folder itself.
        num_train / num_test: use a seeded subset of the CIFAR split (None: all 50 000 / 10 000).
        seed: draws the subsets and the CIFAR -> MNIST pairing.

    Returns:
        The dataset directory: images uint8 (N, 32, 32, 4), ids ``cm-<split>-<cifar row>-<mnist row>``,
        attributes ``cifar`` and ``digit``.
    """
    cifar_folder, mnist_folder = cifar_dir(cifar_root), mnist_dir(mnist_root)
    sources = [cifar_folder / n for n in (*CIFAR_TRAIN, *CIFAR_TEST, CIFAR_META)] + \
              [_mnist_file(mnist_folder, n) for pair in MNIST_FILES.values() for n in pair]
    params = {"format_version": FORMAT_VERSION, "cifar": str(cifar_folder.resolve()),
              "mnist": str(mnist_folder.resolve()), "files_sha256": files_fingerprint(sources),
              "num_train": num_train, "num_test": num_test, "seed": int(seed)}
    if (done := prepared_dir(root=root, kind=KIND, params=params)) is not None:
        return done
    rng = np.random.default_rng(seed)
    parts, ids, split, cifar_labels, digit_labels, class_names = [], [], [], [], [], []
    for name, limit in (("train", num_train), ("test", num_test)):
        cifar, cifar_y, class_names = read_cifar10(cifar_root, split=name)
        mnist, mnist_y = read_mnist(mnist_root, split=name)
        rows = subsample(len(cifar), limit, rng=rng)
        pairs = pair_indices(num_cifar=len(rows), num_mnist=len(mnist), rng=rng)
        parts.append(combine(cifar[rows], resize_digits(mnist[pairs])))
        ids += [f"cm-{name}-{c:05d}-{m:05d}" for c, m in zip(rows, pairs)]
        split += [name] * len(rows)
        cifar_labels.append(cifar_y[rows])
        digit_labels.append(mnist_y[pairs])
    return write_prepared(root=root, kind=KIND, params=params, images=np.concatenate(parts), ids=ids,
                          split=np.asarray(split), attributes={"cifar": class_names, "digit": list(DIGITS)},
                          labels={"cifar": np.concatenate(cifar_labels), "digit": np.concatenate(digit_labels)})
