"""The typed records the pipeline's tasks return and keep in ``<step dir>/record.json``: paths and small numbers,
never tensors. Prefect caches them under the step's content key; the flows read their fields by name.

A run directory (``output_dir``) is relocatable: ``record.json`` names the files of the run relative to the run root
(``steps/train0-<key>/model/model.pt``), and a record read from a step directory has its paths resolved against the
root that directory is in now. A record written by an earlier version holds absolute paths under the root it was
written in; read elsewhere, those are mapped to the same place under the current root, so a moved or copied run
never reads the old place. In memory a record's paths are absolute.
"""
from __future__ import annotations

import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TypeVar

from prefect.serializers import Serializer
from pydantic import BaseModel, ConfigDict

from contrastive.embeddings import MANIFEST as EMBEDDINGS_MANIFEST
from contrastive.engine.files import write_json

RECORD = "record.json"
STEPS = "steps"  # a step's directory is <run root>/steps/<prefix>-<key>


def run_root_of(step_dir: Path | str) -> Path:
    """The run root (``output_dir``) a step directory ``<root>/steps/<name>`` is in."""
    return Path(step_dir).parent.parent


class StepRecord(BaseModel):
    """What every finished step records: its content key, its output directory and the MLflow run that made it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str
    dir: str
    mlflow_run_id: str

    #: The fields naming files of the step ("a.b": entry b of dict field a): relative to the run root on disk.
    PATHS: ClassVar[tuple[str, ...]] = ("dir",)
    #: {field naming a directory: files it holds when whole}: a step whose reader would stop on their absence
    #: ("rerun the pipeline to export again") is computed again instead.
    INSIDE: ClassVar[dict[str, tuple[str, ...]]] = {}

    def save(self) -> "StepRecord":
        write_json(Path(self.dir) / RECORD, self.stored())
        return self

    def stored(self) -> dict:
        """The record as ``record.json`` holds it: every path under the run root relative to that root."""
        root = run_root_of(self.dir)
        return _map_paths(self.model_dump(mode="json"), self.PATHS, lambda path: _relative_to(path, root))

    def paths(self) -> list[str]:
        """Every file or directory the record names."""
        values = self.model_dump(mode="json")
        named = [values.get(field) if not entry else (values.get(field) or {}).get(entry)
                 for field, _, entry in (name.partition(".") for name in self.PATHS)]
        return list(dict.fromkeys(path for path in named if isinstance(path, str)))

    def missing_files(self) -> list[str]:
        """The files the record names, and those its directories must hold (``INSIDE``), that are gone (deleted, or
        not copied with the run): [] for a usable record."""
        values = self.model_dump(mode="json")
        inside = [str(Path(values[field]) / name) for field, names in self.INSIDE.items() for name in names]
        return [path for path in [*self.paths(), *inside] if not Path(path).exists()]

    def is_on_disk(self) -> bool:
        """A (possibly cached) record is only usable while its files are still on disk."""
        return (Path(self.dir) / RECORD).exists() and not self.missing_files()


class TrainRecord(StepRecord):
    PATHS = ("dir", "model_path", "summary.model_path", "summary.isotropy_path")  # tasks.steps.SUMMARY_PATHS
    stage: int
    model_path: str
    summary: dict


class ExportRecord(StepRecord):
    PATHS = ("dir", "embeddings_dir")
    INSIDE = {"embeddings_dir": (EMBEDDINGS_MANIFEST,)}
    embeddings_dir: str
    num_samples: int
    dim: int


class ClusterRecord(StepRecord):
    PATHS = ("dir", "clusters_dir", "plot")
    stage: int
    clusters_dir: str
    sizes: list[int]
    inertia: float
    ami: dict[str, float]
    plot: str


class PseudoLabelRecord(StepRecord):
    PATHS = ("dir", "path", "stats.path")
    path: str
    stats: dict


class EvalRecord(StepRecord):
    name: str
    metrics: dict[str, float]


class DiagnosisRecord(StepRecord):
    PATHS = ("dir", "plot")
    name: str
    diagnostics: dict[str, float]
    plot: str


class RegroupRecord(StepRecord):
    """What a cluster-pure stage reads besides the pseudo-labels (CLIP: the training shards re-written sorted by
    group): ``path`` is handed to its training."""
    PATHS = ("dir", "path")
    path: str
    stats: dict


class ModelRecord(StepRecord):
    """A model made from the stage models (the CLIP model soup)."""
    PATHS = ("dir", "model_path")
    model_path: str


class FeaturesRecord(StepRecord):
    """One model's encoding of the evaluation sets (CLIP: the MMVP pairs and the retrieval set)."""
    PATHS = ("dir", "features", "model_path")
    name: str
    features: str
    model_path: str


R = TypeVar("R", bound=StepRecord)


