"""Isotropy and learning-dynamics diagnostics of "On Isotropy and Learning Dynamics of Contrastive-based Sentence
Representation Learning" (after Ethayarajh 2019 and Mu & Viswanath 2018), on numpy arrays.

- anisotropy baseline: E_{u,v} cos(u, v) over random pairs (the paper's eq. 1 / 3): ~1 in a narrow cone, ~0 when
  isotropic;
- partition-function isotropy I(W) = min_c Z(c) / max_c Z(c), Z(c) = sum_w exp(c^T w), c over the eigenvectors of
  W^T W (Mu & Viswanath): ~1 for an isotropic Gaussian cloud, ~0 for a rank-1 cone;
- the spread toward the origin: mean L2 norm of the vectors and the norm of their mean;
- intra-sentence similarity: mean over a sentence's tokens of cos(token, mean of the sentence's tokens);
- self-similarity of a word: mean cos between its representations in different sentences; frequent (function)
  versus content words.
The adjusted versions subtract the anisotropy baseline of the same representations, as the paper does.
"""
from __future__ import annotations

import numpy as np


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def average_random_cosine(x: np.ndarray, *, num_pairs: int = 10_000, seed: int = 0) -> float:
    """Mean cos(x_i, x_j) over ``num_pairs`` random pairs i != j of the rows of x (N, D)."""
    n = len(x)
    if n < 2:
        return float("nan")
    rng = np.random.default_rng(seed)
    i = rng.integers(0, n, size=num_pairs)
    j = (i + rng.integers(1, n, size=num_pairs)) % n  # never i itself
    unit = _unit(x)
    return float(np.einsum("pd,pd->p", unit[i], unit[j]).mean())


def partition_isotropy(x: np.ndarray, *, center: bool = False) -> float:
    """I(W) = min_c Z(c) / max_c Z(c) with Z(c) = sum_i exp(c^T w_i), c the unit eigenvectors of W^T W
    (Mu & Viswanath 2018, "All-but-the-top", sec. on isotropy). W: (N, D) rows. Computed in log space."""
    w = np.asarray(x, dtype=np.float64)
    if center:
        w = w - w.mean(axis=0)
    _, vectors = np.linalg.eigh(w.T @ w)
    logits = w @ vectors  # (N, D): c_k^T w_i for every eigenvector c_k
    top = logits.max(axis=0)
    log_z = top + np.log(np.exp(logits - top).sum(axis=0))
    return float(np.exp(log_z.min() - log_z.max()))


def norm_stats(x: np.ndarray) -> dict[str, float]:
    """Mean L2 norm of the rows and the L2 norm of their mean (distance of the centroid from the origin)."""
    x = np.asarray(x, dtype=np.float64)
    return {"mean_norm": float(np.linalg.norm(x, axis=1).mean()), "centroid_norm": float(np.linalg.norm(x.mean(0)))}


def intra_sentence_similarity(states: np.ndarray, mask: np.ndarray) -> float:
    """states (S, L, D) token representations, mask (S, L) {0,1}. Per sentence: the mean over its tokens of
    cos(token, sentence mean vector) (Ethayarajh 2019); averaged over sentences with >= 2 tokens."""
    values = []
    for tokens, keep in zip(states, mask.astype(bool)):
        kept = np.asarray(tokens[keep], dtype=np.float64)
        if len(kept) < 2:
            continue
        centroid = _unit(kept.mean(axis=0))
        values.append(float((_unit(kept) @ centroid).mean()))
    return float(np.mean(values)) if values else float("nan")


def self_similarity(states: np.ndarray, mask: np.ndarray, token_ids: np.ndarray, *,
                    max_occurrences: int = 50) -> dict[int, float]:
    """{token id: mean pairwise cos of its representations in DIFFERENT sentences}, for tokens that occur in at
    least two sentences (the first occurrence per sentence, at most ``max_occurrences`` sentences)."""
    where: dict[int, list[tuple[int, int]]] = {}
    for s, (ids, keep) in enumerate(zip(token_ids, mask.astype(bool))):
        seen = set()
        for position in np.flatnonzero(keep):
            token = int(ids[position])
            if token in seen:
                continue
            seen.add(token)
            where.setdefault(token, []).append((s, position))
    result = {}
    for token, places in where.items():
        if len(places) < 2:
            continue
        places = places[:max_occurrences]
        unit = _unit(np.stack([states[s, p] for s, p in places]))
        gram = unit @ unit.T
        n = len(unit)
        result[token] = float((gram.sum() - np.trace(gram)) / (n * n - n))
    return result


