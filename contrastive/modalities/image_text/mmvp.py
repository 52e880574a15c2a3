"""MMVP-VLM-style pair benchmark (Tong et al., 2024, "Eyes Wide Shut? Exploring the Visual Shortcomings of
Multimodal LLMs"): pairs of images that CLIP embeds alike although they differ visibly, one statement per image.

Scoring (as the upstream ``evaluate_vlm.py``): for each statement, the model picks the image of the pair it is more
similar to (softmax over the two images > 0.5 is the same as a strictly larger similarity). A pair counts only if
BOTH statements pick their own image. Accuracy is reported per category and as the mean over categories, in percent
like the paper (MCL reports ViT-L-14 MMVP average 20.0 for OpenAI CLIP and 32.6 for its 4-stage concatenation).
Ties count as wrong for both statements (upstream counts a tie as "image 2", which favours the second statement).

Two directory formats are read:

``pairs.csv`` (mclpipe's own; paths relative to the directory)::

    category,image_a,image_b,statement_a,statement_b
    Orientation and Direction,images/0.png,images/1.png,a red horizontally striped circle,a red vertically ...

The upstream MMVP_VLM layout (``huggingface.co/datasets/MMVP/MMVP_VLM``)::

    Questions.csv             Question ID,Type,Statement   (rows 2k-1 and 2k form a pair; statement i is true of
    MLLM_VLM Images/<Type>/<Question ID>.jpg                image i)

For the concatenation of stages, image and text embeddings are L2-normalised per stage and concatenated, so the
similarity of a statement and an image is the sum of the stages' cosine similarities.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from contrastive.errors import ConfigError, DataError

CATEGORIES = (
    "Orientation and Direction", "Presence of Specific Features", "State and Condition", "Quantity and Count",
    "Positional and Relational Context", "Color and Appearance", "Structural Characteristics", "Texts",
    "Viewpoint and Perspective",
)
PAIRS_FILE = "pairs.csv"
PAIRS_COLUMNS = ("category", "image_a", "image_b", "statement_a", "statement_b")
UPSTREAM_QUESTIONS = "Questions.csv"
UPSTREAM_IMAGES = "MLLM_VLM Images"


@dataclass(frozen=True)
class MmvpPair:
    category: str
    image_a: Path
    image_b: Path
    statement_a: str
    statement_b: str


def slug(category: str) -> str:
    """"Color and Appearance" -> "color_and_appearance" (an MLflow-safe metric name)."""
    return re.sub(r"[^a-z0-9]+", "_", category.lower()).strip("_")


# ---------------------------------------------------------------------------------------------------- reading
def read_mmvp(directory: Path) -> list[MmvpPair]:
    """The pairs of an MMVP directory in either format (see module docstring), images checked to exist."""
    directory = Path(directory)
    if (directory / PAIRS_FILE).is_file():
        pairs = _read_pairs_csv(directory)
    elif (directory / UPSTREAM_QUESTIONS).is_file():
        pairs = _read_upstream(directory)
    else:
        raise DataError(f"{directory} holds neither {PAIRS_FILE} nor {UPSTREAM_QUESTIONS}: point eval.mmvp_dir at a "
                        "local copy of MMVP_VLM (docs/clip.md) or at a directory in mclpipe's pairs.csv format")
    if not pairs:
        raise DataError(f"{directory} lists no MMVP pairs")
    missing = [p for pair in pairs for p in (pair.image_a, pair.image_b) if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} MMVP images are missing (e.g. {missing[0]}); copy the whole benchmark "
                        "directory")
    return pairs


def _read_pairs_csv(directory: Path) -> list[MmvpPair]:
    with open(directory / PAIRS_FILE, newline="") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != PAIRS_COLUMNS:
            raise DataError(f"{directory / PAIRS_FILE} must have the columns {','.join(PAIRS_COLUMNS)}, got "
                            f"{reader.fieldnames}")
        return [MmvpPair(category=row["category"], image_a=directory / row["image_a"],
                         image_b=directory / row["image_b"], statement_a=row["statement_a"],
                         statement_b=row["statement_b"]) for row in reader]


def _read_upstream(directory: Path) -> list[MmvpPair]:
    with open(directory / UPSTREAM_QUESTIONS, newline="") as handle:
        rows = [row for row in csv.reader(handle)][1:]
    if len(rows) % 2:
        raise DataError(f"{directory / UPSTREAM_QUESTIONS} has an odd number of statements; pairs are consecutive "
                        "rows")
    pairs = []
    for first, second in zip(rows[0::2], rows[1::2]):
        (qid_a, category, statement_a), (qid_b, _, statement_b) = first[:3], second[:3]
        images = directory / UPSTREAM_IMAGES / category
        pairs.append(MmvpPair(category=category, image_a=images / f"{int(qid_a)}.jpg",
                              image_b=images / f"{int(qid_b)}.jpg", statement_a=statement_a,
                              statement_b=statement_b))
    return pairs


def pair_images(pairs: list[MmvpPair]) -> list[Image.Image]:
    """RGB images in the order [a_0, b_0, a_1, b_1, ...]."""
    out = []
    for pair in pairs:
        for path in (pair.image_a, pair.image_b):
            with Image.open(path) as image:
                out.append(image.convert("RGB"))
    return out


def pair_statements(pairs: list[MmvpPair], *, prompt: str = "a photo of ") -> list[str]:
    """Statements in the order [a_0, b_0, a_1, ...], prefixed with ``prompt`` (upstream uses "a photo of ")."""
    return [prompt + s for pair in pairs for s in (pair.statement_a, pair.statement_b)]


# ---------------------------------------------------------------------------------------------------- scoring
def pair_similarities(*, image_features: np.ndarray, text_features: np.ndarray) -> np.ndarray:
    """(P, 2, 2) with [p, i, j] = <statement i of pair p, image j of pair p>.

    image_features, text_features: (2P, D), rows ordered [a_0, b_0, a_1, b_1, ...] (see pair_images), already
    normalised (per stage, then concatenated for several stages).
    """
    if image_features.shape != text_features.shape or image_features.shape[0] % 2:
        raise ValueError(f"need (2P, D) image and text features, got {image_features.shape} and "
                         f"{text_features.shape}")
    images = image_features.reshape(-1, 2, image_features.shape[1])
    texts = text_features.reshape(-1, 2, text_features.shape[1])
    return np.einsum("pid,pjd->pij", texts.astype(np.float64), images.astype(np.float64))


def mmvp_scores(*, similarities: np.ndarray, categories: list[str]) -> dict[str, float]:
    """{"mmvp/average": %, "mmvp/<category slug>": %, "count/mmvp_pairs": P} from (P, 2, 2) pair similarities.

    A pair is correct iff statement a is strictly closer to image a than to image b AND statement b strictly
    closer to image b than to image a. The average is the mean of the per-category accuracies (equal to the overall
    accuracy when categories have equal sizes, as in MMVP-VLM's 15 pairs x 9 categories).
    """
    if similarities.ndim != 3 or similarities.shape[1:] != (2, 2) or len(categories) != similarities.shape[0]:
        raise ValueError(f"need (P, 2, 2) similarities and P categories, got {similarities.shape} and "
                         f"{len(categories)}")
    correct = (similarities[:, 0, 0] > similarities[:, 0, 1]) & (similarities[:, 1, 1] > similarities[:, 1, 0])
    names = np.asarray(categories)
    scores = {}
    for category in dict.fromkeys(categories):
        scores[f"mmvp/{slug(category)}"] = 100.0 * float(correct[names == category].mean())
    scores["mmvp/average"] = float(np.mean(list(scores.values())))
    scores["count/mmvp_pairs"] = float(len(categories))
    return scores


# ---------------------------------------------------------------------------------------------------- tiny writer
# Which attribute the two images of a pair differ in, per category (the others are equal). Stripe orientation
# stands in for "orientation", colour for "appearance" and "texts", shape for the structural categories.
_DIFFERENCE = {
    "Orientation and Direction": "texture", "Presence of Specific Features": "texture",
    "State and Condition": "texture", "Quantity and Count": "shape", "Positional and Relational Context": "shape",
    "Color and Appearance": "color", "Structural Characteristics": "shape", "Texts": "color",
    "Viewpoint and Perspective": "shape",
}


def write_tiny_mmvp(*, directory: Path, pairs_per_category: int = 2, image_size: int = 32, num_colors: int = 4,
                    num_shapes: int = 4, num_textures: int = 4, seed: int = 0) -> dict:
    """Write a synthetic MMVP directory in pairs.csv format: 9 categories x ``pairs_per_category`` pairs of
    Trifeature images that differ in exactly one attribute, each with its caption as statement. Idempotent."""
    from contrastive.modalities.image_text.data import caption_for
    from contrastive.modalities.image.datasets.trifeature import COLOR_NAMES, SHAPE_NAMES, TEXTURE_NAMES, generate_trifeature

    directory = Path(directory)
    if (directory / PAIRS_FILE).is_file():
        return {"dir": str(directory), "pairs": len(read_mmvp(directory))}
    if pairs_per_category < 1:
        raise ConfigError(f"pairs_per_category must be >= 1, got {pairs_per_category}")
    pool = 12 * num_colors * num_shapes * num_textures  # enough to find pairs differing in one attribute
    images, labels = generate_trifeature(num_train=pool, num_test=0, image_size=image_size, num_colors=num_colors,
                                         num_shapes=num_shapes, num_textures=num_textures, seed=seed + 10_007)
    attrs = np.stack([labels["color"], labels["shape"], labels["texture"]], axis=1)
    names = {"color": COLOR_NAMES, "shape": SHAPE_NAMES, "texture": TEXTURE_NAMES}
    axis = {"color": 0, "shape": 1, "texture": 2}
    rng = np.random.default_rng(seed)
    tmp = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "images").mkdir(parents=True)
    rows, used, count = [], set(), 0
    for category in CATEGORIES:
        differ = axis[_DIFFERENCE[category]]
        same = [a for a in range(3) if a != differ]
        made = 0
        for a in rng.permutation(pool):
            if made == pairs_per_category:
                break
            candidates = np.flatnonzero((attrs[:, same] == attrs[a, same]).all(axis=1)
                                        & (attrs[:, differ] != attrs[a, differ]))
            candidates = [c for c in candidates if c not in used and c != a]
            if a in used or not candidates:
                continue
            b = int(rng.choice(candidates))
            used.update((int(a), b))
            files = []
            for index in (int(a), b):
                name = f"images/{count}.png"
                Image.fromarray(images[index]).save(tmp / name)
                files.append(name)
                count += 1
            statements = [caption_for(**{k: names[k][attrs[i, axis[k]]] for k in axis}) for i in (int(a), b)]
            rows.append([category, *files, *statements])
            made += 1
        if made < pairs_per_category:
            raise ConfigError(f"could not draw {pairs_per_category} pairs for {category!r}; lower pairs_per_category")
    with open(tmp / PAIRS_FILE, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(PAIRS_COLUMNS)
        writer.writerows(rows)
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, directory)
    return {"dir": str(directory), "pairs": len(rows)}
