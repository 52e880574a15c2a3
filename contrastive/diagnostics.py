"""Embedding diagnostics per stage: what the cosine geometry looks like, and so whether a HEX threshold means
anything.

- same-group vs other-pair cosine distributions (groups = an attribute's labels, or a stage's k-means clusters),
  from sampled pairs (bounded memory at any N), with the AUC of "same-group pairs are more similar";
- anisotropy baseline: mean cosine of random pairs (Ethayarajh, 2019); a cosine means little above it;
- effective rank: exp of the entropy of the normalised singular values (Roy & Vetterli, 2007);
- alignment and uniformity (Wang & Isola, 2020) on L2-normalised embeddings:
      align = E_{(x, x+)} ||f(x) - f(x+)||^2,   uniform = log E_{x, y} exp(-2 ||f(x) - f(y)||^2);
  alignment needs two augmented views of the same samples, so it is computed only when they are given.

Everything takes numpy arrays; a modality that diagnoses its stages reads a stage's directories and calls
:func:`diagnose_embeddings` (the image modality: :mod:`contrastive.modalities.image.diagnostics`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from contrastive.plotting import locked_pyplot, save_figure

MIN_GROUP_SIZE = 2


# ---------------------------------------------------------------------------------------------------- pairs
def normalize_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def random_pairs(*, n: int, num_pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """num_pairs (i, j) drawn uniformly with i != j (j = i + a non-zero offset, mod n)."""
    i = rng.integers(0, n, size=num_pairs)
    j = (i + rng.integers(1, n, size=num_pairs)) % n
    return i, j


def same_group_pairs(*, groups: np.ndarray, num_pairs: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """num_pairs (i, j), i != j, both in the same group: i uniform over samples of known groups (>= 0) whose group
    holds at least two samples, j uniform over the other members of that group. O(N) memory via one sort."""
    groups = np.asarray(groups)
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.searchsorted(sorted_groups, sorted_groups, side="left")
    counts = np.searchsorted(sorted_groups, sorted_groups, side="right") - starts
    eligible = np.flatnonzero((sorted_groups >= 0) & (counts >= MIN_GROUP_SIZE))
    if eligible.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pos = eligible[rng.integers(0, eligible.size, size=num_pairs)]
    # An offset in 1..count-1 from the anchor's rank inside its group, wrapped: never the anchor itself.
    offset = 1 + (rng.random(num_pairs) * (counts[pos] - 1)).astype(np.int64)
    partner = starts[pos] + (pos - starts[pos] + offset) % counts[pos]
    return order[pos], order[partner]


def other_group_pairs(*, groups: np.ndarray, num_pairs: int, rng: np.random.Generator
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Up to num_pairs random pairs of known, different groups (rejection sampling from random pairs)."""
    groups = np.asarray(groups)
    known = np.flatnonzero(groups >= 0)
    if known.size < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kept_i, kept_j, total = [], [], 0
    for _ in range(8):  # 8 rounds of 2x oversampling: enough unless one group holds nearly everything
        a, b = random_pairs(n=known.size, num_pairs=2 * num_pairs, rng=rng)
        i, j = known[a], known[b]
        keep = groups[i] != groups[j]
        kept_i.append(i[keep])
        kept_j.append(j[keep])
        total += int(keep.sum())
        if total >= num_pairs:
            break
    return np.concatenate(kept_i)[:num_pairs], np.concatenate(kept_j)[:num_pairs]