def frequent_vs_content(self_sims: dict[int, float], frequencies: dict[int, int], *,
                        num_frequent: int) -> dict[str, float]:
    """Mean self-similarity of the ``num_frequent`` most frequent tokens and of the rest."""
    ranked = sorted(self_sims, key=lambda t: (-frequencies.get(t, 0), t))
    frequent, content = ranked[:num_frequent], ranked[num_frequent:]
    mean = lambda ts: float(np.mean([self_sims[t] for t in ts])) if ts else float("nan")  # noqa: E731
    return {"self_similarity_frequent": mean(frequent), "self_similarity_content": mean(content)}


def isotropy_report(*, states: np.ndarray, mask: np.ndarray, token_ids: np.ndarray, sentences: np.ndarray,
                    skip_tokens: tuple[int, ...] = (), num_frequent: int = 10, num_pairs: int = 10_000,
                    seed: int = 0) -> dict[str, float]:
    """Every diagnostic for one model on one probe set.

    states (S, L, D) output-layer token states; mask (S, L); token_ids (S, L); sentences (S, D) pooled
    embeddings. ``skip_tokens`` (e.g. [CLS]) are left out of the token-level measures. Returns {name: value}:
    token_anisotropy, sentence_anisotropy, sentence_isotropy_I, token_mean_norm, token_centroid_norm,
    sentence_mean_norm, intra_sentence[_adjusted], self_similarity_frequent/content[_adjusted].
    """
    keep = mask.astype(bool) & ~np.isin(token_ids, np.asarray(skip_tokens, dtype=token_ids.dtype))
    flat = states[keep]
    baseline = average_random_cosine(flat, num_pairs=num_pairs, seed=seed)
    intra = intra_sentence_similarity(states, keep)
    counts = np.bincount(token_ids[keep].ravel())
    frequencies = {int(t): int(c) for t, c in enumerate(counts) if c}
    split = frequent_vs_content(self_similarity(states, keep, token_ids), frequencies, num_frequent=num_frequent)
    tokens = norm_stats(flat)
    report = {"token_anisotropy": baseline,
              "sentence_anisotropy": average_random_cosine(sentences, num_pairs=num_pairs, seed=seed),
              "sentence_isotropy_I": partition_isotropy(sentences),
              "token_mean_norm": tokens["mean_norm"], "token_centroid_norm": tokens["centroid_norm"],
              "sentence_mean_norm": norm_stats(sentences)["mean_norm"],
              "intra_sentence": intra, "intra_sentence_adjusted": intra - baseline}
    for name, value in split.items():
        report[name] = value
        report[f"{name}_adjusted"] = value - baseline
    return report


PLOTTED = ("token_anisotropy", "sentence_anisotropy", "sentence_isotropy_I", "intra_sentence_adjusted",
           "self_similarity_frequent_adjusted", "self_similarity_content_adjusted", "token_mean_norm",
           "sentence_mean_norm")


def plot_isotropy_history(*, history: list[dict[str, float]], path, title: str = ""):
    """One panel per diagnostic against the training step (the paper's figures 8-11 for one run)."""
    from contrastive.plotting import locked_pyplot, save_figure

    steps = [h["step"] for h in history]
    with locked_pyplot() as plt:
        fig, axes = plt.subplots(2, 4, figsize=(14, 6))
        for ax, name in zip(axes.ravel(), PLOTTED):
            ax.plot(steps, [h.get(name, float("nan")) for h in history], marker="o", markersize=3)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
        fig.suptitle(title or "isotropy over training")
        return save_figure(plt, fig, path, dpi=90)
