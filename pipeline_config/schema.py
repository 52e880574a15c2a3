"""A pipeline config as the flow runs it: a modality's ``CONFIG`` (its own sections on the library's shared ones,
:mod:`contrastive.settings`) plus the ``launcher`` section (where a stage's processes run,
:mod:`pipeline_config.launcher`).

The library types what a pipeline computes and never imports this layer; where its stages run is added here,
because the launcher section's types build the launchers. :func:`config_class` is the class the loader validates
a config with (``pipeline:`` picks the modality through ``contrastive.modalities.registry``); it keeps the
modality class's name and is reachable as this module's attribute of that name (``pipeline_config.schema.
ImagePipelineConfig``), so a config pickles by reference. The shared sections are re-exported for the layers
above (tasks and flows type their ``config`` arguments with ``_PipelineBase``).
"""
from __future__ import annotations

import functools

from pydantic import Field, model_validator

from contrastive.modalities.registry import config_class_for, keys
from contrastive.settings import (NOT_IN_KEY, DistributedConfig, EvalConfig, LoopSettings, MclConfig,
                                  ScheduleConfig, StageClusteringConfig, TrackingConfig, _deep_merge, _PipelineBase,
                                  _Section, digest_of, in_process_only_message)
from pipeline_config.launcher import LauncherConfig, check_launcher
from pipeline_config.run_policy import RunPolicyConfig

__all__ = ["NOT_IN_KEY", "DistributedConfig", "EvalConfig", "LauncherConfig", "LoopSettings", "MclConfig",
           "ScheduleConfig", "StageClusteringConfig", "TrackingConfig", "_PipelineBase", "_Section", "_deep_merge",
           "config_class", "config_union", "digest_of"]


def _launcher_fits(self):
    if self.IN_PROCESS_ONLY and self.launcher.kind != "local":
        raise ValueError(in_process_only_message(self))
    check_launcher(self)
    return self


@functools.cache
def _with_launcher(base: type[_PipelineBase]) -> type[_PipelineBase]:
    """``base`` (a modality's ``CONFIG``) with the ``launcher`` and ``run_policy`` sections and the launcher's
    checks; one class per ``base``."""
    namespace = {
        "__module__": __name__, "__qualname__": base.__name__, "__doc__": base.__doc__,
        "__annotations__": {"launcher": LauncherConfig, "run_policy": RunPolicyConfig},
        # Where stages run and what a deployment's runs may change, never what they compute: outside every
        # content key.
        "launcher": Field(LauncherConfig(), **NOT_IN_KEY),
        "run_policy": Field(RunPolicyConfig(), **NOT_IN_KEY),
        "_launcher_fits": model_validator(mode="after")(_launcher_fits),
    }
    return type(base.__name__, (base,), namespace)


def config_class(pipeline: str) -> type[_PipelineBase]:
    """The pipeline config class of ``pipeline: <key>``: the modality's ``CONFIG`` with the ``launcher`` section."""
    return _with_launcher(config_class_for(pipeline))


def config_union():
    """Every modality's pipeline config as one type, told apart by ``pipeline``: what the one pipeline flow
    takes, so Prefect validates a deployment's parameters against the right class (and its UI shows the form).
    A modality registered at run time is part of it when registered before the flow module is imported."""
    from typing import Annotated, Union
    classes = tuple(dict.fromkeys(config_class(key) for key in keys()))
    return Annotated[Union[classes], Field(discriminator="pipeline")]


def __getattr__(name: str):
    """``pipeline_config.schema.<a modality's CONFIG name>``: that class with the launcher section (what pickle
    looks up to load a config)."""
    for key in keys():
        if config_class_for(key).__name__ == name:
            return config_class(key)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
