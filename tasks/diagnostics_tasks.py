"""Prefect task: embedding diagnostics of one exported stage, logged to that stage's MLflow run.

Thin like every task here: unpack the config, call :func:`contrastive.diagnostics.diagnose_stage`, log numbers
and the PNG through ``tasks.tracking``, return a small record. Cached by a content key like the other steps.
"""
from __future__ import annotations

from pathlib import Path

from contrastive.diagnostics import diagnose_stage
from contrastive.modalities.image.config import ImagePipelineConfig
from tasks.mcl_tasks import cached_task, tracker_for
from tasks.records import ClusterRecord, DiagnosisRecord, ExportRecord, TrainRecord, finished_record


@cached_task("diagnose")
def diagnose(*, config: ImagePipelineConfig, key: str, out_dir: str, stage: int, name: str, trained: TrainRecord,
             exported: ExportRecord, clusters: ClusterRecord | None, data: dict, mlflow_run_id: str) -> DiagnosisRecord:
    """Same-group vs other-pair cosine distributions (per attribute, and per k-means cluster when the stage was
    clustered), anisotropy, effective rank, alignment and uniformity of one stage's embeddings."""
    if (done := finished_record(out_dir, DiagnosisRecord)) is not None:
        return done
    result = diagnose_stage(dataset_dir=data["dir"], embeddings_dir=exported.embeddings_dir,
                            out_dir=Path(out_dir) / "diagnostics",
                            clusters_dir=clusters.clusters_dir if clusters else None,
                            model_path=trained.model_path,
                            augment_kwargs=config.for_stage(stage).augment.model_dump(),
                            device=config.device, seed=config.seed, title=name)
    tracker = tracker_for(config)
    tracker.log_metrics(mlflow_run_id, result["metrics"])
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "diagnostics", artifact_path="eval/diagnostics")
    return DiagnosisRecord(key=key, dir=out_dir, name=name, diagnostics=result["metrics"], plot=result["plot"],
                           mlflow_run_id=mlflow_run_id).save()
