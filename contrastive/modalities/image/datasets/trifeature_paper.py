"""Trifeature as Hermann & Lampinen (2020) specify it: every one of the 10 shapes x 10 textures x 10 colours
combinations appears exactly ``per_combination`` times (100: 100 000 images), each at its own random position,
rotation and size. The default Trifeature source (:mod:`contrastive.modalities.image.datasets.trifeature`) draws the three attributes
independently per image, which is faster to set up at any size; this one is balanced exactly, as the paper's.

The test split holds ``test_per_combination`` further images of every combination (so it is balanced too). Pixels
come from the same renderer as the default source (same shapes, textures, palette, anti-aliasing); Hermann &
Lampinen render at 224 px, ``image_size`` defaults to the MCL/IFM experiments' 64 px to keep 100k images in memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from contrastive.modalities.image.datasets import trifeature as tf
from contrastive.modalities.image.datasets.sources import prepared_dir, write_prepared
from contrastive.errors import ConfigError

KIND = "trifeature_paper"
NUM_PER_ATTRIBUTE = 10


def balanced_labels(*, per_combination: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """color, shape, texture int64 (1000 * per_combination,): each of the 1000 combinations ``per_combination``
    times, in a seeded random order."""
    grid = np.stack(np.meshgrid(*(np.arange(NUM_PER_ATTRIBUTE),) * 3, indexing="ij"), axis=-1).reshape(-1, 3)
    rows = rng.permutation(np.repeat(grid, per_combination, axis=0))
    return {"color": rows[:, 0].astype(np.int64), "shape": rows[:, 1].astype(np.int64),
            "texture": rows[:, 2].astype(np.int64)}


def generate_balanced(*, per_combination: int, image_size: int, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """uint8 (1000 * per_combination, S, S, 3) images and their labels (see :func:`balanced_labels`)."""
    labels = balanced_labels(per_combination=per_combination, rng=np.random.default_rng([seed, 1]))
    n = labels["color"].shape[0]
    scene = tf._draw_scenes(n=n, image_size=image_size, num_colors=NUM_PER_ATTRIBUTE,
                            num_shapes=NUM_PER_ATTRIBUTE, num_textures=NUM_PER_ATTRIBUTE, seed=seed)
    scene.update(labels)  # the geometry stays the seeded draw; only the attributes are set to the balanced grid
    palette = np.asarray([tf.COLOR_PALETTE[c] for c in tf.COLOR_NAMES], dtype=np.float32)
    images = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    chunk = max(1, tf._CHUNK * 32 * 32 // (image_size * image_size))
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk))
        images[rows] = tf._render(tf._subset(scene, rows), image_size=image_size, palette=palette)
    return images, labels


def prepare_trifeature_paper(*, root: Path, per_combination: int = 100, test_per_combination: int = 10,
                             image_size: int = 64, seed: int = 0) -> Path:
    """Generate (or reuse) the balanced Trifeature dataset under ``root``.

    Returns:
        The dataset directory: ``1000 * per_combination`` train images and ``1000 * test_per_combination`` test
        images, attributes color, shape, texture (10 classes each).
    """
    if per_combination < 1 or test_per_combination < 1:
        raise ConfigError("data.trifeature_paper.per_combination and test_per_combination must be >= 1")
    params = {"generator_version": tf.GENERATOR_VERSION, "per_combination": int(per_combination),
              "test_per_combination": int(test_per_combination), "image_size": int(image_size), "seed": int(seed)}
    if (done := prepared_dir(root=root, kind=KIND, params=params)) is not None:
        return done
    train_images, train_labels = generate_balanced(per_combination=per_combination, image_size=image_size,
                                                   seed=seed)
    test_images, test_labels = generate_balanced(per_combination=test_per_combination, image_size=image_size,
                                                 seed=seed + 1_000_003)  # an unrelated stream for the test draws
    n_train, n_test = len(train_images), len(test_images)
    return write_prepared(
        root=root, kind=KIND, params=params, images=np.concatenate([train_images, test_images]),
        ids=[f"tfp-{i:07d}" for i in range(n_train + n_test)],
        split=np.where(np.arange(n_train + n_test) < n_train, "train", "test"),
        labels={k: np.concatenate([train_labels[k], test_labels[k]]) for k in train_labels},
        attributes={"color": list(tf.COLOR_NAMES), "shape": list(tf.SHAPE_NAMES), "texture": list(tf.TEXTURE_NAMES)})
