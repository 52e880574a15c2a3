"""The typed records the pipeline's tasks return and keep in ``<step dir>/record.json``: paths and small numbers,
never tensors. Prefect caches them under the step's content key; the flows read their fields by name."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from contrastive.engine.files import write_json

RECORD = "record.json"


class StepRecord(BaseModel):
    """What every finished step records: its content key, its output directory and the MLflow run that made it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str
    dir: str
    mlflow_run_id: str

    def save(self) -> "StepRecord":
        write_json(Path(self.dir) / RECORD, self.model_dump(mode="json"))
        return self

    def is_on_disk(self) -> bool:
        """A (possibly cached) record is only usable while its files are still on disk."""
        return (Path(self.dir) / RECORD).exists()


class TrainRecord(StepRecord):
    stage: int
    model_path: str
    summary: dict


class ExportRecord(StepRecord):
    embeddings_dir: str
    num_samples: int
    dim: int


class ClusterRecord(StepRecord):
    stage: int
    clusters_dir: str
    sizes: list[int]
    inertia: float
    ami: dict[str, float]
    plot: str


class PseudoLabelRecord(StepRecord):
    path: str
    stats: dict


class EvalRecord(StepRecord):
    name: str
    metrics: dict[str, float]


class DiagnosisRecord(StepRecord):
    name: str
    diagnostics: dict[str, float]
    plot: str


class RegroupRecord(StepRecord):
    """What a cluster-pure stage reads besides the pseudo-labels (CLIP: the training shards re-written sorted by
    group): ``path`` is handed to its training."""
    path: str
    stats: dict


class ModelRecord(StepRecord):
    """A model made from the stage models (the CLIP model soup)."""
    model_path: str


class FeaturesRecord(StepRecord):
    """One model's encoding of the evaluation sets (CLIP: the MMVP pairs and the retrieval set)."""
    name: str
    features: str
    model_path: str


R = TypeVar("R", bound=StepRecord)


def finished_record(out_dir: Path | str, kind: type[R]) -> R | None:
    """The record a finished step left in ``out_dir``, or None when the step has not finished there."""
    path = Path(out_dir) / RECORD
    return kind.model_validate(json.loads(path.read_text())) if path.exists() else None