def pair_cosines(*, unit: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Cosines of the pairs (i, j) of row-normalised embeddings (N, D) -> (P,)."""
    return np.einsum("pd,pd->p", unit[i], unit[j])


# ---------------------------------------------------------------------------------------------------- numbers
def rank_auc(*, positives: np.ndarray, negatives: np.ndarray) -> float:
    """P(a same-group cosine > an other-pair cosine) + P(tie) / 2 (Mann-Whitney U / (n_pos n_neg))."""
    if len(positives) == 0 or len(negatives) == 0:
        return float("nan")
    from scipy.stats import rankdata
    ranks = rankdata(np.concatenate([positives, negatives]))
    u = ranks[: len(positives)].sum() - len(positives) * (len(positives) + 1) / 2
    return float(u / (len(positives) * len(negatives)))


def effective_rank(embeddings: np.ndarray) -> float:
    """exp(H(p)), p = singular values / their sum (Roy & Vetterli, 2007): 1 for a rank-one (collapsed) matrix,
    D for one whose D singular values are equal."""
    singular = np.linalg.svd(np.asarray(embeddings, dtype=np.float64), compute_uv=False)
    p = singular / max(singular.sum(), 1e-300)
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def alignment(*, view1: np.ndarray, view2: np.ndarray, alpha: float = 2.0) -> float:
    """Wang & Isola (2020) alignment: E ||f(x) - f(x+)||_2^alpha over positive pairs (rows), normalised rows."""
    diff = normalize_rows(view1) - normalize_rows(view2)
    return float((np.linalg.norm(diff, axis=1) ** alpha).mean())


def uniformity(*, unit: np.ndarray, i: np.ndarray, j: np.ndarray, t: float = 2.0) -> float:
    """Wang & Isola (2020) uniformity: log E exp(-t ||f(x) - f(y)||^2) over sampled pairs of normalised rows.
    For unit vectors ||a - b||^2 = 2 - 2 cos(a, b)."""
    squared = 2.0 - 2.0 * pair_cosines(unit=unit, i=i, j=j).astype(np.float64)
    return float(np.log(np.mean(np.exp(-t * squared))))


@dataclass
class Diagnosis:
    """Numbers (to log) and the sampled cosines they came from (to plot)."""

    metrics: dict[str, float]
    random_cosines: np.ndarray
    group_cosines: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # name -> (same, other)


def diagnose_embeddings(*, embeddings: np.ndarray, groupings: dict[str, np.ndarray] | None = None,
                        views: tuple[np.ndarray, np.ndarray] | None = None, num_pairs: int = 20_000,
                        max_rank_samples: int = 20_000, seed: int = 0) -> Diagnosis:
    """All diagnostics of one embedding matrix.

    embeddings: (N, D). groupings: name -> (N,) int labels (-1 = unknown), e.g. {"color": ..., "clusters": ...}.
    views: optional two (V, D) embeddings of two augmentations of the same V samples, for alignment.
    Memory is O(num_pairs * D) for the pairs and O(max_rank_samples * D) for the SVD, whatever N.
    Metric names: diag/anisotropy, diag/effective_rank, diag/uniformity, diag/alignment (with views),
    diag/<grouping>/{same_mean, same_std, other_mean, other_std, gap, auc}.
    """
    rng = np.random.default_rng(seed)
    unit = normalize_rows(embeddings)
    n = len(unit)
    i, j = random_pairs(n=n, num_pairs=num_pairs, rng=rng)
    random_cos = pair_cosines(unit=unit, i=i, j=j)
    rows = rng.choice(n, size=min(n, max_rank_samples), replace=False)
    metrics = {"diag/anisotropy": float(random_cos.mean()), "diag/effective_rank": effective_rank(embeddings[rows]),
               "diag/dim": float(unit.shape[1]), "diag/uniformity": uniformity(unit=unit, i=i, j=j)}
    if views is not None:
        metrics["diag/alignment"] = alignment(view1=views[0], view2=views[1])
    group_cosines = {}
    for name, labels in (groupings or {}).items():
        same = _sampled_cosines(unit=unit, sampler=same_group_pairs, groups=labels, num_pairs=num_pairs, rng=rng)
        other = _sampled_cosines(unit=unit, sampler=other_group_pairs, groups=labels, num_pairs=num_pairs, rng=rng)
        if len(same) == 0 or len(other) == 0:
            continue  # a grouping with one group, or only singletons, says nothing
        group_cosines[name] = (same, other)
        metrics.update({f"diag/{name}/same_mean": float(same.mean()), f"diag/{name}/same_std": float(same.std()),
                        f"diag/{name}/other_mean": float(other.mean()), f"diag/{name}/other_std": float(other.std()),
                        f"diag/{name}/gap": float(same.mean() - other.mean()),
                        f"diag/{name}/auc": rank_auc(positives=same, negatives=other)})
    return Diagnosis(metrics=metrics, random_cosines=random_cos, group_cosines=group_cosines)


def _sampled_cosines(*, unit: np.ndarray, sampler: Callable, groups: np.ndarray, num_pairs: int,
                     rng: np.random.Generator) -> np.ndarray:
    i, j = sampler(groups=np.asarray(groups), num_pairs=num_pairs, rng=rng)
    return pair_cosines(unit=unit, i=i, j=j)


# ---------------------------------------------------------------------------------------------------- plot
def plot_similarity_histograms(*, diagnosis: Diagnosis, path: Path, title: str = "") -> Path:
    """One panel per grouping: histograms of same-group and other-pair cosines, with the random-pair mean
    (anisotropy baseline) as a dashed line. Without groupings, one panel of random-pair cosines."""
    with locked_pyplot() as plt:
        panels = list(diagnosis.group_cosines.items()) or [("random pairs", (None, diagnosis.random_cosines))]
        fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.0), squeeze=False)
        bins = np.linspace(-1.0, 1.0, 81)
        baseline = float(diagnosis.random_cosines.mean())
        for ax, (name, (same, other)) in zip(axes[0], panels):
            # One filled step artist per histogram (ax.stairs), not ax.hist's 80 bar patches: the same picture,
            # drawn and saved in a fraction of the time.
            ax.stairs(np.histogram(other, bins=bins, density=True)[0], bins, fill=True, alpha=0.55,
                      label="other pairs")
            if same is not None:
                ax.stairs(np.histogram(same, bins=bins, density=True)[0], bins, fill=True, alpha=0.55,
                          label="same group", color="C1")
            ax.axvline(baseline, color="k", linestyle="--", linewidth=1, label=f"random mean {baseline:.2f}")
            ax.set_title(name)
            ax.set_xlabel("cosine similarity")
            ax.legend(fontsize=7)
        if title:
            fig.suptitle(title, fontsize=9)
        return save_figure(plt, fig, path, dpi=110)
