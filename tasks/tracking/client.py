"""The retrying MLflow client of one experiment (:class:`Tracker`), what a tracking outage is to this process, and
the helpers a run's files and links need.

Everything goes through an explicit ``MlflowClient`` and run ids (never the fluent API's thread-local active run),
because Prefect runs tasks in worker threads. Every call retries with backoff; a server that answered once and then
went away (restarted, redeployed) is waited for up to ``tracking.outage_grace_seconds`` while a training stage goes
on and keeps its metrics in its step directory (``journal``); when the server stays away longer, or never answered,
a :class:`TrackingError` says so and where the computed results are kept.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shlex
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import unquote, urlparse

import mlflow
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from contrastive.engine.files import disk_full_cause, disk_full_error, is_disk_full
from contrastive.errors import MclpipeError
from contrastive.credentials import refuse_credentials_in_uri
from tasks.tracking.relocate import ARTIFACT_ROOT_TAG, artifact_root_tag, follow_moved_store, sqlite_database

log = logging.getLogger(__name__)

# MLflow's HTTP client retries for minutes on its own; Tracker retries with its own backoff and then says what to do.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # bars of 1-file downloads in the run's log
T = TypeVar("T")

PARENT_TAG = "mlflow.parentRunId"
DESCRIPTION_TAG = "mlflow.note.content"  # the run's description in the MLflow UI (markdown)
# MLflow 3.x's UI opens an experiment in its training view (runs, charts, models) rather than its GenAI view
# (traces, evaluations) when the experiment carries this tag.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# MLflow 3.17's UI has a global "GenAI | Model training" switch (default GenAI) that overrides the experiment's kind;
# a link carrying this query opens in the training view (runs, charts, models) whatever the switch was on.
TRAINING_VIEW = "?workflowType=machine_learning"
MAX_PARAM_LENGTH = 6000
ANSWERS = ("RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_PARAMETER_VALUE")  # not retried
GONE_RUN = ("RESOURCE_DOES_NOT_EXIST", "INVALID_STATE")  # what the store says of a deleted run's metrics
# What a run never uploads: the previous checkpoint kept for a torn write, digests and half-written files are there
# for resuming on the machine that trained, not for a person reading the run.
NOT_UPLOADED = (".prev", ".sha256", ".tmp")
LOCAL_UI = "http://127.0.0.1:5000"  # where `make ui-mlflow` serves a local store
OUTAGE_GRACE_SECONDS = 600.0  # tracking.outage_grace_seconds' default
MAX_RETRY_WAIT_SECONDS = 15.0  # the longest sleep between two tries while a server is away
PENDING_FILE = "mlflow-pending.jsonl"  # in a training stage's step directory (journal.PendingJournal)


@contextlib.contextmanager
def store_init_lock(uri: str) -> Iterator[None]:
    """Hold a file lock beside a local sqlite store while it is opened (created or migrated) and the experiment
    made, so two pipelines started together in a fresh directory do not race on the schema (MLflow's migration
    fails with "duplicate column name"). Other stores handle concurrency themselves."""
    database = sqlite_database(uri)
    if database is None:
        yield
        return
    from filelock import FileLock, Timeout

    database.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(database) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("waiting for another mclpipe run to finish creating the MLflow store %s", database)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class TrackingError(MclpipeError):
    """The MLflow tracking server could not be reached or refused a request."""


class TrackingAway(TrackingError):
    """The server that answered before does not answer now, and the outage is within its grace: the caller keeps
    what it wanted to send and tries again later (raised only to callers that asked for one try)."""


class _Outages:
    """What this process knows of each tracking server: whether it ever answered, and since when it has not. Shared
    by every :class:`Tracker` of a URI (each task makes its own), so the grace counts from the outage's first failed
    call, and the outage is one warning when it starts and one line when it ends, however many calls failed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._answered: set[str] = set()
        self._away_since: dict[str, float] = {}

    def answered(self, uri: str) -> None:
        with self._lock:
            self._answered.add(uri)
            since = self._away_since.pop(uri, None)
        if since is not None:  # info: the outage was its one warning line
            log.info("MLflow tracking at %s answers again after %.0f s; sending what was kept", uri,
                     time.monotonic() - since)

    def has_answered(self, uri: str) -> bool:
        with self._lock:
            return uri in self._answered

    def failed(self, uri: str, *, exc: Exception, grace_seconds: float) -> float:
        """Note a failed call; returns how long the server has been away (0 for the first failure)."""
        now = time.monotonic()
        with self._lock:
            if uri not in self._answered:  # not an outage: a server that never answered (a wrong URI, starting)
                return 0.0
            since = self._away_since.setdefault(uri, now)
            first = since == now
        if first:
            log.warning("MLflow tracking at %s stopped answering (%s); waiting up to %.0f s for it "
                        "(tracking.outage_grace_seconds): a stage in training goes on and keeps its metrics in its "
                        "step directory (%s) until the server is back", uri, _short(exc), grace_seconds,
                        PENDING_FILE)
        return now - since


