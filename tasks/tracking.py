"""The one place that imports mlflow.

Everything goes through an explicit ``MlflowClient`` and run ids (never the fluent API's thread-local active run),
because Prefect runs tasks in worker threads. Every call retries with backoff; when the tracking server stays
unreachable a :class:`TrackingError` says so and where the computed results are kept on local disk.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from contrastive.errors import MclpipeError

log = logging.getLogger(__name__)

# MLflow's HTTP client retries for minutes on its own; Tracker retries with its own backoff and then says what to do.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
T = TypeVar("T")

PARENT_TAG = "mlflow.parentRunId"
MAX_PARAM_LENGTH = 6000


class TrackingError(MclpipeError):
    """The MLflow tracking server could not be reached or refused a request."""


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 0.1}} -> {"train.lr": "0.1"}; lists are kept as their string form."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, child in value.items():
            out.update(flatten(child, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): str(value)[:MAX_PARAM_LENGTH]}


class Tracker:
    """Thin, retrying wrapper over MlflowClient for one experiment."""

    def __init__(self, *, uri: str | None, experiment: str, artifact_root: Path | None = None,
                 retries: int = 4, backoff_seconds: float = 0.5):
        self.uri = uri or default_tracking_uri()
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._call("open the experiment", self._experiment_id, experiment, artifact_root)

    # ------------------------------------------------------------------------------------------------ plumbing
    def _call(self, what: str, fn: Callable[..., T], *args, **kwargs) -> T:
        delay = self.backoff_seconds
        for attempt in range(self.retries + 1):
            try:
                return fn(*args, **kwargs)
            except mlflow.exceptions.RestException:
                raise
            except Exception as exc:  # connection errors surface as several exception types
                if attempt == self.retries:
                    raise TrackingError(
                        f"MLflow tracking at {self.uri} failed to {what} after {self.retries + 1} tries "
                        f"({type(exc).__name__}: {str(exc)[:200]}). Start the server or fix tracking.uri / "
                        f"MLFLOW_TRACKING_URI, then rerun: finished stages are kept on local disk and are not "
                        f"recomputed") from exc
                log.warning("MLflow call to %s failed (%s); retrying in %.1fs", what, exc, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _experiment_id(self, name: str, artifact_root: Path | None) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        location = None
        if artifact_root is not None and not self.uri.startswith(("http://", "https://", "databricks")):
            location = Path(artifact_root).resolve().as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except mlflow.exceptions.MlflowException as exc:
            # Two pipelines starting at once both saw no experiment; the loser uses the winner's.
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.client.get_experiment_by_name(name).experiment_id

    # ------------------------------------------------------------------------------------------------ runs
    def find_run(self, *, tags: dict[str, str], parent_run_id: str | None = None) -> str | None:
        clauses = [f"tags.`{k}` = '{v}'" for k, v in tags.items()]
        if parent_run_id:
            clauses.append(f"tags.`{PARENT_TAG}` = '{parent_run_id}'")
        runs = self._call("search runs", self.client.search_runs, [self.experiment_id], " and ".join(clauses),
                          max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0].info.run_id if runs else None

    def start_run(self, *, name: str, tags: dict[str, str], parent_run_id: str | None = None,
                  reuse_tags: dict[str, str] | None = None) -> str:
        """Create a run (nested under ``parent_run_id`` if given). With ``reuse_tags``, a run carrying those tags
        is reopened instead (a retried Prefect flow run keeps its id, so it keeps its MLflow run too)."""
        if reuse_tags:
            existing = self.find_run(tags=reuse_tags, parent_run_id=parent_run_id)
            if existing:
                self._call("reopen a run", self.client.update_run, existing, status="RUNNING")
                return existing
        all_tags = dict(tags)
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        run = self._call("create a run", self.client.create_run, self.experiment_id, tags=all_tags, run_name=name)
        return run.info.run_id

    def end_run(self, run_id: str, *, status: str = "FINISHED") -> None:
        self._call("end a run", self.client.set_terminated, run_id, status=status)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        existing = self._call("read a run", self.client.get_run, run_id).data.params
        fresh = [Param(k, str(v)) for k, v in flatten(params).items() if k not in existing]
        for start in range(0, len(fresh), 100):
            self._call("log params", self.client.log_batch, run_id, params=fresh[start:start + 100])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        if tags:
            self._call("set tags", self.client.log_batch, run_id,
                       tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, run_id: str, metrics: dict[str, float], *, step: int = 0) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(_metric_key(k), float(v), now, step) for k, v in metrics.items() if v == v]
        if batch:
            self._call("log metrics", self.client.log_batch, run_id, metrics=batch)

    def log_metric_history(self, run_id: str, history: list[tuple[int, dict[str, float]]]) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(_metric_key(k), float(v), now, step) for step, metrics in history
                 for k, v in metrics.items() if v == v]
        for start in range(0, len(batch), 1000):
            self._call("log metrics", self.client.log_batch, run_id, metrics=batch[start:start + 1000])

    def log_artifact(self, run_id: str, path: Path, *, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._call("upload artifacts", self.client.log_artifacts, run_id, str(path), artifact_path)
        elif path.exists():
            self._call("upload an artifact", self.client.log_artifact, run_id, str(path), artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._call("upload an artifact", self.client.log_text, run_id, text, artifact_file)

    def run_url_hint(self, run_id: str) -> str:
        return (f"mlflow ui --backend-store-uri {self.uri}  (then open http://127.0.0.1:5000/#/experiments/"
                f"{self.experiment_id}/runs/{run_id})")


def _metric_key(key: str) -> str:
    # MLflow metric names allow letters, digits, _ - . / and spaces.
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)


class MetricBuffer:
    """Training callback that batches per-step metrics into one log_batch call every ``flush_every`` steps, so
    tracking costs a few round trips per epoch rather than one per step."""

    def __init__(self, *, tracker: Tracker, run_id: str, flush_every: int = 50):
        self.tracker = tracker
        self.run_id = run_id
        self.flush_every = flush_every
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.checkpoint_path: Path | None = None

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.pending.append((step, metrics))
        if len(self.pending) >= self.flush_every:
            self.flush()

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        self.pending.append((epoch, metrics))
        self.flush()

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        self.checkpoint_path = path

    def flush(self, *, final: bool = False) -> None:
        """Send pending metrics. A tracking outage mid-stage must not stop training (the checkpoint and the
        stage's files are what matter); metrics are kept and retried at the next flush, and only the final
        flush raises."""
        try:
            self.tracker.log_metric_history(self.run_id, self.pending)
            self.pending = []
        except TrackingError:
            if final:
                raise
            log.warning("MLflow unreachable; keeping %d metric points to send later", len(self.pending))
