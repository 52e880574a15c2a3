"""Datasets: Trifeature-style synthetic images, a user's image folder, and the prepared on-disk format.

Every source is turned once into the same format (``images.npy`` + ``index.npz`` + ``manifest.json``, see
:mod:`contrastive.data.dataset`) and read back with :class:`ImageArrayDataset`.
"""
from contrastive.data.dataset import ImageArrayDataset, compute_digest
from contrastive.data.image_folder import IMAGE_EXTENSIONS, prepare_image_folder
from contrastive.data.trifeature import (COLOR_NAMES, COLOR_PALETTE, SHAPE_NAMES, TEXTURE_NAMES,
                                         generate_trifeature, prepare_trifeature)

__all__ = [
    "ImageArrayDataset",
    "compute_digest",
    "IMAGE_EXTENSIONS",
    "prepare_image_folder",
    "COLOR_NAMES",
    "COLOR_PALETTE",
    "SHAPE_NAMES",
    "TEXTURE_NAMES",
    "generate_trifeature",
    "prepare_trifeature",
]
