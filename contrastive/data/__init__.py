"""Data plumbing every modality shares: the prepared on-disk format (``images.npy`` or a file index +
``index.npz`` + ``manifest.json``, :mod:`contrastive.data.dataset`), image decoding, file-backed and tar-shard
readers, worker pools and loading. A modality's own datasets live in its package
(:mod:`contrastive.modalities.image.datasets`).
"""
from contrastive.data.dataset import ImageArrayDataset, compute_digest

__all__ = ["ImageArrayDataset", "compute_digest"]
