"""Small real inputs for the benchmarks that run the training/export code: a Trifeature dataset and a model file,
written under a temporary directory."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from contrastive.data.dataset import atomic_dataset_dir, write_dataset_files
from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
from contrastive.methods import build_method
from contrastive.modalities.image.config import MethodConfig, ModelConfig


def trifeature_dataset(*, root: Path, num_train: int, num_test: int, image_size: int = 32) -> Path:
    return prepare_trifeature(root=root, num_train=num_train, num_test=num_test, image_size=image_size)


def synthetic_dataset(*, root: Path, num_train: int, num_test: int, image_size: int = 32, seed: int = 0) -> Path:
    """A prepared dataset of uniform-noise images (ids ``s-0000000`` ...; first ``num_train`` are "train").

    Throughput of the conv encoder does not depend on what the pixels show, and noise is written in a
    second where drawing Trifeature images takes ~3 ms each on this machine.
    """
    n = num_train + num_test
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, image_size, image_size, 3), dtype=np.uint8)
    target = Path(root) / f"noise-{num_train}-{num_test}-{image_size}"
    with atomic_dataset_dir(target) as tmp:
        write_dataset_files(tmp, kind="bench-noise", images=images, ids=[f"s-{i:07d}" for i in range(n)],
                            split=np.where(np.arange(n) < num_train, "train", "test"),
                            labels={"color": rng.integers(0, 4, n)}, attributes={"color": ["a", "b", "c", "d"]},
                            params={"num_train": num_train, "num_test": num_test, "image_size": image_size})
    return target


def model_kwargs() -> dict:
    """The default preset's encoder: 4-layer CNN (widths 32/64/128/256), head 256-256-128."""
    return ModelConfig().model_dump(mode="json")


def method_kwargs() -> dict:
    return MethodConfig().model_dump(mode="json")


def saved_model(path: Path, *, seed: int = 0) -> Path:
    """A randomly initialised SimCLR model in the format ``stages.load_trained_model`` reads."""
    torch.manual_seed(seed)
    method = build_method(model_kwargs=model_kwargs(), method_kwargs=method_kwargs())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": method.state_dict(), "model_kwargs": model_kwargs(),
                "method_kwargs": method_kwargs()}, path)
    return path
