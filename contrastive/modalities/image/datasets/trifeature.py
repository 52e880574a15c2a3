"""Trifeature-style synthetic images (Hermann & Lampinen, 2020): one shape x one texture x one colour.

Each image shows one shape on a plain grey background, at a random position, rotation and size, filled with one
texture in one colour. The three attributes are drawn uniformly and independently, so a representation that
encodes all three is possible, and a contrastive encoder that only keeps the easy ones (colour, texture) is
measurably worse on the third (shape): the situation multistage contrastive learning is meant to fix.

Rendering is vectorised numpy: shapes are analytic inside-tests in the shape's own (rotated, scaled) frame,
evaluated on a grid supersampled ``SUPERSAMPLE`` x per axis and box-filtered down, which anti-aliases edges.
Textures live in the image frame (not rotated with the shape) so the four stripe orientations stay four
different classes.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from contrastive.engine.device import available_cores
from contrastive.data.dataset import atomic_dataset_dir, is_prepared, params_hash, write_dataset_files
from contrastive.errors import ConfigError

# Bump when the pictures change for the same parameters: the cache key includes it, so old datasets are redone.
GENERATOR_VERSION = 1
KIND = "trifeature"

# Light-mid grey rather than 128: white's dark texture parts (0.35 x 245 = 86) must still stand out from it.
BACKGROUND = 150.0
DARK = 0.35  # texture value 0 shows the colour at 35 % intensity, value 1 at 100 %: colour stays identifiable
SUPERSAMPLE = 4
SCALE_RANGE = (0.55, 0.9)  # shape diameter as a fraction of the image side
EDGE_SLACK = 0.1  # the shape may leave the image by at most this fraction of its radius
_CHUNK = 256  # images rendered together; bounds memory at about 256 x (32*4)^2 x 4 B = 16 MiB per temporary

# Hues spread round the colour wheel plus one achromatic colour. No black: a texture in black at 35 % is
# invisible. Ordered so that any prefix is as well separated as possible.
COLOR_PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (40, 190, 40),
    "blue": (40, 70, 235),
    "yellow": (240, 225, 30),
    "magenta": (225, 40, 185),
    "cyan": (30, 205, 215),
    "white": (245, 245, 245),
    "orange": (250, 140, 20),
    "purple": (140, 50, 215),
    "pink": (250, 150, 190),
}
COLOR_NAMES: tuple[str, ...] = tuple(COLOR_PALETTE)
SHAPE_NAMES: tuple[str, ...] = (
    "circle", "square", "triangle", "star", "cross", "heart", "half_disc", "diamond", "hexagon", "pentagon",
)
TEXTURE_NAMES: tuple[str, ...] = (
    "stripes_0", "stripes_45", "stripes_90", "stripes_135", "checker", "dots", "noise", "solid", "grid", "rings",
)


# ------------------------------------------------------------------------------------------------ shapes
# Each takes canonical coordinates u, v (float32, any broadcastable shape; the shape's circumradius is about 1,
# centred near its centroid so that rotation looks natural) and returns a bool inside-mask.
def _regular_polygon(n: int, circumradius: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    apothem = circumradius * np.cos(np.pi / n)
    normals = [(np.cos(a), np.sin(a)) for a in 2 * np.pi * (np.arange(n) + 0.5) / n + np.pi / 2]

    def inside(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        support = np.full(np.broadcast_shapes(u.shape, v.shape), -np.inf, dtype=np.float32)
        for cx, cy in normals:
            np.maximum(support, u * np.float32(cx) + v * np.float32(cy), out=support)
        return support <= apothem

    return inside


def _star(u: np.ndarray, v: np.ndarray, *, points: int = 5, outer: float = 1.0, inner: float = 0.45) -> np.ndarray:
    # Fold the plane into the half-sector between an outer tip (angle 0) and the next inner vertex, then test
    # against the single edge joining them.
    sector = 2 * np.pi / points
    rho = np.hypot(u, v)
    phi = np.mod(np.arctan2(v, u) - np.pi / 2, sector)
    phi = np.minimum(phi, sector - phi)
    px, py = rho * np.cos(phi), rho * np.sin(phi)
    dx, dy = inner * np.cos(sector / 2) - outer, inner * np.sin(sector / 2)
    return dx * py - dy * (px - outer) >= 0


def _circle(u, v):
    return u * u + v * v <= 0.9**2


def _square(u, v):
    return np.maximum(np.abs(u), np.abs(v)) <= 0.72


def _cross(u, v, *, half_width: float = 0.3, half_length: float = 0.95):
    au, av = np.abs(u), np.abs(v)
    return ((au <= half_width) & (av <= half_length)) | ((av <= half_width) & (au <= half_length))


def _heart(u, v):
    # (x^2 + y^2 - 1)^3 - x^2 y^3 <= 0 spans x in [-1.14, 1.14], y in [-1, 1.25]; shrink and centre it.
    x, y = u / 0.85, -v / 0.85 + 0.12
    q = x * x + y * y - 1
    return q * q * q - x * x * y * y * y <= 0


def _half_disc(u, v):
    # Flat side through the shifted centre; 4 / (3 pi) = 0.42 moves the centroid to the origin.
    r, w = 1.0 / 1.08, v + 0.42 / 1.08
    return (u * u + w * w <= r * r) & (w >= 0)


def _diamond(u, v):
    # Elongated rhombus: a square rotated by 45 degrees would be the same class as "square".
    return np.abs(u) / 1.0 + np.abs(v) / 0.55 <= 1


SHAPES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "circle": _circle,
    "square": _square,
    "triangle": _regular_polygon(3, 1.0),
    "star": _star,
    "cross": _cross,
    "heart": _heart,
    "half_disc": _half_disc,
    "diamond": _diamond,
    "hexagon": _regular_polygon(6, 0.95),
    "pentagon": _regular_polygon(5, 0.95),
}


# ---------------------------------------------------------------------------------------------- textures
# Each takes image-frame pixel coordinates x (n, 1, S) and y (n, S, 1) float32 already shifted by a random
# per-image phase, the per-image scene parameters of those n images, and the pixel unit k = image_size / 32
# (textures scale with the image so they look the same at every size). Returns a bool (n, S, S) "bright" mask.
def _stripes(angle_deg: float):
    # Lines run at angle_deg to the x axis; the coordinate across them decides bright / dark.
    a = np.deg2rad(angle_deg)
    nx, ny = np.float32(-np.sin(a)), np.float32(np.cos(a))

    def texture(x, y, scene, k):
        period = 5.0 * k
        return np.mod(x * nx + y * ny, period) < period / 2

    return texture


def _checker(x, y, scene, k):
    cell = 3.0 * k
    return (np.floor(x / cell) + np.floor(y / cell)) % 2 == 0


def _dots(x, y, scene, k):
    spacing, radius = 5.0 * k, 1.4 * k
    dx, dy = np.mod(x, spacing) - spacing / 2, np.mod(y, spacing) - spacing / 2
    return dx * dx + dy * dy <= radius * radius


def _noise(x, y, scene, k):
    block = 2.0 * k
    grid = scene["noise"]  # (n, G, G) bool
    g = grid.shape[-1]
    ix = np.clip((x / block).astype(np.int64), 0, g - 1)
    iy = np.clip((y / block).astype(np.int64), 0, g - 1)
    return grid[np.arange(grid.shape[0])[:, None, None], iy, ix]


def _solid(x, y, scene, k):
    return np.ones(np.broadcast_shapes(x.shape, y.shape), dtype=bool)


def _grid(x, y, scene, k):
    spacing, width = 5.0 * k, 1.5 * k
    return (np.mod(x, spacing) < width) | (np.mod(y, spacing) < width)


def _rings(x, y, scene, k):
    # Concentric around the shape's centre (x, y carry the phase shift, so the centre is shifted too); the
    # x phase doubles as a random radial phase.
    period = 5.0 * k
    cx = (scene["cx"] + scene["phase_x"])[:, None, None]
    cy = (scene["cy"] + scene["phase_y"])[:, None, None]
    return np.mod(np.hypot(x - cx, y - cy) + scene["phase_x"][:, None, None], period) < period / 2


TEXTURES: dict[str, Callable] = {
    "stripes_0": _stripes(0.0),
    "stripes_45": _stripes(45.0),
    "stripes_90": _stripes(90.0),
    "stripes_135": _stripes(135.0),
    "checker": _checker,
    "dots": _dots,
    "noise": _noise,
    "solid": _solid,
    "grid": _grid,
    "rings": _rings,
}


# ------------------------------------------------------------------------------------------- generation
def _check_counts(*, num_train: int, num_test: int, image_size: int, num_colors: int, num_shapes: int,
                  num_textures: int) -> None:
    if num_train < 0 or num_test < 0 or num_train + num_test == 0:
        raise ConfigError(f"trifeature needs num_train >= 0, num_test >= 0 and at least one image (got "
                          f"{num_train}, {num_test}): set data.trifeature.num_train / num_test")
    if image_size < 8:
        raise ConfigError(f"trifeature image_size {image_size} is too small to show a texture: use 32 or more "
                          "(data.trifeature.image_size)")
    for name, n, available in (("num_colors", num_colors, COLOR_NAMES), ("num_shapes", num_shapes, SHAPE_NAMES),
                               ("num_textures", num_textures, TEXTURE_NAMES)):
        if not 1 <= n <= len(available):
            raise ConfigError(f"trifeature {name}={n} but only {len(available)} are defined "
                              f"({', '.join(available)}): set data.trifeature.{name} to 1..{len(available)}")


def _draw_scenes(*, n: int, image_size: int, num_colors: int, num_shapes: int, num_textures: int,
                 seed: int) -> dict[str, np.ndarray]:
    """All random choices for ``n`` images, drawn up-front so the pictures do not depend on chunking.

    Returns name -> (n,) arrays (labels int64, geometry float32) plus ``noise`` bool (n, G, G).
    """
    rng = np.random.default_rng(seed)
    size = float(image_size)
    k = size / 32.0
    scene = {
        "color": rng.integers(0, num_colors, n).astype(np.int64),
        "shape": rng.integers(0, num_shapes, n).astype(np.int64),
        "texture": rng.integers(0, num_textures, n).astype(np.int64),
    }
    radius = rng.uniform(*SCALE_RANGE, n) * size / 2
    # Keep the centre far enough in that at most EDGE_SLACK of the radius can leave the image.
    reach = np.maximum(size / 2 - radius * (1 - EDGE_SLACK), 0.0)
    scene["radius"] = radius.astype(np.float32)
    scene["angle"] = rng.uniform(0, 2 * np.pi, n).astype(np.float32)
    scene["cx"] = (size / 2 + rng.uniform(-1, 1, n) * reach).astype(np.float32)
    scene["cy"] = (size / 2 + rng.uniform(-1, 1, n) * reach).astype(np.float32)
    # A random phase per image so texture position carries no information; 30 px covers every period used.
    scene["phase_x"] = rng.uniform(0, 30 * k, n).astype(np.float32)
    scene["phase_y"] = rng.uniform(0, 30 * k, n).astype(np.float32)
    cells = int(np.ceil((size + 30 * k) / (2.0 * k))) + 1
    scene["noise"] = rng.random((n, cells, cells)) < 0.5
    return scene


def _subset(scene: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {key: value[rows] for key, value in scene.items()}


def _shape_masks(scene: dict[str, np.ndarray], *, coords: np.ndarray, shape_names) -> np.ndarray:
    """bool (n, S, S) inside-masks on the supersampled grid ``coords`` (S,) in pixel units."""
    n, s = scene["shape"].shape[0], coords.shape[0]
    masks = np.zeros((n, s, s), dtype=bool)
    for label in np.unique(scene["shape"]):
        rows = np.flatnonzero(scene["shape"] == label)
        part = _subset(scene, rows)
        cos, sin = np.cos(part["angle"])[:, None, None], np.sin(part["angle"])[:, None, None]
        inv_r = (1.0 / part["radius"])[:, None, None]
        dx = coords[None, None, :] - part["cx"][:, None, None]
        dy = coords[None, :, None] - part["cy"][:, None, None]
        u = (cos * dx + sin * dy) * inv_r
        v = (cos * dy - sin * dx) * inv_r
        masks[rows] = SHAPES[shape_names[label]](u, v)
    return masks


def _texture_masks(scene: dict[str, np.ndarray], *, coords: np.ndarray, texture_names, k: float) -> np.ndarray:
    """bool (n, S, S) bright-texture masks in the image frame."""
    n, s = scene["texture"].shape[0], coords.shape[0]
    masks = np.zeros((n, s, s), dtype=bool)
    for label in np.unique(scene["texture"]):
        rows = np.flatnonzero(scene["texture"] == label)
        part = _subset(scene, rows)
        x = coords[None, None, :] + part["phase_x"][:, None, None]
        y = coords[None, :, None] + part["phase_y"][:, None, None]
        masks[rows] = TEXTURES[texture_names[label]](x, y, part, k)
    return masks


def _box_sum(mask: np.ndarray, *, factor: int) -> np.ndarray:
    """uint8 (n, H, W) count of True in each factor x factor block of bool ``mask`` (n, H*factor, W*factor).

    Written as strided adds: about 8x faster than ``reshape(...).sum(axis=(2, 4))``, which reduces over
    non-contiguous axes, and this step was a third of the generation time.
    """
    n, hs, ws = mask.shape
    blocks = mask.view(np.uint8).reshape(n, hs // factor, factor, ws // factor, factor)
    rows = blocks[..., 0].copy()
    for j in range(1, factor):
        rows += blocks[..., j]
    total = rows[:, :, 0].copy()
    for i in range(1, factor):
        total += rows[:, :, i]
    return total


def _render(scene: dict[str, np.ndarray], *, image_size: int, palette: np.ndarray) -> np.ndarray:
    """uint8 (n, H, W, 3) images of the scenes in ``scene``."""
    ss = SUPERSAMPLE
    coords = ((np.arange(image_size * ss, dtype=np.float32) + 0.5) / ss).astype(np.float32)
    inside = _shape_masks(scene, coords=coords, shape_names=SHAPE_NAMES)
    bright = _texture_masks(scene, coords=coords, texture_names=TEXTURE_NAMES, k=image_size / 32.0)
    bright &= inside
    # Box-filter the supersampled masks: coverage A and bright coverage T per output pixel, in [0, 1].
    coverage = _box_sum(inside, factor=ss).astype(np.float32) / ss**2
    lit = _box_sum(bright, factor=ss).astype(np.float32) / ss**2
    colour = palette[scene["color"]][:, None, None, :]  # (n, 1, 1, 3)
    shade = (DARK * coverage + (1 - DARK) * lit)[..., None]
    image = BACKGROUND * (1 - coverage[..., None]) + colour * shade
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def generate_trifeature(*, num_train: int, num_test: int, image_size: int = 32, num_colors: int = 10,
                        num_shapes: int = 10, num_textures: int = 10,
                        seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Draw ``num_train + num_test`` Trifeature-style images.

    Colour, shape and texture are uniform and independent; the first ``num_colors`` of :data:`COLOR_NAMES`
    (likewise shapes, textures) are used. Same arguments -> byte-identical output.

    Returns:
        images: uint8 (N, image_size, image_size, 3), N = num_train + num_test.
        labels: {"color", "shape", "texture"} -> int64 (N,) class indices into the name lists.

    Raises:
        ConfigError: counts out of range (the message names the config key to change).
    """
    _check_counts(num_train=num_train, num_test=num_test, image_size=image_size, num_colors=num_colors,
                  num_shapes=num_shapes, num_textures=num_textures)
    n = num_train + num_test
    scene = _draw_scenes(n=n, image_size=image_size, num_colors=num_colors, num_shapes=num_shapes,
                         num_textures=num_textures, seed=seed)
    palette = np.asarray([COLOR_PALETTE[c] for c in COLOR_NAMES], dtype=np.float32)
    images = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    chunk = max(1, _CHUNK * 32 * 32 // (image_size * image_size))

    def render(start: int) -> None:
        rows = np.arange(start, min(n, start + chunk))
        images[rows] = _render(_subset(scene, rows), image_size=image_size, palette=palette)

    # Chunks on every core: numpy's array arithmetic releases the GIL, the scenes are drawn up-front and each
    # chunk writes its own rows, so the bytes do not depend on the threads (a first run's data in 2/3 the time on
    # 2 cores).
    with ThreadPoolExecutor(max_workers=available_cores()) as pool:
        list(pool.map(render, range(0, n, chunk)))
    labels = {"color": scene["color"], "shape": scene["shape"], "texture": scene["texture"]}
    return images, labels


# ------------------------------------------------------------------------------------------- preparation
def trifeature_params(*, num_train: int, num_test: int, image_size: int, num_colors: int, num_shapes: int,
                      num_textures: int, seed: int) -> dict[str, int]:
    """The manifest ``params`` (and cache key) of a Trifeature dataset."""
    return {"generator_version": GENERATOR_VERSION, "num_train": int(num_train), "num_test": int(num_test),
            "image_size": int(image_size), "num_colors": int(num_colors), "num_shapes": int(num_shapes),
            "num_textures": int(num_textures), "seed": int(seed)}


def prepare_trifeature(*, root: Path, num_train: int, num_test: int, image_size: int = 32, num_colors: int = 10,
                       num_shapes: int = 10, num_textures: int = 10, seed: int = 0) -> Path:
    """Generate and write a Trifeature dataset under ``root``, or reuse a finished one with the same params.

    The directory is ``root / "trifeature-<hash of params>"``; ids are ``tf-0000000`` ...; the first
    ``num_train`` samples are "train", the rest "test". Written atomically (see ``atomic_dataset_dir``).

    Returns:
        The dataset directory, ready for :meth:`ImageArrayDataset.load`.
    """
    params = trifeature_params(num_train=num_train, num_test=num_test, image_size=image_size,
                               num_colors=num_colors, num_shapes=num_shapes, num_textures=num_textures, seed=seed)
    target = Path(root) / f"{KIND}-{params_hash(params)}"
    if is_prepared(target, kind=KIND, params=params):
        return target
    images, labels = generate_trifeature(num_train=num_train, num_test=num_test, image_size=image_size,
                                         num_colors=num_colors, num_shapes=num_shapes, num_textures=num_textures,
                                         seed=seed)
    n = images.shape[0]
    attributes = {"color": list(COLOR_NAMES[:num_colors]), "shape": list(SHAPE_NAMES[:num_shapes]),
                  "texture": list(TEXTURE_NAMES[:num_textures])}
    with atomic_dataset_dir(target, keep_existing=lambda t: is_prepared(t, kind=KIND, params=params)) as tmp:
        write_dataset_files(tmp, kind=KIND, images=images, ids=[f"tf-{i:07d}" for i in range(n)],
                            split=np.where(np.arange(n) < num_train, "train", "test"), labels=labels,
                            attributes=attributes, params=params)
    return target
