"""The one executor of every pipeline's stage graph (``flows.graph``): cached steps in content-keyed directories,
one nested MLflow run per stage, the step lock; the modality is an adapter behind the graph's tasks.

The graph (``flows.graph.stage_graph``) says which steps a run makes, in order, with their content keys and
inputs; :class:`StepRunner` runs them (:meth:`StepRunner.run_graph`), resolving each step's inputs to the records
of the steps before it. The planner reads the same graph (``flows.plan_steps``) without running it.

Every step's output directory is named by a content key (digest of the typed config it reads and of the keys of
what it consumes), so identical steps are shared and a rerun skips whatever already finished.

MLflow runs: a stage's run is the run that computed its steps. A stage run is opened only when one of its steps
runs; a step reused from an earlier invocation leaves its results where they are (in the run that made them), and
this invocation links to that run (``stage_run_ids``, then the parent's tags and description) instead of opening an
empty copy. Steps a rerun still has to compute for such a stage (a training that failed or was killed, an evaluation
added later) continue in that same run, reopened; a training recomputed on purpose (``rerun_from``) gets a run of
its own. The k-means of stage j and the pseudo-labels made from it are logged into stage j + 1's run, the stage
that trains on them.
"""
from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from prefect import get_run_logger
from prefect.runtime import flow_run

from contrastive.engine.files import is_disk_full, step_disk_full_error
from contrastive.errors import StageInterrupted
from contrastive.modalities.base import Member
from flows.graph import StageGraph, StageRun, StepId, StepSpec, resolve_inputs
from flows.locks import step_lock
from tasks import steps as t
from tasks.records import (RECORD, ClusterRecord, ExportRecord, PseudoLabelRecord, RegroupRecord, StepRecord,
                           TrainRecord, drop_foreign_result, finished_record, gone_files, record_kind)

RESULT_STORE = "prefect-results"


def run_step(step, *, storage: Path, force: bool = False, run_for: Callable[[bool], str] | None = None,
             **kwargs) -> StepRecord:
    """Call a cached task; if its cached record points at files that were deleted, recompute it.

    ``force`` recomputes even a finished step: its old output directory is kept beside the new one as
    ``<dir>.replaced-<time>`` (nothing computed is deleted); an unfinished one (a recompute that was interrupted)
    is continued, so repeating an interrupted ``--rerun-from`` command resumes its stage from its checkpoint.

    Two pipelines sharing the step take turns (``flows.locks``): the second waits and reuses the first one's
    result. Inside the lock, once: whether the step's files are gone (:func:`set_aside_if_gone`); then
    ``run_for(gone)`` gives the MLflow run the step logs into (``mlflow_run_id``), decided on what the step
    directory holds now that no one else writes it. A full disk anywhere in the step ends in one ``DiskFullError``
    naming the directory.
    """
    out_dir = Path(kwargs["out_dir"])
    with step_lock(out_dir, on_wait=lambda message: get_run_logger().warning(message)):
        try:
            gone = not force and set_aside_if_gone(step, out_dir, title=kwargs.get("title"))
            if run_for is not None:
                kwargs["mlflow_run_id"] = run_for(gone)
            return _run_locked_step(step, storage=storage, force=force, refresh=gone, **kwargs)
        except OSError as exc:  # outside the task's body (Prefect's result record); the body converts its own
            if not is_disk_full(exc):
                raise
            raise step_disk_full_error(exc, out_dir=out_dir) from exc


def _run_locked_step(step, *, storage: Path, force: bool, refresh: bool, title: str | None = None,
                     **kwargs) -> StepRecord:
    """``force``: computed again, a finished directory set aside first; ``refresh``: its directory was set aside
    (files gone), computed again; else Prefect's cached record, or computed when this run root has none."""
    bound = step.with_options(result_storage=storage, **({"task_run_name": title} if title else {}))
    out_dir = Path(kwargs["out_dir"])
    if force and (out_dir / RECORD).exists():
        set_aside(out_dir)
    if force or refresh:
        return bound.with_options(refresh_cache=True)(**kwargs)
    drop_foreign_result(storage / f"{step.name}-{kwargs['key']}")  # the cache key: tasks.steps.cached_task
    record = bound(**kwargs)
    # Prefect's cached record was written where the run was then (moved or copied since, or its step recomputed):
    # the step directory of this run root is what counts (its files were checked under the lock just before).
    here = finished_record(out_dir, type(record))
    if here is None:
        return bound.with_options(refresh_cache=True)(**kwargs)
    return here


