"""Checks shared by the export tests of every modality."""
from pathlib import Path

import numpy as np

from contrastive.embeddings import load_embeddings


def assert_bf16_export_close_to_fp32(fp32_dir: Path, bf16_dir: Path) -> None:
    """The same ids in the same order; bf16 autocast did run (values differ) and keeps 8 bits of mantissa: each
    entry of the (unit-scale) embeddings within 0.02 of fp32 and every row's cosine to its fp32 row >= 0.999."""
    ids32, z32 = load_embeddings(directory=fp32_dir)
    ids16, z16 = load_embeddings(directory=bf16_dir)
    assert ids16.tolist() == ids32.tolist()
    assert not np.array_equal(z16, z32)
    cosine = (z16 * z32).sum(1) / np.linalg.norm(z16, axis=1) / np.linalg.norm(z32, axis=1)
    assert cosine.min() > 0.999
    assert np.abs(z16 - z32).max() < 0.02
