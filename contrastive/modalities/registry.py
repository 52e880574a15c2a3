"""The modalities of the one MCL pipeline: the config's ``pipeline:`` key -> the package that implements it.

Adding a modality is one line here plus its package (``contrastive/modalities/<package>/`` with ``modality.py``
exposing ``MODALITY`` and ``config.py`` exposing ``CONFIG``; see ``contrastive.modalities.base``). Packages are
imported on first use, so loading one modality (the registered MLflow model serving images, say) never imports
another's dependencies.
"""
from __future__ import annotations

from importlib import import_module

from contrastive.errors import ConfigError
from contrastive.modalities.base import Modality

#: pipeline key -> package under contrastive/modalities/ (``mcl`` is the image pipeline's key, kept for history).
PACKAGES: dict[str, str] = {
    "mcl": "image",
    "clip": "image_text",
    "text": "text",
    "embeddings": "embeddings",
}


def _package(pipeline: str) -> str:
    try:
        return PACKAGES[pipeline]
    except KeyError:
        raise ConfigError(f"pipeline: {pipeline!r} is not a pipeline kind; use one of {', '.join(PACKAGES)}") from None


def modality_for(pipeline: str) -> Modality:
    """The modality a config's ``pipeline:`` key selects."""
    return import_module(f"contrastive.modalities.{_package(pipeline)}.modality").MODALITY


def config_class_for(pipeline: str) -> type:
    """The pipeline config class (pydantic) of ``pipeline: <key>``."""
    return import_module(f"contrastive.modalities.{_package(pipeline)}.config").CONFIG