def set_aside(out_dir: Path) -> None:
    """Keep a step directory about to be computed again beside it as ``<dir>.replaced-<time>``: nothing computed is
    deleted."""
    out_dir.rename(out_dir.with_name(f"{out_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"))


def set_aside_if_gone(step, out_dir: Path, *, title: str | None) -> bool:
    """A finished step whose files are gone (deleted, lost with a disk, not copied with a moved run) is computed
    again, never a dead end: one line names the missing file, and what is left of the step is set aside. Returns
    whether it was."""
    gone = gone_files(out_dir, record_kind(step))
    if gone:
        more = f" (and {len(gone) - 1} more of its files)" if len(gone) > 1 else ""
        get_run_logger().warning("%s: finished before, but %s is gone%s: computing it again, with the steps that "
                                 "read it", title or out_dir.name, gone[0], more)
        set_aside(out_dir)
    return bool(gone)


def named_paths(value: Any) -> list[str]:
    """The paths a step's input names: a record's files, a member's, a string, and those inside lists and dicts."""
    if isinstance(value, StepRecord):
        return value.paths()
    if isinstance(value, Member):
        return [path for path in (value.model_path, value.embeddings_dir, value.features) if path]
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [path for item in value for path in named_paths(item)]
    if isinstance(value, dict):
        return named_paths(list(value.values()))
    return []


def recorded_run(out_dir: str) -> str | None:
    """The MLflow run that made the finished step in ``out_dir`` (None when it has not finished there)."""
    path = Path(out_dir) / RECORD
    return json.loads(path.read_text()).get("mlflow_run_id") if path.exists() else None


@dataclass
class StageOutputs:
    """What the stage loop produced: MCL's train, export and k-means records per stage (what the summary and the
    registered model read)."""
    trained: list[TrainRecord] = field(default_factory=list)
    exports: list[ExportRecord] = field(default_factory=list)
    clusters: list[ClusterRecord] = field(default_factory=list)


