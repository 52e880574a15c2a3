"""The registered model of a pipeline: :class:`EncoderModel`, an MLflow pyfunc model over the stage models of any
modality, and :func:`save_encoder`, which writes it with its signature, pinned requirements and the ``contrastive``
package as its code.

The class is pickled by value (this module's code travels inside the model) because where the model loads only
``contrastive`` and the requirements are installed, not this project: keep this module free of imports from
``tasks`` and ``flows`` and its model class's methods on ``contrastive`` and mlflow alone."""
from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator

import mlflow.pyfunc


class EncoderModel(mlflow.pyfunc.PythonModel):
    """A pipeline's representation as an MLflow model: the inputs its modality serves (``Modality.serving``;
    images: uint8 (n, H, W, C) or (n, C, H, W)) in, float32 embeddings out.

    One stage: that stage's encoder output (what its export wrote, shape (n, D)). Several stages: MCL's integration,
    concat(normalize(z_0), ..., normalize(z_{N-1})) of shape (n, sum D_j). The modality (``model_config``
    ``modality``: the config's ``pipeline:`` key) loads each stage's encoder and embeds the inputs
    (``Modality.load_encoder`` / ``embed``); its code travels with the model (``code_paths``: the ``contrastive``
    package), so the model loads wherever its requirements are installed, without this project.
    """

    _skip_type_hint_validation = True  # the signature logged with the model validates inputs, not type hints

    def load_context(self, context) -> None:
        from contrastive.modalities.registry import modality_for
        # Models logged before the key was stored are image models; earlier ones store "mcl", the image key's
        # old name (the registry reads it as "image").
        self.modality = modality_for((context.model_config or {}).get("modality", "image"))
        names = sorted(context.artifacts, key=lambda name: int(name.removeprefix("stage")))
        self.encoders = [self.modality.load_encoder(str(context.artifacts[n])) for n in names]

    def predict(self, context, model_input, params=None):
        from contrastive.integrate import concat_normalized
        embeddings = [self.modality.embed(encoder, model_input) for encoder in self.encoders]
        return embeddings[0] if len(embeddings) == 1 else concat_normalized(stage_embeddings=embeddings)


def encoder_signature(*, dims: list[int], serving):
    """Input: the modality's ``serving`` (dtype, shape): a tensor, or for strings one string column (a list of
    strings passes MLflow's check of a column, not of a tensor); output: float32 (n, sum of the stages' dims)."""
    import numpy as np
    from mlflow.models.signature import ModelSignature
    from mlflow.types import DataType
    from mlflow.types.schema import ColSpec, Schema, TensorSpec
    dtype = np.dtype(serving.dtype)
    # Unnamed tensors: predict receives and returns plain arrays.
    inputs = Schema([ColSpec(DataType.string)]) if dtype.kind in "USO" and tuple(serving.shape) == (-1,) else \
        Schema([TensorSpec(dtype, tuple(serving.shape))])
    return ModelSignature(inputs=inputs, outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, sum(dims)))]))


def serving_requirements(modality: str) -> list[str]:
    """The model's pip requirements: only distributions on PyPI, pinned to the versions installed here (without a
    local ``+cu130``: the same release on PyPI)."""
    from importlib.metadata import version

    from packaging.version import Version
    from contrastive.modalities.registry import modality_for
    names = ("cloudpickle", *modality_for(modality).serving.requirements)
    return [f"{name}=={Version(version(name)).public}" for name in names]


def model_description(*, modality: str, serving, dims: list[int]) -> str:
    """One paragraph for the model version and the MLmodel metadata: what goes in, what comes out."""
    import numpy as np
    stages = "one stage's embeddings" if len(dims) == 1 else \
        f"{len(dims)} stages' embeddings, each L2-normalised, concatenated"
    checked = "a list or array of strings" if np.dtype(serving.dtype).kind in "USO" else \
        f"one {serving.dtype} numpy array with {len(serving.shape)} axes"
    return (f"Input: {serving.description}. mlflow.pyfunc.load_model(uri).predict(x) checks x against the model's "
            f"signature first: there x is {checked}. Output: float32 embeddings (n, {sum(dims)}), {stages}. "
            f"Pipeline: {modality}.")