_OUTAGES = _Outages()


class _OutageNoise(logging.Filter):
    """Drops the lines MLflow's HTTP client (urllib3's retry of each call) and its system-metrics sampler (which
    stops sampling the stage when a call fails) print for every call while a tracking server is away: the outage is
    one warning of :class:`_Outages`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Retrying") and "/mlflow/" in message
                    or message.startswith(("Failed to get mlflow run", "Failed to log system metrics")))


for _name in ("urllib3.connectionpool", "mlflow.system_metrics.system_metrics_monitor"):
    logging.getLogger(_name).addFilter(_OutageNoise())


#: What a failed HTTP call's long message (MLflow wraps urllib3's wraps the socket's) comes down to.
_CAUSES = ("Connection refused", "Connection reset", "Connection aborted", "timed out", "Name or service not known",
           "Temporary failure in name resolution", "No route to host", "RemoteDisconnected")


def _short(exc: Exception) -> str:
    text = str(exc)
    cause = next((c for c in _CAUSES if c in text), None)
    return f"{type(exc).__name__}: {cause or (text.splitlines()[0][:200] if text else '')}"


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def is_remote(uri: str) -> bool:
    """A tracking server (artifacts go over HTTP to its store) rather than a local database or folder."""
    return uri.startswith(("http://", "https://", "databricks"))


_UNIQUE_KEY_ERRORS = ("UNIQUE constraint failed", "duplicate key value violates unique constraint",
                      "Duplicate entry")  # sqlite, PostgreSQL, MySQL, as the store's IntegrityError reads


def _lost_an_insert_race(exc: Exception) -> bool:
    """True when MLflow's store refused a row because a concurrent writer inserted the same key first."""
    return any(marker in str(exc) for marker in _UNIQUE_KEY_ERRORS)


def ui_base(uri: str) -> str:
    """Where a person opens the MLflow UI of ``uri``: the server itself, or the local UI of `make ui-mlflow`
    (``MCLPIPE_MLFLOW_UI`` when served elsewhere)."""
    return uri.rstrip("/") if is_remote(uri) else os.environ.get("MCLPIPE_MLFLOW_UI", LOCAL_UI).rstrip("/")


def ui_command(uri: str) -> str | None:
    """A command that opens the MLflow UI on a local store, working as printed from any directory: `make -C
    <checkout> ui-mlflow` for the checkout whose Makefile serves this store, else the mlflow executable of this
    interpreter's environment (not on PATH outside the venv). None for a tracking server (its URL is the UI)."""
    if is_remote(uri):
        return None
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    if uri == f"sqlite:///{Path.cwd() / 'mlflow.db'}" and (Path.cwd() / "Makefile").exists() \
            and Path(sys.executable).parent.parent.resolve() == (Path.cwd() / ".venv").resolve():
        return f"make -C {shlex.quote(str(Path.cwd()))} ui-mlflow"  # from any directory
    return f"{mlflow_bin} ui --backend-store-uri {uri} --port 5000"


