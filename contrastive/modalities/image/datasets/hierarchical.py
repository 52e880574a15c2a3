"""Trifeature-style images with an explicit two-level hierarchy, where HEX's premise holds: super-classes
(families) whose members share features.

A fine class y in [0, families x members) belongs to family f = y // members and is member m = y % members of it.
Every member of family f shares
  - the family's texture (TEXTURE_NAMES[f]: the shared part), and
  - a hue close to the family's base hue: hue(y) = f / families + (m - (members - 1) / 2) x hue_spread turns,
while the members differ by shape (SHAPE_NAMES[m]) and by their small hue offset. So the coarse label (family) is
easy (colour family + texture), and the fine label needs the subtle features the members do not share: a
representation that collapses locally inside a family keeps the coarse label and loses the fine one.

Labels: ``fine`` (families x members classes), ``coarse`` (families), ``shape`` (member). Rendering, geometry and
textures are Trifeature's (:mod:`contrastive.modalities.image.datasets.trifeature`); only the label -> (colour, shape, texture) map and
the palette differ.
"""
from __future__ import annotations

import colorsys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from contrastive.data.dataset import atomic_dataset_dir, is_prepared, params_hash, write_dataset_files
from contrastive.modalities.image.datasets.trifeature import (_CHUNK, SHAPE_NAMES, TEXTURE_NAMES, _draw_scenes, _render, _subset)
from contrastive.errors import ConfigError

GENERATOR_VERSION = 1
KIND = "trifeature_hierarchy"
STRICT = {"extra": "forbid"}


@dataclass(frozen=True)
class HierarchySpec:
    """The ``data.trifeature.hierarchy`` section: ``families`` super-classes of ``members`` fine classes each;
    members of a family share its texture and hues within ``hue_spread`` turns of each other (0.04 turn = 14
    degrees between neighbours); saturation and value of every colour."""

    __pydantic_config__ = STRICT
    families: int = 4
    members: int = 4
    hue_spread: float = 0.04
    saturation: float = 0.85
    value: float = 0.9

    def __post_init__(self):
        if not 2 <= self.families <= len(TEXTURE_NAMES):
            raise ConfigError(f"data.trifeature.hierarchy.families={self.families}: use 2..{len(TEXTURE_NAMES)} "
                              f"(one texture per family)")
        if not 2 <= self.members <= len(SHAPE_NAMES):
            raise ConfigError(f"data.trifeature.hierarchy.members={self.members}: use 2..{len(SHAPE_NAMES)} "
                              f"(one shape per member)")
        widest = self.hue_spread * (self.members - 1)
        if not 0 < widest < 1.0 / self.families:
            raise ConfigError(f"data.trifeature.hierarchy.hue_spread={self.hue_spread} makes a family span "
                              f"{widest:.3f} turns, which must be in (0, 1 / families = {1 / self.families:.3f}) so "
                              f"families do not overlap: lower hue_spread")
        for name in ("saturation", "value"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"data.trifeature.hierarchy.{name}={getattr(self, name)} must be in (0, 1]")

    @property
    def num_fine(self) -> int:
        return self.families * self.members

    def palette(self) -> np.ndarray:
        """float32 (families x members, 3) RGB of every fine class."""
        rows = []
        for y in range(self.num_fine):
            f, m = divmod(y, self.members)
            hue = (f / self.families + (m - (self.members - 1) / 2) * self.hue_spread) % 1.0
            rows.append([255 * c for c in colorsys.hsv_to_rgb(hue, self.saturation, self.value)])
        return np.asarray(rows, dtype=np.float32)


def generate_hierarchical(*, num_train: int, num_test: int, spec: HierarchySpec, image_size: int = 32,
                          seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Draw ``num_train + num_test`` images; fine classes uniform. Same arguments -> byte-identical output.

    Returns images uint8 (N, image_size, image_size, 3) and labels {"fine", "coarse", "shape"} -> int64 (N,).
    """
    if num_train < 0 or num_test < 0 or num_train + num_test == 0:
        raise ConfigError(f"the hierarchical data needs num_train >= 0, num_test >= 0 and one image at least (got "
                          f"{num_train}, {num_test}): set data.trifeature.num_train / num_test")
    n = num_train + num_test
    # Trifeature's geometry and texture phases; its colour / shape / texture draws are replaced by the hierarchy's.
    scene = _draw_scenes(n=n, image_size=image_size, num_colors=1, num_shapes=1, num_textures=1, seed=seed)
    fine = np.random.default_rng([seed, 1]).integers(0, spec.num_fine, n).astype(np.int64)
    coarse, member = np.divmod(fine, spec.members)
    scene["color"], scene["shape"], scene["texture"] = fine, member, coarse
    palette = spec.palette()
    images = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    chunk = max(1, _CHUNK * 32 * 32 // (image_size * image_size))
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk))
        images[rows] = _render(_subset(scene, rows), image_size=image_size, palette=palette)
    return images, {"fine": fine, "coarse": coarse.astype(np.int64), "shape": member.astype(np.int64)}


def prepare_hierarchical(*, root: Path, num_train: int, num_test: int, spec: HierarchySpec, image_size: int = 32,
                         seed: int = 0) -> Path:
    """Generate and write the dataset under ``root / "trifeature_hierarchy-<hash>"`` (or reuse a finished one);
    ids ``th-0000000`` ..., the first ``num_train`` are "train". Returns the dataset directory."""
    params = {"generator_version": GENERATOR_VERSION, "num_train": int(num_train), "num_test": int(num_test),
              "image_size": int(image_size), "seed": int(seed), **asdict(spec)}
    target = Path(root) / f"{KIND}-{params_hash(params)}"
    if is_prepared(target, kind=KIND, params=params):
        return target
    images, labels = generate_hierarchical(num_train=num_train, num_test=num_test, spec=spec,
                                           image_size=image_size, seed=seed)
    n = images.shape[0]
    attributes = {"fine": [f"{TEXTURE_NAMES[f]}/{SHAPE_NAMES[m]}" for f in range(spec.families)
                           for m in range(spec.members)],
                  "coarse": [TEXTURE_NAMES[f] for f in range(spec.families)],
                  "shape": list(SHAPE_NAMES[:spec.members])}
    with atomic_dataset_dir(target, keep_existing=lambda t: is_prepared(t, kind=KIND, params=params)) as tmp:
        write_dataset_files(tmp, kind=KIND, images=images, ids=[f"th-{i:07d}" for i in range(n)],
                            split=np.where(np.arange(n) < num_train, "train", "test"), labels=labels,
                            attributes=attributes, params=params)
    return target
