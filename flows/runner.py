"""The one stage runner of every pipeline: cached steps in content-keyed directories, one nested MLflow run per
stage, and MCL's stage loop, with the modality as an adapter.

    for stage j:  train (fresh encoder; cluster-pure batches for j >= 1) -> export -> evaluate stage j alone
                  if j is not the last: k-means on stage j -> pseudo-labels combine(y_0..y_j) -> batches of j + 1
    then:         evaluate the concatenation of all stages

The runner knows no modality: every step is one of ``tasks.steps``' tasks, which call the config's modality
(``contrastive.modalities.registry``); the modality's optional parts decide the optional steps (a regroup before a
cluster-pure stage, an encoding of the evaluation sets per model, embedding diagnostics, a combined model, a step on
the final representation, the control run).

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

import copy
import inspect
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.runtime import flow_run

from contrastive.engine.files import is_disk_full, step_disk_full_error
from contrastive.errors import StageInterrupted
from flows.locks import step_lock
from pipeline_config.schema import digest_of
from tasks import steps as t
from contrastive.modalities.base import Member
from tasks.records import (RECORD, ClusterRecord, ExportRecord, ModelRecord, PseudoLabelRecord, RegroupRecord,
                           StepRecord, TrainRecord, drop_foreign_result, finished_record, gone_files, record_kind)

RESULT_STORE = "prefect-results"


def run_step(step, *, storage: Path, force: bool = False, **kwargs) -> StepRecord:
    """Call a cached task; if its cached record points at files that were deleted, recompute it.

    ``force`` recomputes even a finished step: its old output directory is kept beside the new one as
    ``<dir>.replaced-<time>`` (nothing computed is deleted); an unfinished one (a recompute that was interrupted)
    is continued, so repeating an interrupted ``--rerun-from`` command resumes its stage from its checkpoint.

    Two pipelines sharing the step take turns (``flows.locks``): the second waits and reuses the first one's
    result. A full disk anywhere in the step ends in one ``DiskFullError`` naming the directory.
    """
    out_dir = Path(kwargs["out_dir"])
    with step_lock(out_dir, on_wait=lambda message: get_run_logger().warning(message)):
        try:
            if not force:
                set_aside_if_gone(step, out_dir, title=kwargs.get("title"))
            return _run_locked_step(step, storage=storage, force=force, **kwargs)
        except OSError as exc:  # outside the task's body (Prefect's result record); the body converts its own
            if not is_disk_full(exc):
                raise
            raise step_disk_full_error(exc, out_dir=out_dir) from exc


def _run_locked_step(step, *, storage: Path, force: bool, title: str | None = None, **kwargs) -> StepRecord:
    bound = step.with_options(result_storage=storage, **({"task_run_name": title} if title else {}))
    out_dir = Path(kwargs["out_dir"])
    if force:
        if (out_dir / RECORD).exists():
            set_aside(out_dir)
        return bound.with_options(refresh_cache=True)(**kwargs)
    drop_foreign_result(storage / f"{step.name}-{kwargs['key']}")  # the cache key: tasks.steps.cached_task
    record = bound(**kwargs)
    # Prefect's cached record was written where the run was then (moved or copied since, or its step recomputed):
    # the step directory of this run root is what counts.
    here = finished_record(out_dir, type(record))
    if here is None or here.missing_files():
        return bound.with_options(refresh_cache=True)(**kwargs)
    return here


def set_aside(out_dir: Path) -> None:
    """Keep a step directory about to be computed again beside it as ``<dir>.replaced-<time>``: nothing computed is
    deleted."""
    out_dir.rename(out_dir.with_name(f"{out_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"))


def set_aside_if_gone(step, out_dir: Path, *, title: str | None) -> None:
    """A finished step whose files are gone (deleted, lost with a disk, not copied with a moved run) is computed
    again, never a dead end: one line names the missing file, and what is left of the step is set aside."""
    gone = gone_files(out_dir, record_kind(step))
    if gone:
        more = f" (and {len(gone) - 1} more of its files)" if len(gone) > 1 else ""
        get_run_logger().warning("%s: finished before, but %s is gone%s: computing it again, with the steps that "
                                 "read it", title or out_dir.name, gone[0], more)
        set_aside(out_dir)


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


_KIND_LABELS = {"mcl": "MCL", "control": "control"}
_STEP_VERBS = {"train": "train", "export": "export", "cluster": "k-means", "regroup": "regroup batches for",
               "soup": "model soup", "hyper": "Hyper-CL"}
_EVAL_VERBS = {"eval": "probe", "encode": "encode", "diagnose": "diagnose"}


def step_title(*, what: str, run: "RunRef", stage: int | None, for_stage: int | None = None) -> str:
    """The name of a step's Prefect task run, so the flow graph reads like the pipeline: ``train stage 1 (MCL)``,
    ``k-means stage 0``, ``pseudo-labels for stage 2``, ``probe MCL concat``, ``probe stage 1 (control)``."""
    # Stage 0 is shared by MCL and its control: no kind for it (its k-means logs into MCL stage 1's run).
    step_stage = stage if stage is not None else getattr(run, "stage", 0)
    kind = f" ({_KIND_LABELS.get(run.kind, run.kind)})" if isinstance(run, StageRun) and step_stage > 0 else ""
    if what == "pseudo_labels":
        return f"pseudo-labels for stage {for_stage}"
    verb, _, name = what.partition(".")
    if name:  # eval.<name>, encode.<name>, diagnose.<name>: name a stage or a concatenation
        if span := re.fullmatch(r"(\w+)_concat_(\d+)_(\d+)", name):  # mcl_concat_0_2: stages 0-2 so far
            label = _KIND_LABELS.get(span[1], span[1])
            return f"{_EVAL_VERBS.get(verb, verb)} {label} concat of stages {span[2]}-{span[3]}"
        # control_stage1 -> stage 1 (the suffix says control), stage1 -> stage 1, mcl_concat -> MCL concat
        words = re.sub(r"^(?:control_)?stage(\d+)", r"stage \1", name).replace("_", " ").split()
        label = " ".join("MCL" if w == "mcl" else w for w in words)
        suffix = " (control)" if name.startswith("control_stage") else kind if name.startswith("stage") else ""
        return f"{_EVAL_VERBS.get(verb, verb)} {label}{suffix}"
    where = f" stage {stage}" if stage is not None else ""
    return f"{_STEP_VERBS.get(verb, verb)}{where}{kind}"


@dataclass(frozen=True)
class StageRun:
    """The MLflow run of one stage of one kind (mcl, control), resolved when a step logs into it (see the module
    docstring): what the runner's methods pass where a step takes ``run_id``."""
    kind: str
    stage: int

    @property
    def label(self) -> str:
        return f"{self.kind} stage {self.stage}"