class StepRunner:
    """Runs the cached steps of one pipeline invocation: one nested MLflow run per stage, step outputs in
    directories named by content keys, reuse of cached steps recorded in the current runs."""

    def __init__(self, *, config, data: dict, parent_run_id: str, pipeline_id: str,
                 rerun_from: int | None = None):
        self.config = config
        self.rerun_from = rerun_from
        self.data = data
        self.modality = t.modality_of(config)
        self.records: dict[StepId, StepRecord] = {}  # what each step of the graph returned, for the steps after it
        self.parent_run_id = parent_run_id
        self.pipeline_id = pipeline_id
        self.flow_run_id = flow_run.id
        self.root = Path(config.output_dir).resolve()
        self.storage = self.root / RESULT_STORE
        self.stage_runs: dict[StageRun, str] = {}  # the runs this invocation opened (closed at the end)
        self.linked_runs: dict[StageRun, str] = {}  # earlier invocations' runs that hold reused stages
        # RUNNING runs of a killed attempt whose parent run this one carries on (flows.attempts): reused, or ended
        self.inherited_runs: set[str] = set()
        self.renewed: set[Path] = set()  # step directories computed again because their files were gone
        self._tracker = None

    def logger(self):
        """Where the stage loop logs: the flow run's logger (a plan's runner, outside any flow, logs elsewhere)."""
        return get_run_logger()

    @property
    def tracker(self):
        if self._tracker is None:
            self._tracker = t.tracker_for(self.config)
        return self._tracker

    def stage_run_ids(self) -> dict[str, str]:
        """{"mcl stage 0": run id, ...}: the run holding each stage's results, opened now or by an earlier run."""
        runs = {**self.linked_runs, **self.stage_runs}
        return {run.label: runs[run] for run in sorted(runs, key=lambda r: (r.kind != "mcl", r.kind, r.stage))}

    def resolve_run(self, run: StageRun | None, *, config, what: str, source: str | None,
                    force: bool = False) -> str:
        """The run id a step gets: the run that made it when it is reused (``source``), else this stage's run
        (module docstring), opened with ``config`` (a control variant's own). None: the parent run."""
        if run is None:
            return self.parent_run_id
        if source is not None and self.tracker.run_exists(source):
            if run not in self.stage_runs:
                self.linked_runs.setdefault(run, source)
            return source  # the task returns its finished record and logs nothing
        if run in self.stage_runs:
            return self.stage_runs[run]
        if run in self.linked_runs and not (what == "train" and force):
            # A step still to compute of a stage an earlier run began (a training that failed or was killed, an
            # evaluation added later): it continues in that run, reopened, and is closed with this invocation.
            linked = self.linked_runs[run]
            self.tracker.reopen_run(linked)
            self.stage_runs[run] = linked
            return linked
        self.stage_runs[run] = t.open_stage_run(
            config=config, parent_run_id=self.parent_run_id, stage=run.stage, kind=run.kind,
            pipeline_id=self.pipeline_id, flow_run_id=self.flow_run_id)
        return self.stage_runs[run]

    def run_graph(self, graph: StageGraph) -> tuple[StageOutputs, dict[str, dict], dict | None]:
        """Every step of ``graph`` in order: (MCL's stage outputs, the results rows, the final step's metrics)."""
        results: dict[str, dict] = {}
        for spec in graph.steps:
            record = self.step(spec)
            if spec.result is not None:
                results[spec.result] = record.metrics
                if spec.id.kind == "mcl" and spec.id.of is not None and not spec.id.of.concat:
                    self.logger().info("%s done: %s", spec.result, record.metrics)
        outputs = StageOutputs(trained=[self.records[i] for i in graph.trained],
                               exports=[self.records[i] for i in graph.exports],
                               clusters=[self.records[i] for i in graph.clusters])
        return outputs, results, self.records[graph.final].metrics if graph.final is not None else None

    def step(self, spec: StepSpec) -> StepRecord:
        """Run one cached step of the graph; with ``rerun_from``, steps of that stage and later are recomputed
        (``spec.latest_stage``: a step of no stage of its own, the soup or the final step, goes with the latest
        stage it reads). A rerun stage's new weights carry the old keys (a key is what a result depends on, not
        the floats a run gave), so whatever reads them is recomputed with it, never found cached."""
        kwargs = resolve_inputs(spec.inputs, self.records)
        if spec.id.stage is not None and "stage" in inspect.signature(spec.task.fn).parameters:
            kwargs["stage"] = spec.id.stage
        latest = spec.latest_stage
        force = None not in (self.rerun_from, latest) and latest >= self.rerun_from
        # Computed again: a step whose files are gone (run_step says so, under the lock), and every step that read
        # one such.
        renew = not force and self.reads_renewed(kwargs)
        out_dir = self.root / "steps" / spec.step_dir
        decided: dict[str, Any] = {}

        def run_for(gone: bool) -> str:
            source = None if force or renew or gone else recorded_run(str(out_dir))
            decided["gone"] = gone
            decided["run_id"] = self.resolve_run(spec.run, config=spec.config, what=spec.id.what, source=source,
                                                 force=force)
            if force and spec.id.what == "train":
                t.note_rerun(config=spec.config, mlflow_run_id=decided["run_id"], rerun_from=self.rerun_from)
            return decided["run_id"]

        try:
            record = run_step(spec.task, storage=self.storage, force=force or renew, run_for=run_for,
                              config=spec.config, key=spec.key, out_dir=str(out_dir), title=spec.title, **kwargs)
        except StageInterrupted as exc:  # say which step the signal stopped
            exc.what = exc.what or spec.words
            raise
        run_id = decided["run_id"]
        if renew or decided["gone"]:
            self.renewed.add(out_dir)
        if record.mlflow_run_id != run_id:  # made by a run this tracking store does not hold
            t.record_reuse(config=spec.config, mlflow_run_id=run_id, record=record, what=spec.id.name)
        elif spec.id.what == "train" and run_id in self.stage_runs.values():
            self.log_inputs(run_id=run_id, stage=record.stage, inputs=kwargs)
        self.records[spec.id] = record
        return record

    def reads_renewed(self, inputs: dict[str, Any]) -> bool:
        """Whether a step's inputs name a file of a step this invocation computed again because its files were gone:
        the new output may differ in its floats, so what read the old one must not be reused."""
        return bool(self.renewed) and any(
            Path(path) in self.renewed or not self.renewed.isdisjoint(Path(path).parents)
            for path in named_paths(list(inputs.values())))

    def log_inputs(self, *, run_id: str, stage: int, inputs: dict[str, Any]) -> None:
        """The datasets a stage trained on, as the run's MLflow inputs: the pipeline's data and, for a cluster-pure
        stage, the pseudo-labels (or their re-shard) its batches came from: its ``batches`` input alone (an
        inheriting stage also receives the model it starts from, ``init_from``, which is no dataset)."""
        data = self.data
        self.tracker.log_dataset(run_id, name=Path(data["dir"]).name, digest=data["digest"], source=data["dir"],
                                 context="train", profile={"split": "train", "num_samples": data["num_train"]})
        batches = inputs.get("batches")
        if isinstance(batches, (PseudoLabelRecord, RegroupRecord)):
            profile = {k: v for k, v in batches.stats.items() if isinstance(v, (int, float))}
            self.tracker.log_dataset(run_id, name=f"pseudo_labels_stage{stage}", digest=batches.key,
                                     source=batches.path, context="pseudo_labels",
                                     profile={"split": "train", **profile})

    def left_open(self, run_id: str) -> bool:
        """A reused stage's run that an earlier attempt did not finish: marked FAILED by a failed one, KILLED by a
        stopped one, or still RUNNING after one of this same flow run, or the killed attempt this one carries on, was
        killed (SIGKILL, a lost node) before it could close it."""
        run = self.tracker.run_state(run_id)
        return run.status in ("FAILED", "KILLED") or run.status == "RUNNING" and (
            run_id in self.inherited_runs or self.flow_run_id is not None
            and run.tags.get("prefect.flow_run_id") == str(self.flow_run_id))

    def still_running(self, run_id: str) -> bool:
        """Whether a run is still RUNNING: a killed attempt's stage run that another pipeline sharing the stage carried
        on (a step of its own logged into it) and closed FINISHED is that pipeline's to end, not KILLED here."""
        try:
            return self.tracker.run_state(run_id).status == "RUNNING"
        except Exception as exc:  # noqa: BLE001 - a tracking outage here must not hide the flow's outcome
            get_run_logger().warning("could not read the state of MLflow run %s: %s", run_id, exc)
            return False

    def orphaned_runs(self, *, exclude: set[str]) -> list[str]:
        """Stage runs a killed attempt of this flow run opened and this attempt never used: e.g. a pipeline killed
        while it waited for a step another pipeline was computing, whose retry then found that step finished and
        linked the other pipeline's run. Nothing else will ever close them."""
        if self.flow_run_id is None:
            return []
        try:
            running = self.tracker.running_children(parent_run_id=self.parent_run_id,
                                                    tags={"prefect.flow_run_id": str(self.flow_run_id)})
        except Exception as exc:  # noqa: BLE001 - a tracking outage here must not hide the flow's outcome
            get_run_logger().warning("could not look for stage runs a killed attempt left open: %s", exc)
            return []
        return [run_id for run_id in running if run_id not in exclude]

    def close(self, *, status: str) -> None:
        """Mark every MLflow run of this invocation finished or failed; a tracking outage here must not hide the
        error that ended the flow."""
        logger = get_run_logger()
        runs = [*self.stage_runs.values(), self.parent_run_id]
        if status == "FINISHED":  # reused stages' runs an earlier attempt left unfinished: every step is done now
            runs += [run_id for run_id in set(self.linked_runs.values()) - set(runs) if self.left_open(run_id)]
        runs += self.orphaned_runs(exclude=set(runs))
        # The killed attempt's runs this one did not carry on (a stage it never reached): they end as it did.
        dead = [run_id for run_id in sorted(self.inherited_runs - set(runs)) if self.still_running(run_id)]
        for run_id, end in [*((run_id, status) for run_id in runs), *((run_id, "KILLED") for run_id in dead)]:
            try:
                t.close_run(config=self.config, mlflow_run_id=run_id, status=end)
            except Exception as exc:  # noqa: BLE001 - reported, the original outcome stands
                logger.warning("could not mark MLflow run %s %s: %s", run_id, end, exc)
