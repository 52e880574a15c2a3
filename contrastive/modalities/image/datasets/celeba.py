"""CelebA (Liu et al., 2015) with three attributes made independent, as in the MCL paper (Sec. 5.1): black hair,
male and smiling, resampled so every one of their 2 x 2 x 2 combinations is equally frequent (the paper keeps over
40k images).

Read from the layout of the official release (and torchvision's ``celeba/`` folder), nothing downloaded:

    <root>/img_align_celeba/000001.jpg ...
    <root>/list_attr_celeba.txt        line 1: count; line 2: the 40 attribute names; then "<file> 1 -1 ..."
    <root>/list_eval_partition.txt     "<file> <0 train | 1 valid | 2 test>"

Resampling: within each split (train = partitions 0 and 1, test = partition 2) every combination of the chosen
attributes keeps the same number of images, the size of its rarest combination, drawn with a seed. A uniform joint
distribution is a product of its (uniform) marginals, so the attributes are exactly independent and balanced.
Images are the aligned 178 x 218 crops, centre-cropped to a square and resized to ``image_size``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from contrastive.data.image_decode import _decode_all
from contrastive.modalities.image.datasets.sources import files_fingerprint, find_in, missing_data, prepared_dir, write_prepared
from contrastive.errors import ConfigError, DataError

KIND = "celeba"
FORMAT_VERSION = 1
IMAGE_DIR = "img_align_celeba"
ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
DEFAULT_ATTRIBUTES = ("Black_Hair", "Male", "Smiling")
CELEBA_URL = ("https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html (Align&Cropped images img_align_celeba.zip and "
              "the Anno/ and Eval/ text files)")
PARTITION_SPLIT = {0: "train", 1: "train", 2: "test"}


def celeba_dir(root: Path) -> Path:
    """The folder holding the CelebA layout (``root`` or ``root/celeba``); DataError naming the fix."""
    root = Path(root).expanduser()
    for folder in (root, find_in(root, relative="celeba", accept_self=False)):
        if folder is not None and all((folder / n).exists() for n in (IMAGE_DIR, ATTR_FILE, PARTITION_FILE)):
            return folder
    missing = [n for n in (IMAGE_DIR, ATTR_FILE, PARTITION_FILE) if not (root / n).exists()]
    raise missing_data(what="CelebA", path=root, get_from=CELEBA_URL, key="data.celeba.root",
                       expected=f"{IMAGE_DIR}/, {ATTR_FILE} and {PARTITION_FILE} (missing {', '.join(missing)})")


def read_attributes(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """``list_attr_celeba.txt`` -> (file names, attribute names, int8 (N, A) values in {-1, 1})."""
    lines = Path(path).read_text().splitlines()
    if len(lines) < 2 or not lines[0].strip().isdigit():
        raise DataError(f"{path} does not start with the image count and the attribute names: use the file "
                        f"from CelebA's Anno/ folder")
    names = lines[1].split()
    files, rows = [], []
    for number, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != len(names) + 1:
            raise DataError(f"{path} line {number} has {len(parts) - 1} values for {len(names)} attributes: the "
                            "file is damaged, fetch it again")
        files.append(parts[0])
        rows.append([int(v) for v in parts[1:]])
    if len(files) != int(lines[0]):
        raise DataError(f"{path} lists {len(files)} images but its first line says {lines[0].strip()}: the file is "
                        "truncated, fetch it again")
    return files, names, np.asarray(rows, dtype=np.int8).reshape(len(files), len(names))


def read_partition(path: Path) -> dict[str, int]:
    """``list_eval_partition.txt`` -> file name -> 0 (train), 1 (valid) or 2 (test)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = int(parts[1])
    return out


def balanced_rows(codes: np.ndarray, *, num_codes: int, rng: np.random.Generator,
                  cap: int | None = None) -> np.ndarray:
    """Sorted int64 rows keeping ``m`` of each code 0..num_codes-1, m = the rarest code's count (at most ``cap``),
    drawn with ``rng``.

    codes: int64 (n,) combination index of each candidate row.
    """
    counts = np.bincount(codes, minlength=num_codes)
    m = int(counts.min()) if cap is None else min(int(counts.min()), cap)
    keep = [rng.choice(np.flatnonzero(codes == c), size=m, replace=False) for c in range(num_codes)]
    return np.sort(np.concatenate(keep)).astype(np.int64)


def prepare_celeba(*, source: Path, root: Path, image_size: int = 64,
                   attributes: tuple[str, ...] | list[str] = DEFAULT_ATTRIBUTES, resample: bool = True,
                   max_per_combination: int | None = None, seed: int = 0) -> Path:
    """Build (or reuse) the resampled CelebA dataset under ``root``.

    Args:
        source: the CelebA folder (see the module docstring).
        attributes: CelebA attribute names (as in the file's header) that become the probes' attributes; the
            labels are 0 = absent, 1 = present.
        resample: make the attributes' combinations equally frequent per split (the paper's setting); False keeps
            every image.
        max_per_combination: with ``resample``, keep at most this many images of each combination per split
            (smaller runs that stay exactly balanced); None = the rarest combination's count.

    Returns:
        The dataset directory (images uint8 (N, image_size, image_size, 3), ids = file names).
    """
    folder = celeba_dir(source)
    files, names, values = read_attributes(folder / ATTR_FILE)
    unknown = [a for a in attributes if a not in names]
    if unknown:
        raise ConfigError(f"data.celeba.attributes {unknown} are not CelebA attributes; choose from {names}")
    params = {"format_version": FORMAT_VERSION, "source": str(folder.resolve()), "image_size": int(image_size),
              "attributes": list(attributes), "resample": bool(resample),
              "max_per_combination": max_per_combination,
              "seed": int(seed), "files_sha256": files_fingerprint([folder / ATTR_FILE, folder / PARTITION_FILE])}
    if (done := prepared_dir(root=root, kind=KIND, params=params)) is not None:
        return done
    partition = read_partition(folder / PARTITION_FILE)
    absent = [f for f in files if f not in partition]
    if absent:
        raise DataError(f"{len(absent)} images of {ATTR_FILE} have no line in {PARTITION_FILE} (e.g. {absent[0]}): "
                        "use the two files of the same CelebA release")
    labels = (values[:, [names.index(a) for a in attributes]] > 0).astype(np.int64)  # (N, A) 0/1
    codes = labels @ (1 << np.arange(len(attributes)))[::-1]
    split_of = np.asarray([PARTITION_SPLIT[partition[f]] for f in files])
    rng = np.random.default_rng(seed)
    rows = np.arange(len(files), dtype=np.int64)
    if resample:
        rows = np.sort(np.concatenate([
            rows[split_of == s][balanced_rows(codes[split_of == s], num_codes=2 ** len(attributes), rng=rng,
                                              cap=max_per_combination)] for s in ("train", "test")]))
    rel_paths = [f"{IMAGE_DIR}/{files[r]}" for r in rows]
    images = np.zeros((len(rows), image_size, image_size, 3), dtype=np.uint8)
    failures = _decode_all(folder, rel_paths, out=images, size=image_size)
    if failures:
        shown = "; ".join(f"{k} ({v})" for k, v in list(failures.items())[:3])
        raise DataError(f"{len(failures)} CelebA images could not be read, e.g. {shown}: re-extract "
                        f"img_align_celeba.zip into {folder}")
    return write_prepared(root=root, kind=KIND, params=params, images=images, ids=[files[r] for r in rows],
                          split=split_of[rows], attributes={a: ["no", "yes"] for a in attributes},
                          labels={a: labels[rows, i] for i, a in enumerate(attributes)})