RunRef = StageRun | str  # a stage's run, or a plain run id (the parent's)


def recorded_run(out_dir: str) -> str | None:
    """The MLflow run that made the finished step in ``out_dir`` (None when it has not finished there)."""
    path = Path(out_dir) / RECORD
    return json.loads(path.read_text()).get("mlflow_run_id") if path.exists() else None


@dataclass
class StageOutputs:
    """What the stage loop produced, per stage: train, export and k-means records, the (key, member) each stage
    contributes to an evaluation, and the metrics of every stage alone and of their concatenation."""
    trained: list[TrainRecord] = field(default_factory=list)
    exports: list[ExportRecord] = field(default_factory=list)
    clusters: list[ClusterRecord] = field(default_factory=list)
    members: list[tuple[str, Member]] = field(default_factory=list)
    results: dict[str, dict] = field(default_factory=dict)


class StepRunner:
    """Runs the cached steps of one pipeline invocation: one nested MLflow run per stage, step outputs in
    directories named by content keys, reuse of cached steps recorded in the current runs."""

    def __init__(self, *, config, data: dict, parent_run_id: str, pipeline_id: str,
                 rerun_from: int | None = None):
        self.config = config
        self.rerun_from = rerun_from
        self.data = data
        self.modality = t.modality_of(config)
        self.mcl_trained: dict[int, TrainRecord] = {}  # what an inheriting stage j + 1 starts from
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

    def stage_run(self, *, kind: str, stage: int) -> StageRun:
        """The MLflow run of a stage, opened when a step first logs into it."""
        return StageRun(kind=kind, stage=stage)

    def stage_run_ids(self) -> dict[str, str]:
        """{"mcl stage 0": run id, ...}: the run holding each stage's results, opened now or by an earlier run."""
        runs = {**self.linked_runs, **self.stage_runs}
        return {run.label: runs[run] for run in sorted(runs, key=lambda r: (r.kind != "mcl", r.kind, r.stage))}

    def resolve_run(self, run: RunRef, *, what: str, source: str | None, force: bool = False) -> str:
        """The run id a step gets: the run that made it when it is reused (``source``), else this stage's run
        (module docstring). A plain id (the parent run) is used as it is."""
        if isinstance(run, str):
            return run
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
            config=self.config, parent_run_id=self.parent_run_id, stage=run.stage, kind=run.kind,
            pipeline_id=self.pipeline_id, flow_run_id=self.flow_run_id)
        return self.stage_runs[run]

    def step(self, task_fn, *, prefix: str, key: str, run_id: RunRef, what: str, stage: int | None = None,
             reads_stage: int | None = None, **kwargs: Any) -> StepRecord:
        """Run one cached step of ``stage``; with ``rerun_from``, steps of that stage and later are recomputed.

        ``reads_stage``: for a step of no stage of its own (the soup, the final step), the latest stage whose
        outputs it reads. A rerun stage's new weights carry the old keys (a key is what a result depends on, not the
        floats a run gave), so whatever reads them is recomputed with it, never found cached."""
        out_dir = str(self.root / "steps" / f"{prefix}-{key}")
        if stage is not None and "stage" in inspect.signature(task_fn.fn).parameters:
            kwargs["stage"] = stage
        latest = stage if reads_stage is None else reads_stage
        force = None not in (self.rerun_from, latest) and latest >= self.rerun_from
        # Computed again: a step whose files are gone (run_step says so), and every step that read one such.
        renew = not force and self.reads_renewed(kwargs)
        gone = not force and bool(gone_files(out_dir, record_kind(task_fn)))
        run_ref = run_id
        run_id = self.resolve_run(run_id, what=what, source=None if force or renew or gone else recorded_run(out_dir),
                                  force=force)
        if force and what == "train":
            t.note_rerun(config=self.config, mlflow_run_id=run_id, rerun_from=self.rerun_from)
        try:
            record = run_step(task_fn, storage=self.storage, force=force or renew, config=self.config, key=key,
                              out_dir=out_dir, mlflow_run_id=run_id, **kwargs,
                              title=step_title(what=what, run=run_ref, stage=stage,
                                               for_stage=kwargs.get("for_stage")))
        except StageInterrupted as exc:  # say which step the signal stopped
            exc.what = exc.what or f"the {what} step" + (f" of stage {stage}" if stage is not None else "")
            raise
        if renew or gone:
            self.renewed.add(Path(out_dir))
        if record.mlflow_run_id != run_id:  # made by a run this tracking store does not hold
            t.record_reuse(config=self.config, mlflow_run_id=run_id, record=record, what=what)
        elif what == "train" and run_id in self.stage_runs.values():
            self.log_inputs(run_id=run_id, stage=record.stage, inputs=kwargs)
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

    # ------------------------------------------------------------------------------------------ one stage
    def train_and_export(self, *, kind: str, stage: int,
                         batches: PseudoLabelRecord | RegroupRecord | None) -> tuple[TrainRecord, ExportRecord]:
        """Train stage ``stage`` (random batches when ``batches`` is None) and export its embeddings."""
        run_id = self.stage_run(kind=kind, stage=stage)
        # Naive inheritance (paper Table 5) applies to MCL's stages only; the control stays fresh stages.
        init_from = self.mcl_trained.get(stage - 1) if kind == "mcl" and self.modality.inherits(self.config) else None
        seed = t.stage_seed(self.config, stage)
        key = digest_of(self.modality.train_content(
            self.config.for_stage(stage), stage=stage, seed=seed, data=self.data,
            batches_key=batches.key if batches else None, inherit_key=init_from.key if init_from else None))
        prefix = self.modality.step_prefix
        trained = self.step(t.train_stage, prefix=f"{prefix}train{stage}", key=key, run_id=run_id, what="train",
                            stage=stage, data=self.data, batches=batches,
                            **({"init_from": init_from} if init_from is not None else {}))
        if kind == "mcl":
            self.mcl_trained[stage] = trained
        exported = self.step(t.export_embeddings, prefix=f"{prefix}export{stage}",
                             key=digest_of(self.modality.export_content(self.config, train_key=key)), run_id=run_id,
                             what="export", stage=stage, trained=trained, data=self.data)
        return trained, exported

    def member(self, *, name: str, model: TrainRecord | ModelRecord, exported: ExportRecord | None,
               run_id: RunRef, stage: int) -> tuple[str, Member]:
        """(key, member) of one representation as evaluations read it: its export, or, for a modality that
        encodes the evaluation sets once per model, that encoding. ``stage``: the latest stage the model is made
        from (a rerun from it encodes again)."""
        if not self.modality.encodes_for_eval:
            return exported.key, Member(model_path=model.model_path, embeddings_dir=exported.embeddings_dir)
        key = digest_of(self.modality.encode_content(self.config, model_key=model.key, data=self.data))
        features = self.step(t.encode_for_eval, prefix=f"{self.modality.step_prefix}encode", key=key, run_id=run_id,
                             what=f"encode.{name}", reads_stage=stage, name=name, model_path=model.model_path,
                             data=self.data)
        return features.key, Member(model_path=model.model_path, features=features.features)

    def evaluate(self, *, name: str, members: list[tuple[str, Member]], run_id: RunRef,
                 stage: int | None = None, reads_stage: int | None = None) -> dict:
        """The metrics of one representation (one member) or of the concatenation of several."""
        key = digest_of(self.modality.eval_content(self.config, member_keys=[k for k, _ in members]))
        return self.step(t.evaluate, prefix=f"{self.modality.step_prefix}eval", key=key, run_id=run_id,
                         what=f"eval.{name}", stage=stage, reads_stage=reads_stage, name=name,
                         members=[m for _, m in members], data=self.data).metrics

    def diagnose(self, *, name: str, stage: int, trained: TrainRecord, exported: ExportRecord,
                 clusters: ClusterRecord | None, run_id: RunRef) -> None:
        """Embedding diagnostics of one stage, for a modality that has them."""
        if not self.modality.diagnoses:
            return
        key = digest_of(self.modality.diagnose_content(self.config, stage=stage, export_key=exported.key,
                                                       clusters_key=clusters.key if clusters else None))
        self.step(t.diagnose, prefix="diag", key=key, run_id=run_id, what=f"diagnose.{name}", stage=stage, name=name,
                  trained=trained, exported=exported, clusters=clusters, data=self.data)

    # ------------------------------------------------------------------------------------------ between stages
    def cluster(self, *, stage: int, exported: ExportRecord, earlier: list[ClusterRecord],
                run_id: RunRef) -> ClusterRecord:
        """k-means on stage ``stage``'s export."""
        spec = self.config.mcl.kmeans_spec(stage, seed=t.stage_seed(self.config, stage))
        key = digest_of(["cluster", exported.key, asdict(spec), self.modality.clusters_dataset,
                         [c.key for c in earlier]])
        return self.step(t.cluster_embeddings, prefix=f"cluster{stage}", key=key, run_id=run_id, what="cluster",
                         stage=stage, exported=exported, earlier=list(earlier), data=self.data)

    def pseudo_labels(self, *, for_stage: int, clusters: list[ClusterRecord], exports: list[ExportRecord],
                      run_id: RunRef) -> PseudoLabelRecord:
        """Pseudo-labels of ``for_stage`` from ALL earlier stages' clusterings."""
        key = digest_of(["pseudo", [c.key for c in clusters], self.config.mcl.small_group_policy,
                         self.config.global_batch_size(for_stage)])
        return self.step(t.make_pseudo_labels, prefix=f"pseudo{for_stage}", key=key, run_id=run_id,
                         what="pseudo_labels", stage=for_stage - 1, for_stage=for_stage, clusters=list(clusters),
                         exports=list(exports), data=self.data)

    def batches_for(self, *, stage: int, pseudo: PseudoLabelRecord,
                    run_id: RunRef) -> PseudoLabelRecord | RegroupRecord:
        """What cluster-pure stage ``stage`` reads: the pseudo-labels, or what the modality regroups from them."""
        if not self.modality.regroups:
            return pseudo
        seed = t.stage_seed(self.config, stage)
        key = digest_of(self.modality.regroup_content(self.config, stage=stage, seed=seed, pseudo_key=pseudo.key,
                                                      data=self.data))
        return self.step(t.regroup_batches, prefix=f"{self.modality.step_prefix}grouped{stage}", key=key,
                         run_id=run_id, what="regroup", stage=stage, pseudo=pseudo, data=self.data)

    # ------------------------------------------------------------------------------------------ the loop
    def run_stages(self) -> StageOutputs:
        """MCL's stage loop (module docstring); every later stage trains a fresh encoder on cluster-pure batches."""
        logger = self.logger()
        out, batches = StageOutputs(), None
        stages = self.config.mcl.num_stages
        for stage in range(stages):
            run_id = self.stage_run(kind="mcl", stage=stage)
            trained, exported = self.train_and_export(kind="mcl", stage=stage, batches=batches)
            out.trained.append(trained)
            out.exports.append(exported)
            member = self.member(name=f"stage{stage}", model=trained, exported=exported, run_id=run_id, stage=stage)
            out.members.append(member)
            out.results[f"stage {stage}"] = self.evaluate(name=f"stage{stage}", members=[member], run_id=run_id,
                                                          stage=stage)
            if stage + 1 < stages:
                # What stage + 1 trains on is logged in its run: the k-means of this stage, the pseudo-labels.
                next_run = self.stage_run(kind="mcl", stage=stage + 1)
                out.clusters.append(self.cluster(stage=stage, exported=exported, earlier=out.clusters,
                                                 run_id=next_run))
                pseudo = self.pseudo_labels(for_stage=stage + 1, clusters=out.clusters, exports=out.exports,
                                            run_id=next_run)
                batches = self.batches_for(stage=stage + 1, pseudo=pseudo, run_id=next_run)
            self.diagnose(name=f"stage{stage}", stage=stage, trained=trained, exported=exported,
                          clusters=out.clusters[stage] if stage < len(out.clusters) else None, run_id=run_id)
            if self.modality.cumulative_concat(self.config) and 0 < stage < stages - 1:
                # Learning dynamics (paper Fig. 5): stages 0..j concatenated; the last j is "MCL concat" itself.
                out.results[f"MCL concat 0-{stage}"] = self.evaluate(
                    name=f"mcl_concat_0_{stage}", members=out.members[:stage + 1], run_id=run_id, stage=stage)
            logger.info("stage %d done: %s", stage, out.results[f"stage {stage}"])
        if stages > 1:
            out.results["MCL concat"] = self.evaluate(name="mcl_concat", members=out.members,
                                                      run_id=self.parent_run_id, stage=stages - 1)
        return out

    def run_control(self, outputs: StageOutputs) -> dict[str, dict]:
        """The control run: the same number of fresh stages on ordinary random batches, concatenated the same way,
        so the gain of feature-aware negatives is separated from the gain of ensembling. Its stage 0 *is* MCL's
        stage 0, unless the modality's control is a variant of the config (a HEX pipeline's control is the same
        method without HEX): then it retrains, and reports, every stage."""
        control_config = self.modality.control_config(self.config)
        if control_config is None:
            return {}
        variant = control_config is not self.config
        control = self.for_config(control_config) if variant else self
        label = self.modality.control_label(self.config)
        results: dict[str, dict] = {}
        members = [] if variant else [outputs.members[0]]
        for stage in range(len(members), self.config.mcl.num_stages):
            run_id = control.stage_run(kind="control", stage=stage)
            trained, exported = control.train_and_export(kind="control", stage=stage, batches=None)
            member = control.member(name=f"control_stage{stage}", model=trained, exported=exported, run_id=run_id,
                                    stage=stage)
            members.append(member)
            control.diagnose(name=f"control_stage{stage}", stage=stage, trained=trained, exported=exported,
                             clusters=None, run_id=run_id)
            if variant:
                results[f"{label} stage {stage}"] = control.evaluate(name=f"control_stage{stage}", members=[member],
                                                                     run_id=run_id, stage=stage)
        if self.config.mcl.num_stages > 1:
            results[f"{label} concat"] = control.evaluate(name="control_concat", members=members,
                                                          run_id=self.parent_run_id,
                                                          stage=self.config.mcl.num_stages - 1)
        return results

    def for_config(self, config) -> "StepRunner":
        """This runner for a variant of the config (the no-HEX control): same parent and MLflow runs, steps keyed
        by the variant's own content."""
        variant = copy.copy(self)  # shallow: shares stage_runs, so every run is closed at the end
        variant.config = config
        return variant

    def run_combined(self, outputs: StageOutputs) -> dict[str, dict]:
        """The representation the modality makes from the stage models (CLIP's model soup), scored like a stage."""
        if self.config.mcl.num_stages == 1 or not self.modality.combines_models(self.config):
            return {}
        key = digest_of([f"{self.modality.step_prefix}soup", [x.key for x in outputs.trained]])
        last = len(outputs.trained) - 1
        soup = self.step(t.combine_models, prefix=f"{self.modality.step_prefix}soup", key=key,
                         run_id=self.parent_run_id, what="soup", reads_stage=last, trained=list(outputs.trained))
        member = self.member(name="soup", model=soup, exported=None, run_id=self.parent_run_id, stage=last)
        return {"soup": self.evaluate(name="soup", members=[member], run_id=self.parent_run_id, reads_stage=last)}

    def run_final(self, outputs: StageOutputs) -> dict | None:
        """The modality's step on the final representation (text: Hyper-CL on the concatenation of every stage)."""
        if not self.modality.has_final_step(self.config):
            return None
        name = self.modality.final_name
        key = digest_of(self.modality.final_content(self.config, train_keys=[x.key for x in outputs.trained]))
        return self.step(t.final_metrics, prefix=f"{self.modality.step_prefix}{name}", key=key,
                         run_id=self.parent_run_id, what=name, reads_stage=len(outputs.trained) - 1,
                         trained=list(outputs.trained), data=self.data).metrics

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