class RecordSerializer(Serializer):
    """How Prefect keeps a step's returned record in its result store (``<output_dir>/prefect-results/``): as
    ``record.json`` holds it (JSON, every path relative to the run root), so the result store of a moved or copied
    run names no path of the machine that wrote it, and nothing there is unpickled. Read back, the record's paths are
    relative: the flow takes only its type from it and reads the step directory's ``record.json`` where it is now
    (``flows.runner``). Results kept by earlier versions name Prefect's pickle serializer: they are removed unread
    before their step runs (:func:`drop_foreign_result`).

    A failed step's exception (Prefect keeps one too) is kept as its type and message and read back as a
    ``RuntimeError`` saying them: the error's history, like the log."""

    type: typing.Literal["mclpipe-step-record"] = "mclpipe-step-record"

    def dumps(self, obj: StepRecord | BaseException) -> bytes:
        if isinstance(obj, BaseException):
            return json.dumps({"error": f"{type(obj).__name__}: {obj}"}).encode()
        if not isinstance(obj, StepRecord):
            raise TypeError(f"a pipeline step returns a StepRecord, not {type(obj).__name__}")
        return json.dumps({"kind": type(obj).__name__, "record": obj.stored()}).encode()

    def loads(self, blob: bytes) -> StepRecord | RuntimeError:
        value = json.loads(blob)
        if "error" in value:
            return RuntimeError(value["error"])
        return _record_kinds()[value["kind"]].model_validate(value["record"])


def drop_foreign_result(path: Path) -> None:
    """Remove the cached result ``path`` of Prefect's result store unless :class:`RecordSerializer` wrote it.

    Prefect reads a cached result with the serializer its file names, so a pickle there (an earlier version's, naming
    the old paths, or a file planted in the run directory) would be unpickled before any step runs. Nothing is lost:
    the step's body returns its finished ``record.json`` and Prefect keeps the result anew, as JSON."""
    try:
        serializer = json.loads(Path(path).read_bytes())["metadata"]["serializer"]["type"]
    except FileNotFoundError:
        return
    except (ValueError, KeyError, TypeError):  # not a result Prefect could read either
        serializer = None
    if serializer != RecordSerializer.model_fields["type"].default:
        Path(path).unlink(missing_ok=True)


def _record_kinds() -> dict[str, type[StepRecord]]:
    """Every record class by name (subclasses of subclasses included)."""
    kinds, todo = {}, [StepRecord]
    while todo:
        kind = todo.pop()
        kinds[kind.__name__] = kind
        todo += kind.__subclasses__()
    return kinds


def finished_record(out_dir: Path | str, kind: type[R]) -> R | None:
    """The record a finished step left in ``out_dir``, its paths resolved against the run root ``out_dir`` is in
    now (module docstring), or None when the step has not finished there."""
    path = Path(out_dir) / RECORD
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    root = run_root_of(out_dir)
    written_in = run_root_of(raw["dir"]) if Path(raw["dir"]).is_absolute() else root
    return kind.model_validate(_map_paths(raw, kind.PATHS, lambda p: _resolved(p, root=root, written_in=written_in)))


def gone_files(out_dir: Path | str, kind: type[StepRecord]) -> list[str]:
    """The files the finished record in ``out_dir`` names that are gone ([] when none is, or nothing finished)."""
    record = finished_record(out_dir, kind)
    return record.missing_files() if record is not None else []


def in_step_dir(path: str, out_dir: Path | str) -> str:
    """A path that a step's own files name (``train_summary.json``'s model) as a path of the step directory
    ``out_dir`` where it is now: relative ones under it, absolute ones written in the step directory of the same
    name elsewhere (a moved or copied run) at the same place under it."""
    out_dir, stored = Path(out_dir), Path(path)
    if not stored.is_absolute():
        return str(out_dir / stored)
    if out_dir.name in stored.parts:
        below = len(stored.parts) - stored.parts[::-1].index(out_dir.name)
        return str(out_dir.joinpath(*stored.parts[below:]))
    return path


def record_kind(task) -> type[StepRecord]:
    """The record class a step's Prefect task returns (its function's return annotation)."""
    return typing.get_type_hints(task.fn)["return"]


def _relative_to(path: str, root: Path) -> str:
    """``path`` relative to ``root`` when it lies under it; a path outside the run (a data set) stays as it is."""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def _resolved(path: str, *, root: Path, written_in: Path) -> str:
    """A stored path as a path of this machine: a relative one under ``root``; an absolute one under the root the
    record was written in (an earlier version's record, then moved or copied) at the same place under ``root``."""
    stored = Path(path)
    if not stored.is_absolute():
        return str(root / stored)
    if written_in != root and written_in in stored.parents:
        return str(root / stored.relative_to(written_in))
    return path


def _map_paths(values: dict, fields: tuple[str, ...], change: Callable[[str], str]) -> dict:
    """``values`` with ``change`` applied to each of ``fields`` present ("a.b": entry b of dict a)."""
    out = dict(values)
    for field in fields:
        head, _, entry = field.partition(".")
        if entry:
            if isinstance(out.get(head), dict) and isinstance(out[head].get(entry), str):
                out[head] = {**out[head], entry: change(out[head][entry])}
        elif isinstance(out.get(head), str):
            out[head] = change(out[head])
    return out
