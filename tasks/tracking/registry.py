"""Logging a pipeline's model to MLflow: a logged model of its run and, with a registry name, a registered model
version that the alias ``current`` points at (the encoder of the latest finished pipeline)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import mlflow

from tasks.tracking.client import Tracker
from tasks.tracking.serving_model import model_description, save_encoder

MODEL_ALIAS = "current"  # the registered model's alias for the encoder of the latest finished pipeline


def log_encoder(tracker: Tracker, run_id: str, *, name: str, model_paths: list[str], dims: list[int],
                modality: str, registered_name: str | None = None, tags: dict[str, str] | None = None,
                source_root: Path | None = None) -> dict[str, str]:
    """Log ``model_paths`` (one stage's ``model.pt``, or every stage's for the integrated representation) of the
    pipeline ``modality`` (the config's ``pipeline:`` key) as an MLflow logged model of the run, loadable with
    ``mlflow.pyfunc.load_model`` where its requirements are installed; with ``registered_name``, register it and
    point the alias ``current`` at it. Its ``MLmodel`` names the stage files relative to ``source_root`` (the run
    root). Returns {"model_id", "model_uri"[, "version", "registered_uri"]}."""
    from mlflow.entities import LoggedModelOutput

    from contrastive.modalities.registry import modality_for
    serving = modality_for(modality).serving
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "model"
        save_encoder(local, model_paths=model_paths, dims=dims, modality=modality, source_root=source_root)
        model = tracker._call("create a logged model", tracker.client.create_logged_model, tracker.experiment_id,
                              name=name, source_run_id=run_id, model_type="encoder",
                              tags={"modality": modality, "input": serving.description, **(tags or {})})
        tracker._call("upload a model", tracker.client.log_model_artifacts, model.model_id, str(local))
    tracker._call("finish a model", tracker.client.finalize_logged_model, model.model_id, "READY")
    tracker._call("link a model", tracker.client.log_outputs, run_id, [LoggedModelOutput(model.model_id, step=0)])
    out = {"model_id": model.model_id, "model_uri": f"models:/{model.model_id}"}
    if registered_name:
        _ensure_registered_model(tracker, registered_name)
        version = tracker._call("register a model version", tracker.client.create_model_version, registered_name,
                                model.artifact_location, run_id=run_id, model_id=model.model_id,
                                description=model_description(modality=modality, serving=serving, dims=dims))
        tracker._call("set a model alias", tracker.client.set_registered_model_alias, registered_name, MODEL_ALIAS,
                      version.version)
        out |= {"version": str(version.version), "registered_uri": f"models:/{registered_name}@{MODEL_ALIAS}"}
    return out


def _ensure_registered_model(tracker: Tracker, name: str) -> None:
    """Create the registered model unless it exists (two pipelines registering at once: the loser uses it)."""
    try:
        tracker._call("read a registered model", tracker.client.get_registered_model, name)
        return
    except mlflow.exceptions.MlflowException:
        pass
    try:
        tracker._call("register a model", tracker.client.create_registered_model, name)
    except mlflow.exceptions.MlflowException:
        tracker._call("read a registered model", tracker.client.get_registered_model, name)
