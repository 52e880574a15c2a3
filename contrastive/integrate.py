"""Cross-stage integration of MCL representations."""
from __future__ import annotations

import numpy as np


def l2_normalize(x: np.ndarray, *, eps: float = 1e-12) -> np.ndarray:
    """Rows of (N, D) scaled to unit L2 norm."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), eps)


def concat_normalized(*, stage_embeddings: list[np.ndarray]) -> np.ndarray:
    """MCL's final representation: Z = [Z_0 / |Z_0|, ..., Z_{N-1} / |Z_{N-1}|], shape (N, sum_j D_j).

    Normalising each stage first keeps a stage with larger activations from dominating distances and probes.
    """
    if not stage_embeddings:
        raise ValueError("need at least one stage's embeddings")
    lengths = {len(z) for z in stage_embeddings}
    if len(lengths) != 1:
        raise ValueError(f"stages disagree on the number of samples: {sorted(lengths)}")
    return np.concatenate([l2_normalize(z.astype(np.float32)) for z in stage_embeddings], axis=1)
