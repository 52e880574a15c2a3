"""The modalities of the one MCL pipeline: the config's ``pipeline:`` key -> the package that implements it.

Adding a modality is one line here plus its package (``contrastive/modalities/<package>/`` with ``modality.py``
exposing ``MODALITY`` and ``config.py`` exposing ``CONFIG``; see ``contrastive.modalities.base``), or, for a
modality that lives elsewhere (a plug-in, a test's), one call of :func:`register` before its config is loaded.
Packages are imported on first use, so loading one modality (the registered MLflow model serving images, say)
never imports another's dependencies.
"""
from __future__ import annotations

from importlib import import_module

from contrastive.errors import ConfigError
from contrastive.modalities.base import Modality

#: pipeline key -> package under contrastive/modalities/.
PACKAGES: dict[str, str] = {
    "image": "image",
    "clip": "image_text",
    "text": "text",
    "embeddings": "embeddings",
}

#: Old keys still read: ``mcl`` named the image pipeline before ``image`` did (configs, deployments and the
#: registered MLflow models of earlier runs store it).
ALIASES: dict[str, str] = {"mcl": "image"}

#: Modalities registered at run time (:func:`register`): pipeline key -> (modality, pipeline config class).
_REGISTERED: dict[str, tuple[Modality, type]] = {}


def register(modality: Modality, config_class: type) -> None:
    """Make ``pipeline: <modality.name>`` select ``modality`` and validate with ``config_class`` in this process,
    for a modality that is not a package under contrastive/modalities/ (registered again: replaced)."""
    key = modality.name
    if key in PACKAGES or key in ALIASES:
        raise ConfigError(f"pipeline key {key!r} is a built-in modality's; give the new modality another name")
    _REGISTERED[key] = (modality, config_class)


def keys() -> list[str]:
    """Every pipeline key this process knows: the packages', then the registered ones."""
    return [*PACKAGES, *_REGISTERED]


def canonical(pipeline: str) -> str:
    """The current key of ``pipeline`` (an old alias's replacement, else itself)."""
    return ALIASES.get(pipeline, pipeline)


def _package(pipeline: str) -> str:
    try:
        return PACKAGES[canonical(pipeline)]
    except KeyError:
        raise ConfigError(f"pipeline: {pipeline!r} is not a pipeline kind; use one of {', '.join(keys())}") from None


def modality_for(pipeline: str) -> Modality:
    """The modality a config's ``pipeline:`` key selects."""
    if pipeline in _REGISTERED:
        return _REGISTERED[pipeline][0]
    return import_module(f"contrastive.modalities.{_package(pipeline)}.modality").MODALITY


def config_class_for(pipeline: str) -> type:
    """The pipeline config class (pydantic) of ``pipeline: <key>``."""
    if pipeline in _REGISTERED:
        return _REGISTERED[pipeline][1]
    return import_module(f"contrastive.modalities.{_package(pipeline)}.config").CONFIG