def uploaded_files(path: Path) -> list[tuple[Path, str]]:
    """(file, path relative to ``path``) for every file of a directory (or the file itself) a run uploads."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    return [(f, f.name if f == path else str(f.relative_to(path))) for f in files
            if not f.name.endswith(NOT_UPLOADED) and ".prev." not in f.name]


def link_or_copy(source: Path, target: Path) -> None:
    """One copy of the bytes: a hard link into a local artifact store on the same file system (a step's outputs are
    not held twice), a copy where links cannot be made. Step files are replaced by rename, never rewritten in place,
    so a link keeps the content the run logged."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 0.1}} -> {"train.lr": "0.1"}; lists are kept as their string form."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, child in value.items():
            out.update(flatten(child, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): str(value)[:MAX_PARAM_LENGTH]}


@dataclass(frozen=True)
class RunState:
    """A run as the store holds it: status (RUNNING, FINISHED, FAILED, KILLED), tags, latest metric values."""
    status: str
    tags: dict[str, str]
    metrics: dict[str, float]


class Tracker:
    """Thin, retrying wrapper over MlflowClient for one experiment: every caller outside this package uses its
    public methods (``client``, the raw MlflowClient, is for tests and this package)."""

    def __init__(self, *, uri: str | None, experiment: str, artifact_root: Path | None = None,
                 retries: int = 4, backoff_seconds: float = 0.5,
                 outage_grace_seconds: float = OUTAGE_GRACE_SECONDS):
        self.uri = refuse_credentials_in_uri(uri or default_tracking_uri(), name="MLFLOW_TRACKING_URI")
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.outage_grace_seconds = outage_grace_seconds
        self.artifact_root = artifact_root
        # Creating a local store migrates its schema; two pipelines starting together must not both do it.
        with store_init_lock(self.uri):
            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = self._call("open the experiment", self._experiment_id, experiment, artifact_root)
        self._artifact_dirs: dict[str, Path | None] = {}

    # ------------------------------------------------------------------------------------------------ plumbing
    def _call(self, what: str, fn: Callable[..., T], *args, **kwargs) -> T:
        return self._attempt(what, fn, args, kwargs, once=False)

    def _attempt(self, what: str, fn: Callable[..., T], args: tuple, kwargs: dict, *, once: bool) -> T:
        """``fn(*args, **kwargs)``, retried with backoff: ``retries`` times for a server that never answered in this
        process (a wrong URI fails fast), for up to ``outage_grace_seconds`` since an outage began for one that did,
        and ``retries`` times for a store that refused an insert a concurrent writer made first (other refusals are
        raised at once).
        ``once``: within the grace, raise :class:`TrackingAway` after one failed try instead of waiting (training
        must not wait for the server)."""
        delay = self.backoff_seconds
        for attempt in itertools.count():
            try:
                result = fn(*args, **kwargs)
            except mlflow.exceptions.RestException as exc:
                # The store answered: asking again changes nothing, except after a lost insert race. MLflow looks
                # a row up, then inserts it (a dataset two pipelines of one experiment log at once), so a concurrent
                # writer's insert can land between; the row exists by then and the same call now finds it.
                if attempt >= self.retries or not _lost_an_insert_race(exc):
                    raise
                time.sleep(delay)
                delay *= 2
            except Exception as exc:  # connection errors surface as several exception types
                if getattr(exc, "error_code", None) in ANSWERS:  # the store answered; asking again changes nothing
                    raise
                if is_disk_full(exc):  # a local store on a full disk: retrying does not help
                    where = self._full_store_directory(exc)
                    raise disk_full_error(directory=where, what=f"MLflow's records ({what})") from exc
                away = _OUTAGES.failed(self.uri, exc=exc, grace_seconds=self.outage_grace_seconds)
                outage = _OUTAGES.has_answered(self.uri)
                left = self.outage_grace_seconds - away if outage else 0.0
                if once and left > 0:
                    raise TrackingAway(f"MLflow tracking at {self.uri} is away ({_short(exc)})") from exc
                # Past the grace a mid-stage send (``once``) stops the stage at once: the user's grace is the wait.
                if left <= 0 and (attempt >= self.retries or (once and outage)):
                    raise TrackingError(self._failure(what, exc, away=away if outage else None)) from exc
                if not outage:
                    log.warning("MLflow call to %s failed (%s); retrying in %.1fs", what, _short(exc), delay)
                time.sleep(min(delay, MAX_RETRY_WAIT_SECONDS, left) if left > 0 else delay)
                delay *= 2
            else:
                _OUTAGES.answered(self.uri)
                return result
        raise AssertionError("unreachable")

    def _failure(self, what: str, exc: Exception, *, away: float | None) -> str:
        """The one line of a tracking failure: a server that never answered, or an outage past its grace."""
        if away is None:
            return (f"MLflow tracking at {self.uri} failed to {what} after {self.retries + 1} tries "
                    f"({_short(exc)}). Start the server or fix tracking.uri / MLFLOW_TRACKING_URI, then rerun: "
                    f"finished stages are kept on local disk and are not recomputed")
        return (f"MLflow tracking at {self.uri} has not answered for {away:.0f} s, longer than "
                f"tracking.outage_grace_seconds ({self.outage_grace_seconds:g} s), when trying to {what} "
                f"({_short(exc)}); finished steps are kept on local disk, and a stage in training keeps its "
                f"checkpoint and its unsent metrics ({PENDING_FILE} in its step directory), sent when it continues. "
                f"Start the server or fix tracking.uri / MLFLOW_TRACKING_URI (or raise "
                f"tracking.outage_grace_seconds), then rerun")

    def _full_store_directory(self, exc: BaseException) -> Path:
        """Where a local store's write found the disk full: the file the ENOSPC names when it lies in the store
        (its database's directory or the artifact root), the database's directory for SQLite's SQLITE_FULL, else
        the artifact root: MLflow stages a model in a temporary directory before copying it in, and the error may
        name that staging file, whose disk is not the one that is full."""
        store = Path(self.uri.removeprefix("sqlite:///")).parent.resolve()
        filename = getattr(disk_full_cause(exc), "filename", None)
        if not filename:  # SQLite's SQLITE_FULL names no file: its database
            return store
        path = Path(filename).resolve()
        artifacts = Path(self.artifact_root).resolve() if self.artifact_root else None
        if any(root == path or root in path.parents for root in (store, artifacts) if root is not None):
            return path.parent
        return artifacts or store  # a file copied into the artifact store, named by its staging copy

    def _experiment_id(self, name: str, artifact_root: Path | None) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            if experiment.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # made by an earlier version
                self.client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            if artifact_root is not None and (database := sqlite_database(self.uri)) is not None:
                follow_moved_store(self.client, experiment, database=database, artifact_root=Path(artifact_root))
            return experiment.experiment_id
        location, tags = None, {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        if artifact_root is not None and not is_remote(self.uri):
            location = Path(artifact_root).resolve().as_uri()
            if (database := sqlite_database(self.uri)) is not None and (
                    relative := artifact_root_tag(database=database, artifact_root=Path(artifact_root))) is not None:
                tags[ARTIFACT_ROOT_TAG] = relative  # how a moved store finds its artifacts (tasks.tracking.relocate)
        try:
            experiment_id = self.client.create_experiment(name, artifact_location=location, tags=tags)
        except mlflow.exceptions.MlflowException as exc:
            # Two pipelines starting at once both saw no experiment; the loser uses the winner's.
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.client.get_experiment_by_name(name).experiment_id
        self._drop_empty_default()
        return experiment_id

    def _drop_empty_default(self) -> None:
        """A new local store is created with an empty ``Default`` experiment that nothing of ours uses; delete it
        (soft: the store keeps it, the UI no longer lists it) while it holds no run. A team server's is left alone."""
        if is_remote(self.uri):
            return
        default = self.client.get_experiment("0")
        if default.name == "Default" and default.lifecycle_stage == "active" and not self.client.search_runs(
                ["0"], max_results=1, run_view_type=mlflow.entities.ViewType.ALL):
            self.client.delete_experiment("0")

    # ------------------------------------------------------------------------------------------------ runs
    def find_run(self, *, tags: dict[str, str], parent_run_id: str | None = None) -> str | None:
        clauses = [f"tags.`{k}` = '{v}'" for k, v in tags.items()]
        if parent_run_id:
            clauses.append(f"tags.`{PARENT_TAG}` = '{parent_run_id}'")
        runs = self._call("search runs", self.client.search_runs, [self.experiment_id], " and ".join(clauses),
                          max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0].info.run_id if runs else None

    def runs_tagged(self, tags: dict[str, str]) -> dict[str, RunState]:
        """{run id: state} of every run of the experiment that carries ``tags``, whatever its parent and status."""
        clauses = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        runs = self._call("search runs", self.client.search_runs, [self.experiment_id], clauses, max_results=1000)
        return {run.info.run_id: RunState(status=run.info.status, tags=dict(run.data.tags),
                                          metrics=dict(run.data.metrics)) for run in runs}

    def delete_tag(self, run_id: str, key: str) -> None:
        self._call("delete a tag", self.client.delete_tag, run_id, key)

    def running_children(self, *, parent_run_id: str, tags: dict[str, str]) -> list[str]:
        """The runs nested under ``parent_run_id`` that carry ``tags`` and are still RUNNING."""
        clauses = [f"tags.`{PARENT_TAG}` = '{parent_run_id}'", "attributes.status = 'RUNNING'",
                   *(f"tags.`{k}` = '{v}'" for k, v in tags.items())]
        runs = self._call("search runs", self.client.search_runs, [self.experiment_id], " and ".join(clauses),
                          max_results=1000)
        return [run.info.run_id for run in runs]

    def start_run(self, *, name: str, tags: dict[str, str], parent_run_id: str | None = None,
                  reuse_tags: dict[str, str] | None = None) -> str:
        """Create a run (nested under ``parent_run_id`` if given). With ``reuse_tags``, a run carrying those tags
        is reopened instead (a retried Prefect flow run keeps its id, so it keeps its MLflow run too)."""
        if reuse_tags:
            existing = self.find_run(tags=reuse_tags, parent_run_id=parent_run_id)
            if existing:
                self.reopen_run(existing)
                return existing
        all_tags = dict(tags)
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        run = self._call("create a run", self.client.create_run, self.experiment_id, tags=all_tags, run_name=name)
        return run.info.run_id

    def reopen_run(self, run_id: str) -> None:
        """Mark a run RUNNING again: a step still to compute continues in the run an earlier attempt began."""
        self._call("reopen a run", self.client.update_run, run_id, status="RUNNING")

    def run_state(self, run_id: str) -> RunState:
        """What the store holds of a run now: its status, tags and latest metric values."""
        run = self._call("read a run", self.client.get_run, run_id)
        return RunState(status=run.info.status, tags=dict(run.data.tags), metrics=dict(run.data.metrics))

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

    def log_metrics(self, run_id: str, metrics: dict[str, float], *, step: int = 0,
                    timestamp_ms: int | None = None) -> None:
        """``timestamp_ms`` (default: now): a fixed one makes logging the same values again a no-op (log_points),
        for a step that may be recorded twice when a kill lands between its metrics and its record."""
        self.log_metric_history(run_id, [(step, metrics)], timestamp_ms=timestamp_ms)

    def log_metric_history(self, run_id: str, history: list[tuple[int, dict[str, float]]], *,
                           timestamp_ms: int | None = None) -> None:
        self.log_points(run_id, metric_points(history, timestamp_ms=now_ms() if timestamp_ms is None else timestamp_ms))

    def log_points(self, run_id: str, points: list[list], *, tags: dict[str, str] | None = None,
                   once: bool = False) -> None:
        """Log metric points ``[key, value, timestamp_ms, step]`` as given, and ``tags``. MLflow's SQL stores
        ignore a point they hold already (same key, value, timestamp and step), so sending a batch again after a
        reply was lost adds nothing. ``once``: one try while the server is away (:class:`TrackingAway`)."""
        metrics = [Metric(key, float(value), int(timestamp), int(step)) for key, value, timestamp, step in points]
        tag_list = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
        for start in range(0, max(len(metrics), 1), 1000):  # log_batch takes at most 1000 metrics
            batch = {"metrics": metrics[start:start + 1000], "tags": tag_list if start == 0 else []}
            if batch["metrics"] or batch["tags"]:
                self._attempt("log metrics", self.client.log_batch, (run_id,), batch, once=once)

    def local_artifact_dir(self, run_id: str) -> Path | None:
        """The run's artifact folder when its artifact store is a local folder (None for a server's store)."""
        if run_id not in self._artifact_dirs:
            uri = self._call("read a run", self.client.get_run, run_id).info.artifact_uri
            parsed = urlparse(uri)
            local = parsed.scheme in ("", "file") and not is_remote(self.uri)
            self._artifact_dirs[run_id] = Path(unquote(parsed.path)) if local else None
        return self._artifact_dirs[run_id]

    def log_artifact(self, run_id: str, path: Path, *, artifact_path: str | None = None) -> None:
        """Log a file or a folder's files (without ``NOT_UPLOADED`` ones) under ``artifact_path``: hard links into a
        local artifact store, uploads to a server's."""
        path = Path(path)
        files = uploaded_files(path)
        local = self.local_artifact_dir(run_id) if files else None
        for source, relative in files:
            parts = [part for part in (artifact_path, str(Path(relative).parent)) if part and part != "."]
            target = "/".join(parts) or None
            if local is not None:
                link_or_copy(source, local / (artifact_path or "") / relative)
            else:
                self._call("upload an artifact", self.client.log_artifact, run_id, str(source), target)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._call("upload an artifact", self.client.log_text, run_id, text, artifact_file)

    def set_description(self, run_id: str, markdown: str) -> None:
        """The run's description (rendered as markdown at the top of its page in the MLflow UI)."""
        self.set_tags(run_id, {DESCRIPTION_TAG: markdown})

    def log_dataset(self, run_id: str, *, name: str, digest: str, source: str, context: str,
                    profile: dict[str, Any]) -> None:
        """Record a dataset the run read (shown under the run's "Datasets"): ``context`` says what for (train,
        pseudo_labels, eval), ``profile`` holds its size and split."""
        dataset = Dataset(name=name, digest=digest[:36], source_type="local", source=json.dumps({"uri": source}),
                          profile=json.dumps(profile))
        self._call("log a dataset", self.client.log_inputs, run_id,
                   [DatasetInput(dataset, [InputTag("mlflow.data.context", context)])])

    def run_exists(self, run_id: str) -> bool:
        try:
            return self._call("read a run", self.client.get_run, run_id).info.lifecycle_stage == "active"
        except mlflow.exceptions.MlflowException:
            return False

    def run_url(self, run_id: str) -> str:
        return f"{ui_base(self.uri)}/#/experiments/{self.experiment_id}/runs/{run_id}{TRAINING_VIEW}"

    def experiment_url(self) -> str:
        return f"{ui_base(self.uri)}/#/experiments/{self.experiment_id}/runs{TRAINING_VIEW}"

    def run_url_hint(self, run_id: str) -> str:
        command = ui_command(self.uri)
        return self.run_url(run_id) if command is None else f"{command}  then open  {self.run_url(run_id)}"

    @contextlib.contextmanager
    def system_metrics(self, run_id: str, *, seconds: float) -> Iterator[None]:
        """Sample CPU, memory, disk, network (and GPU with pynvml) every ``seconds`` into ``system/*`` metrics of
        the run while the block runs; ``seconds`` 0 switches it off."""
        if seconds <= 0:
            yield
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        monitor = SystemMetricsMonitor(run_id, sampling_interval=seconds, tracking_uri=self.uri)
        monitor.start()
        try:
            yield
        finally:
            monitor.finish()
            # The monitor publishes only whole sampling windows, so a block shorter than one (or the tail of a
            # longer one) would leave nothing: publish what it collected, plus one sample at the end.
            try:
                monitor.collect_metrics()
                monitor.publish_metrics(monitor.aggregate_metrics())
                monitor.mlflow_logger.flush()
            except Exception as exc:  # noqa: BLE001 - system metrics never fail a stage
                log.warning("could not log the last system metrics sample: %s", exc)

def _metric_key(key: str) -> str:
    # MLflow metric names allow letters, digits, _ - . / and spaces.
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)


def now_ms() -> int:
    return int(time.time() * 1000)


def metric_points(history: list[tuple[int, dict[str, float]]], *, timestamp_ms: int) -> list[list]:
    """``[(step, {key: value})]`` -> points ``[key, value, timestamp_ms, step]`` (NaNs left out: MLflow's charts
    break on them, and a non-finite loss is reported by the loop)."""
    return [[_metric_key(k), float(v), timestamp_ms, int(step)] for step, metrics in history
            for k, v in metrics.items() if v == v]