def _code_copy(directory: Path) -> Path:
    """The ``contrastive`` package copied into ``directory`` without byte code: what the model ships as code."""
    import contrastive
    target = directory / "contrastive"
    shutil.copytree(Path(contrastive.__file__).parent, target,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"))
    return target


@contextlib.contextmanager
def quiet_model_saving() -> Iterator[None]:
    """MLflow's advice while saving EncoderModel does not apply: its warning on pickled models and on a missing
    input example (the signature gives the shapes)."""
    pyfunc_log = logging.getLogger("mlflow.pyfunc")
    level = pyfunc_log.level
    pyfunc_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        pyfunc_log.setLevel(level)


# Held while EncoderModel is pickled by value (log_encoder): cloudpickle's by-value registry is process-wide.
_PICKLE_LOCK = threading.Lock()


@contextlib.contextmanager
def _pickled_by_value() -> Iterator[None]:
    """Pickle EncoderModel's class by value, not as a reference to ``tasks.tracking``: where the model loads,
    this project (``tasks``) is not installed; only ``contrastive`` travels with the model."""
    import cloudpickle
    module = sys.modules[EncoderModel.__module__]
    with _PICKLE_LOCK:
        cloudpickle.register_pickle_by_value(module)
        try:
            yield
        finally:
            cloudpickle.unregister_pickle_by_value(module)


def save_encoder(path: Path, *, model_paths: list[str], dims: list[int], modality: str,
                 source_root: Path | None = None) -> None:
    """Write the MLflow model of ``model_paths`` (stage ``model.pt`` files of ``modality``) into ``path``; its
    ``MLmodel`` names where each stage's file came from relative to ``source_root`` (the run root), never as a path
    of this machine (:func:`_name_sources_relative`)."""
    import tempfile

    import mlflow.pyfunc

    from contrastive.modalities.registry import modality_for
    plugin = modality_for(modality)
    serving = plugin.serving
    if serving is None:
        raise ValueError(f"pipeline {modality!r} serves no model (its modality has no serving input)")
    description = model_description(modality=modality, serving=serving, dims=dims)
    with tempfile.TemporaryDirectory() as code, quiet_model_saving(), _pickled_by_value():
        # pip_requirements given: inferring them starts a subprocess that imports the model (slow).
        mlflow.pyfunc.save_model(
            str(path), python_model=EncoderModel(),
            artifacts={f"stage{i}": plugin.serving_file(str(p), out_dir=Path(code) / "stages")
                       for i, p in enumerate(model_paths)},
            model_config={"modality": modality}, code_paths=[str(_code_copy(Path(code)))],
            signature=encoder_signature(dims=dims, serving=serving), pip_requirements=serving_requirements(modality),
            metadata={"modality": modality, "input": serving.description, "input_dtype": serving.dtype,
                      "output": f"float32 embeddings (n, {sum(dims)})", "stages": len(model_paths),
                      "description": description})
    _name_sources_relative(path, model_paths=model_paths, source_root=source_root)


def _name_sources_relative(path: Path, *, model_paths: list[str], source_root: Path | None) -> None:
    """MLflow records each artifact's source as it was given (``artifacts.stage0.uri``: an absolute path under the
    run directory, or a temporary serving file), and the logged model's ``MLmodel`` is kept in the run directory
    (``mlartifacts/``): name the stage's model relative to ``source_root`` instead (its file name where it lies
    outside), so nothing there names the writing machine's paths. Loading reads only the artifact's ``path``
    (where it is inside the model); ``uri`` is a note of where it came from."""
    from mlflow.models import Model
    model = Model.load(str(path))
    artifacts = model.flavors["python_function"].get("artifacts", {})
    for i, source in enumerate(model_paths):
        source = Path(source)
        under_root = source_root is not None and Path(source_root) in source.parents
        artifacts[f"stage{i}"]["uri"] = str(source.relative_to(source_root) if under_root else source.name)
    model.save(str(Path(path) / "MLmodel"))
