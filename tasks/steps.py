"""The one set of Prefect tasks of the MCL pipeline, for every modality: each task calls one method of the config's
modality (``contrastive.modalities.registry``), logs what it returned to MLflow through ``tasks.tracking`` and
returns a small JSON record (paths, numbers), never tensors. Nothing here knows what an image or a sentence is.

Caching: every expensive task takes a ``key`` (a digest of the config that affects it and the keys of what it
consumes) and writes into ``out_dir`` named by that key. Prefect caches the returned record under the key, and
the body itself returns early when ``out_dir/record.json`` already holds a finished result, so a new run of the
same pipeline, a retried flow run, or a run whose Prefect result store was wiped all skip finished work.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.context import TaskRunContext

from contrastive.engine.callbacks import StageProgress
from contrastive.engine.files import is_disk_full, step_disk_full_error, write_json
from contrastive.engine.device import check_faiss, check_gpus_usable
from contrastive.engine.launch import ENCODE_SUMMARY, EXPORT_SUMMARY, SUMMARY
from contrastive.evaluate import plot_cluster_sizes
from contrastive.mcl import steps
from contrastive.modalities.base import (Member, Modality, ResultsTable, format_value,  # noqa: F401 (the CLI's)
                                        table_columns, tables_markdown)
from contrastive.modalities.registry import modality_for
from pipeline_config.loader import dump_config
from pipeline_config.run_root import record_started_in
from pipeline_config.schema import _PipelineBase
from tasks.records import (ClusterRecord, DiagnosisRecord, EvalRecord, ExportRecord, FeaturesRecord, ModelRecord,
                           PseudoLabelRecord, RecordSerializer, RegroupRecord, StepRecord, TrainRecord, finished_record,
                           in_step_dir)
from tasks.launching import gpu_slot, run_stage_processes, uses_processes
from tasks.tracking import PENDING_FILE, MetricBuffer, Tracker, log_encoder, rank_metric_points

# ---------------------------------------------------------------------------------------------------- helpers
def cache_key_from_parameters(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Prefect cache key = task name + the content key the flow computed (config + input digests)."""
    return f"{context.task.name}-{parameters['key']}"


def modality_of(config: _PipelineBase) -> Modality:
    """The modality the config's ``pipeline:`` key selects."""
    return modality_for(config.pipeline)


def tracker_for(config: _PipelineBase) -> Tracker:
    return Tracker(uri=config.tracking.uri, experiment=config.tracking.experiment,
                   artifact_root=Path(config.output_dir) / "mlartifacts",
                   outage_grace_seconds=config.tracking.outage_grace_seconds)


STAGE_SEED_STRIDE = 1000  # > any stage count, so (seed, stage) pairs never share a stage seed


def stage_seed(config: _PipelineBase, stage: int) -> int:
    """Seed of one stage's training, k-means and batch plans: distinct for every (pipeline seed, stage).

    seed + stage would make stage 1 of seed s train exactly like stage 0 of seed s + 1 (a control stage has no
    pseudo-labels), so multi-seed runs would share models and understate the spread across seeds.
    """
    return config.seed * STAGE_SEED_STRIDE + stage


def cached_task(name: str, **kwargs):
    """A pipeline step as a Prefect task cached on its content key. A full disk in the step's body fails the task
    with the one-line DiskFullError naming the directory (Prefect logs the task's exception as it is, so a raw
    ``OSError: [Errno 28]`` would reach the terminal before the flow could explain it)."""
    def decorate(fn):
        @functools.wraps(fn)
        def step(**params):
            try:
                return fn(**params)
            except OSError as exc:
                if not is_disk_full(exc) or "out_dir" not in params:
                    raise
                raise step_disk_full_error(exc, out_dir=Path(params["out_dir"])) from exc
        return task(name=name, cache_key_fn=cache_key_from_parameters, persist_result=True,
                    result_serializer=RecordSerializer(), **kwargs)(step)
    return decorate


def numeric_metrics(prefix: str, values: dict) -> dict[str, float]:
    """``{prefix/key: value}`` for the numeric entries of a summary dict (MLflow metrics must be numbers)."""
    return {f"{prefix}/{k}": v for k, v in values.items() if isinstance(v, (int, float))}


def finish_train_record(*, tracker: Tracker, mlflow_run_id: str, key: str, out_dir: str, stage: int, summary: dict,
                        extra_metrics: dict[str, float]) -> TrainRecord:
    """After a stage trained: tag a resumed run, log loss, time, ``extra_metrics`` (the pipeline's throughput
    numbers) and the batch plan, upload checkpoints, model and summary, and save the task record.

    The numbers are logged at the time the summary was written, so a second call after a kill between them and the
    record (the uploads take a while) adds no second point: MLflow keeps one of equal points."""
    if summary["resumed_from_step"] is not None:
        tracker.set_tags(mlflow_run_id, {"resumed_from_step": summary["resumed_from_step"]})
    trained_at_ms = int((Path(out_dir) / SUMMARY).stat().st_mtime * 1000)
    tracker.log_metrics(mlflow_run_id, {"train/final_loss": summary["final_loss"], "train/seconds": summary["seconds"],
                                        **extra_metrics, **numeric_metrics("batch_plan", summary["batch_plan"])},
                        timestamp_ms=trained_at_ms)
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "checkpoints", artifact_path="checkpoints")
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "model", artifact_path="model")
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "train_summary.json")
    supersede_unfinished_trainings(tracker, key=key, finished_in=mlflow_run_id)
    return TrainRecord(key=key, dir=out_dir, stage=stage, mlflow_run_id=mlflow_run_id,
                       model_path=summary["model_path"], summary=summary).save()


def supersede_unfinished_trainings(tracker: Tracker, *, key: str, finished_in: str) -> None:
    """The run that finished training ``key`` is the one tagged with it: a run where an attempt began that training
    and died (killed, its node lost) before its final loss, and that no later attempt carried on (another pipeline
    sharing the step finished it in its own run), gives the tag up for ``train_key.superseded_by``, so the training
    has one run, the one holding its final loss and model."""
    for run_id, state in tracker.runs_tagged({"train_key": key}).items():
        if run_id != finished_in and "train/final_loss" not in state.metrics:
            tracker.set_tags(run_id, {"train_key.superseded_by": finished_in})
            tracker.delete_tag(run_id, "train_key")


def finish_cluster_record(*, tracker: Tracker, mlflow_run_id: str, key: str, out_dir: str, stage: int, k: int,
                          summary: dict) -> ClusterRecord:
    """After a stage's embeddings were clustered into ``out_dir/clusters``: plot the cluster sizes, log k-means
    numbers and the AMI against every earlier stage, upload the clusters and save the task record."""
    plot = plot_cluster_sizes(sizes_by_stage={f"stage {stage}": summary["sizes"]},
                              path=Path(out_dir) / "clusters" / "cluster_sizes.png")
    tracker.log_metrics(mlflow_run_id, {"kmeans/inertia": summary["inertia"], "kmeans/k": k,
                                        "kmeans/empty_clusters": summary.get("empty_clusters", 0),
                                        **{f"ami/{name}": v for name, v in summary["ami"].items()}})
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "clusters", artifact_path="clusters")
    return ClusterRecord(key=key, dir=out_dir, stage=stage, clusters_dir=str(Path(out_dir) / "clusters"),
                         sizes=summary["sizes"], inertia=summary["inertia"], ami=summary["ami"], plot=str(plot),
                         mlflow_run_id=mlflow_run_id).save()


def finish_pseudo_label_record(*, tracker: Tracker, mlflow_run_id: str, key: str, out_dir: str,
                               stats: dict) -> PseudoLabelRecord:
    """After the pseudo-labels were written into ``out_dir``: log their group statistics, upload them and save the
    task record."""
    tracker.log_metrics(mlflow_run_id, numeric_metrics("pseudo_labels", stats))
    tracker.log_artifact(mlflow_run_id, Path(out_dir), artifact_path="pseudo_labels")
    return PseudoLabelRecord(key=key, dir=out_dir, path=stats["path"], stats=stats,
                             mlflow_run_id=mlflow_run_id).save()


def finish_eval_record(*, tracker: Tracker, mlflow_run_id: str, key: str, out_dir: str, name: str, metrics: dict,
                       details: dict | None = None) -> EvalRecord:
    """After representation ``name`` was scored: write ``out_dir/metrics.json`` (name, metrics, ``details``), log
    the metrics as ``eval/<name>/...``, upload the file and save the task record."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(out_dir) / "metrics.json", {"name": name, "metrics": metrics, **(details or {})})
    tracker.log_metrics(mlflow_run_id, {f"eval/{name}/{k}": v for k, v in metrics.items()})
    tracker.set_description(mlflow_run_id, f"## {name}\n\n| metric | value |\n|---|---|\n" + "".join(
        f"| {k} | {v:.4f} |\n" for k, v in sorted(metrics.items()) if isinstance(v, (int, float))))
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "metrics.json", artifact_path=f"eval/{name}")
    return EvalRecord(key=key, dir=out_dir, name=name, metrics=metrics, mlflow_run_id=mlflow_run_id).save()


def kmeans_gpu_devices(config: _PipelineBase) -> tuple[int, ...]:
    """The GPUs a clustering step may use (faiss device ids): none with ``device: cpu``; else one, the first this
    process sees. The step holds one slot of ``launcher.concurrency_limit``, as a training stage does, and one GPU
    is the least a slot holds (a stage's nproc_per_node GPUs are at least one); one GPU clusters the pipelines'
    sizes in seconds (bench/gpu_check.py: 1M x 256, K 20,000), and the same device count on every node keeps the
    assignments independent of how many GPUs a node has."""
    return () if config.device == "cpu" else (0,)


def result_slug(name: str) -> str:
    """The name the evaluation of a results-table row logs under: "stage 0" -> stage0, "MCL concat" -> mcl_concat,
    "control (no HEX) stage 1" -> control_stage1, "soup" -> soup."""
    words = name.lower().replace("(no hex)", "").split()
    return "_".join(words).replace("stage_", "stage")


class PrefectProgress:
    """Training callback that mirrors progress into a Prefect progress artifact (visible in the UI)."""

    def __init__(self, *, total_steps: int, description: str):
        self.total_steps = max(1, total_steps)
        self.artifact_id = create_progress_artifact(progress=0.0, description=description)
        self.last_percent = 0.0

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        percent = min(100.0, 100.0 * step / self.total_steps)
        if self.artifact_id is not None and (percent - self.last_percent >= 5 or percent >= 100):
            try:
                update_progress_artifact(self.artifact_id, progress=percent)
            except Exception as exc:  # noqa: BLE001 - the Prefect API is gone: the stage trains on regardless
                get_run_logger().warning("Prefect API unreachable (%s): progress updates stop, training goes on", exc)
                self.artifact_id = None
            self.last_percent = percent

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        get_run_logger().info("epoch %d: loss %.4f", epoch, metrics.get("train/epoch_loss", float("nan")))

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        pass


def train_and_record(*, config: _PipelineBase, tracker: Tracker, mlflow_run_id: str,
                     key: str, out_dir: str, stage: int, spec, entry: str, train_here, batches_from: str | None,
                     total_steps: int, extra_metrics) -> TrainRecord:
    """Train one stage of either pipeline and record it: in this process (metrics streamed to MLflow, progress to
    Prefect and the terminal), or under torchrun when distributed.nproc_per_node x nnodes > 1 (the ranks write
    metrics to ``train_metrics.jsonl``, logged to MLflow when the launch ends). ``spec``: the stage's typed spec;
    ``entry``: its torchrun entry point; ``train_here(callbacks)``: the in-process call; ``batches_from``: the
    pseudo-labels or re-shard the stage's cluster-pure batches come from (None: random batches);
    ``extra_metrics(summary)``: the pipeline's own numbers from the train summary."""
    tracker.set_tags(mlflow_run_id, {"train_key": key, "cluster_pure_batches": batches_from is not None})
    tracker.log_params(mlflow_run_id, {"stage_seed": spec.seed, "batches_from": batches_from})
    description = f"{config.pipeline} stage {stage}"
    d = config.distributed
    get_run_logger().info("training stage %d of the %s pipeline (%s batches, %d x %d processes) into %s", stage,
                          config.pipeline, "cluster-pure" if batches_from else "random", d.nnodes, d.nproc_per_node,
                          out_dir)
    # Metrics a checkpoint holds wait on disk until MLflow has them (an outage, a crash): tracking.md.
    buffer = MetricBuffer(tracker=tracker, run_id=mlflow_run_id, journal=Path(out_dir) / PENDING_FILE)
    if (summary := trained_summary(out_dir)) is not None:
        # Trained to its end before the run stopped, between its summary and its record: its model and summary are
        # whole. Record them; resuming would run a loop with no step left, whose final loss is NaN (logged as none).
        get_run_logger().info("stage %d finished training before the run stopped (%s): recording it", stage,
                              Path(out_dir) / SUMMARY)
        buffer.flush(final=True)
    else:
        with gpu_slot(config), \
                tracker.system_metrics(mlflow_run_id, seconds=config.tracking.system_metrics_seconds):
            summary = _train(config=config, buffer=buffer, out_dir=out_dir, spec=spec, entry=entry,
                             train_here=train_here, total_steps=total_steps, description=description)
    environment = summary.get("environment", {})
    if environment:  # where it trained: tags of the stage run, and a line in the Prefect log and terminal
        tracker.set_tags(mlflow_run_id, {f"env.{name}": value for name, value in environment.items()})
        get_run_logger().info("stage %d trained on %s", stage, ", ".join(f"{k} {v}" for k, v in environment.items()))
    return finish_train_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage,
                               summary=summary, extra_metrics={
                                   "train/samples_per_second": summary["samples_per_second"],
                                   "train/trimmed_samples": summary["trimmed_samples"],
                                   "train/stage_data_wait_share": summary.get("data_wait_share", 0.0),
                                   "train/checkpoint_seconds": summary.get("checkpoint_seconds", 0.0),
                                   **extra_metrics(summary)})


def trained_summary(out_dir: str) -> dict | None:
    """The summary of a stage that trained to its end in ``out_dir``, or None. Every modality writes
    ``train_summary.json`` (atomically) after the final model, as the last thing its training does; a summary whose
    model was deleted since is not a finished training (the stage trains again)."""
    path = Path(out_dir) / SUMMARY
    if not path.exists():
        return None
    summary = in_step_summary(json.loads(path.read_text()), out_dir)  # written where the run was then
    return summary if Path(summary["model_path"]).exists() else None


#: The files a training's summary names (text: its isotropy record): relative to the step directory in
#: ``train_summary.json``, absolute in memory, relative to the run root in the stage's record (``TrainRecord``).
SUMMARY_PATHS = ("model_path", "isotropy_path")


def in_step_summary(summary: dict, out_dir: str) -> dict:
    """A training's summary as read from its step directory ``out_dir``, its files there (``in_step_dir``)."""
    return {**summary, **{key: in_step_dir(summary[key], out_dir) for key in SUMMARY_PATHS
                          if isinstance(summary.get(key), str)}}


def _train(*, config, buffer: MetricBuffer, out_dir: str, spec, entry: str, train_here, total_steps: int,
           description: str) -> dict:
    """train_and_record's training: as processes where config.launcher says (torchrun here, a Slurm or Kubernetes
    job: tasks/launching.py), or here with metrics streamed to MLflow through ``buffer``."""
    if uses_processes(config):
        summary = run_stage_processes(config=config, what="train", entry=entry, kwargs={"spec": spec.to_json()},
                                      stage_dir=out_dir)
        summary = in_step_summary(summary, out_dir)  # the file names its files relative
        buffer.add_trained(rank_metric_points(Path(out_dir) / "train_metrics.jsonl"))
        buffer.flush(final=True)
    else:
        # The bar (a TTY) or a line every 30 s (a log): before PrefectProgress, which logs each epoch's loss on a
        # line the bar has cleared.
        terminal = StageProgress(total_steps=total_steps, description=description, say=get_run_logger().info)
        progress = PrefectProgress(total_steps=total_steps, description=f"{description} training ({out_dir})")
        try:
            summary = train_here([buffer, terminal, progress])
        except BaseException:
            terminal.close()
            raise
        terminal.close(steps=summary.get("steps"))
        buffer.flush(final=True)
    return summary


# ---------------------------------------------------------------------------------------------------- tasks
@task(name="prepare-data")
def prepare_data(*, config: _PipelineBase) -> dict:
    """Write (or find) the modality's data and check the config against its size before any training; when the
    stages run here (``launcher.kind local``), check that a GPU this machine has is one torch can use; and that the
    faiss k-means will use here (the clustering steps run in this process) matches this torch."""
    logger = get_run_logger()
    if not config.launcher.remote:
        check_gpus_usable(config.device)
    check_faiss(config.device, inform=logger.info)
    return modality_of(config).prepare_data(config, log=logger.info)


@task(name="open-pipeline-run")
def open_pipeline_run(*, config: _PipelineBase, pipeline_id: str, flow_run_id: str | None, pipeline_dir: str,
                      adopt: str | None = None) -> str:
    """Open the parent MLflow run, and keep the config beside the results (``mclpipe resume`` reads it). ``adopt``:
    the parent run of a killed attempt of this pipeline (:func:`take_over_dead_attempts`), carried on instead."""
    Path(pipeline_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(pipeline_dir) / "config.json", config.model_dump(mode="json"))
    (Path(pipeline_dir) / "config.yaml").write_text(dump_config(config))
    record_started_in(Path(pipeline_dir), output_dir=Path(config.output_dir))  # `mclpipe resume` from anywhere
    tracker = tracker_for(config)
    tags = {"pipeline_id": pipeline_id, "config_hash": config.config_hash(), "kind": "pipeline",
            "pipeline_name": config.name, "modality": modality_of(config).title}
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    # A retried flow run reopens its parent run: the one of this flow run that is a pipeline (its stage runs carry
    # the flow run's id too, and the latest of them was reopened as the parent before) of this pipeline.
    reuse = {"prefect.flow_run_id": flow_run_id, "kind": "pipeline", "pipeline_id": pipeline_id}
    if adopt is not None:
        tracker.set_tags(adopt, {**tags, "resumed_after_kill": "true"})
        run_id = adopt
    else:
        run_id = tracker.start_run(name=f"{config.name}-{pipeline_id[:8]}", tags=tags,
                                   reuse_tags=reuse if flow_run_id else None)
    tracker.log_params(run_id, config.model_dump(mode="json"))
    tracker.log_text(run_id, dump_config(config), "config.yaml")
    return run_id


def take_over_dead_attempts(*, config: _PipelineBase, pipeline_id: str,
                            parents: list[str]) -> tuple[str | None, set[str]]:
    """(parent run, its RUNNING runs) of the newest killed attempt of this pipeline (``parents``: the parent runs of
    the attempts ``flows.attempts`` found dead, newest first), for this attempt to carry on in: its stage runs are
    reopened as a retried flow run's are, so a resumed stage's metrics continue in one run. The older dead attempts'
    RUNNING runs end KILLED. (None, empty) when none is RUNNING in this store."""
    tracker = tracker_for(config)
    adopted, inherited = None, set()
    for parent in parents:
        if not tracker.run_exists(parent):
            continue
        state = tracker.run_state(parent)
        if state.status != "RUNNING" or state.tags.get("pipeline_id") != pipeline_id:
            continue
        running = set(tracker.running_children(parent_run_id=parent, tags={}))
        if adopted is None:
            adopted, inherited = parent, running
            continue
        for run_id in [*running, parent]:
            tracker.end_run(run_id, status="KILLED")
    return adopted, inherited


@task(name="open-stage-run")
def open_stage_run(*, config: _PipelineBase, parent_run_id: str, stage: int, kind: str, pipeline_id: str,
                   flow_run_id: str | None) -> str:
    tracker = tracker_for(config)
    # The stage's own config (its stage_overrides applied): what this stage actually trained with.
    stage_config = config.for_stage(stage)
    tags = {"pipeline_id": pipeline_id, "stage": str(stage), "kind": kind, "config_hash": config.config_hash(),
            "stage_override": str(stage_config is not config).lower()}
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    reuse = {"stage": str(stage), "kind": kind}
    run_id = tracker.start_run(name=f"{kind}-stage{stage}", tags=tags, parent_run_id=parent_run_id,
                               reuse_tags=reuse if flow_run_id else None)
    tracker.log_params(run_id, stage_config.model_dump(mode="json"))
    return run_id


def batches_path(batches: PseudoLabelRecord | RegroupRecord | None) -> str | None:
    """The file or directory a cluster-pure stage reads its batches from (None: random batches)."""
    return None if batches is None else batches.path


@cached_task("train-stage")
def train_stage(*, config: _PipelineBase, key: str, out_dir: str, stage: int, data: dict,
                batches: PseudoLabelRecord | RegroupRecord | None, mlflow_run_id: str,
                init_from: TrainRecord | None = None) -> TrainRecord:
    """Train a fresh encoder for one stage (cluster-pure batches from ``batches``; with ``init_from``, one that
    starts from that stage's weights: ``Modality.inherits``); resumes from ``out_dir/checkpoints/last.pt`` if a run was
    killed."""
    if (done := finished_record(out_dir, TrainRecord)) is not None:
        return done
    tracker = tracker_for(config)
    modality = modality_of(config)
    stage_config = config.for_stage(stage)
    spec = modality.train_spec(stage_config, stage=stage, seed=stage_seed(config, stage), out_dir=out_dir, data=data,
                               batches_path=batches_path(batches),
                               init_model_path=init_from.model_path if init_from is not None else None)
    record = train_and_record(
        config=stage_config, tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage,
        spec=spec, entry=modality.launch.train_entry,
        train_here=lambda callbacks: modality.train(spec, callbacks=callbacks), batches_from=batches_path(batches),
        total_steps=modality.total_steps(stage_config, stage=stage, data=data), extra_metrics=modality.train_metrics)
    for path in modality.train_artifacts(stage_config, stage=stage, out_dir=out_dir):
        tracker.log_artifact(mlflow_run_id, path, artifact_path="eval")
    return record


@cached_task("export-embeddings")
def export_embeddings(*, config: _PipelineBase, key: str, out_dir: str, trained: TrainRecord, data: dict,
                      mlflow_run_id: str) -> ExportRecord:
    """Embeddings of the samples MCL clusters with one stage's model, under the stage's precision; as processes
    where training runs as processes (``launch.export_entry``: each rank embeds a contiguous share, rank 0 writes
    the manifest; on a cluster that is a job, not the login node), else here. A modality that serves its model
    logs the stage's encoder as an MLflow model too."""
    if (done := finished_record(out_dir, ExportRecord)) is not None:
        return done
    tracker = tracker_for(config)
    modality = modality_of(config)
    # The stage's own config: its export runs under the stage's precision (a stage override may change it).
    export = modality.export_kwargs(config.for_stage(trained.stage), model_path=trained.model_path, data=data,
                                    out_dir=str(Path(out_dir) / "embeddings"))
    with gpu_slot(config):
        if modality.launch.export_entry and uses_processes(config):
            result = run_stage_processes(config=config, what="export", entry=modality.launch.export_entry,
                                         kwargs={"export": export}, stage_dir=export["out_dir"],
                                         result_file=EXPORT_SUMMARY, log_path=Path(out_dir) / "torchrun.log")
        else:
            result = modality.export(**export)
    tracker.log_metrics(mlflow_run_id, numeric_metrics("export", modality.export_metrics(result)))
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "embeddings", artifact_path="embeddings")
    if modality.serving is not None:
        log_encoder(tracker, mlflow_run_id, name=f"stage{trained.stage}-encoder", model_paths=[trained.model_path],
                    dims=[result["dim"]], modality=config.pipeline,
                    tags={"stage": str(trained.stage), "train_key": trained.key},
                    source_root=Path(config.output_dir).resolve())
    embeddings_dir = in_step_dir(result["dir"], Path(out_dir) / "embeddings")  # a launch's summary: relative
    return ExportRecord(key=key, dir=out_dir, embeddings_dir=embeddings_dir, num_samples=result["num_samples"],
                        dim=result["dim"], mlflow_run_id=mlflow_run_id).save()


@cached_task("cluster-embeddings")
def cluster_embeddings(*, config: _PipelineBase, key: str, out_dir: str, stage: int, exported: ExportRecord,
                       earlier: list[ClusterRecord], data: dict, mlflow_run_id: str) -> ClusterRecord:
    """k-means on stage ``stage``'s embeddings (the samples ``Modality.sample_scope`` names), AMI against earlier
    stages and against the data's attributes."""
    if (done := finished_record(out_dir, ClusterRecord)) is not None:
        return done
    tracker = tracker_for(config)
    ids, attributes = modality_of(config).sample_scope(data)
    spec = config.mcl.kmeans_spec(stage, seed=stage_seed(config, stage))
    with gpu_slot(config):  # k-means on a GPU takes a slot of the pool like training
        summary = steps.cluster_stage(embeddings_dir=exported.embeddings_dir, out_dir=Path(out_dir) / "clusters",
                                      kmeans_spec=spec, earlier_cluster_dirs=[e.clusters_dir for e in earlier],
                                      ids=ids, attributes=attributes, gpu_devices=kmeans_gpu_devices(config))
    return finish_cluster_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage,
                                 k=spec.k, summary=summary)


@cached_task("pseudo-labels")
def make_pseudo_labels(*, config: _PipelineBase, key: str, out_dir: str, for_stage: int,
                       clusters: list[ClusterRecord], exports: list[ExportRecord], data: dict,
                       mlflow_run_id: str) -> PseudoLabelRecord:
    """Pseudo-labels for ``for_stage`` = combination of the cluster ids of ALL stages before it; groups smaller
    than that stage's global batch are handled by ``mcl.small_group_policy``."""
    if (done := finished_record(out_dir, PseudoLabelRecord)) is not None:
        return done
    tracker = tracker_for(config)
    stats = steps.build_pseudo_labels(cluster_dirs=[c.clusters_dir for c in clusters],
                                      embeddings_dirs=[e.embeddings_dir for e in exports],
                                      out_path=Path(out_dir) / "pseudo_labels.npz",
                                      min_group_size=config.global_batch_size(for_stage),
                                      small_group_policy=config.mcl.small_group_policy,
                                      ids=modality_of(config).sample_scope(data)[0])
    get_run_logger().info("pseudo-labels for stage %d: %s", for_stage, stats)
    return finish_pseudo_label_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir,
                                      stats=stats)


@cached_task("regroup-batches")
def regroup_batches(*, config: _PipelineBase, key: str, out_dir: str, stage: int, pseudo: PseudoLabelRecord,
                    data: dict, mlflow_run_id: str) -> RegroupRecord:
    """What cluster-pure stage ``stage`` reads besides the pseudo-labels (CLIP: the training shards re-written
    sorted by group, one sequential pass)."""
    if (done := finished_record(out_dir, RegroupRecord)) is not None:
        return done
    tracker = tracker_for(config)
    result = modality_of(config).regroup(config, stage=stage, seed=stage_seed(config, stage),
                                         pseudo_labels_path=pseudo.path, data=data, out_dir=out_dir)
    tracker.log_metrics(mlflow_run_id, numeric_metrics("regroup", result["stats"]))
    for path in result.get("artifacts", []):
        tracker.log_artifact(mlflow_run_id, path, artifact_path="regrouped")
    return RegroupRecord(key=key, dir=out_dir, path=result["path"], stats=result["stats"],
                         mlflow_run_id=mlflow_run_id).save()


@cached_task("combine-models")
def combine_models(*, config: _PipelineBase, key: str, out_dir: str, trained: list[TrainRecord],
                   mlflow_run_id: str) -> ModelRecord:
    """A model made from the stage models (CLIP's model soup: their weight average), scored like a stage."""
    if (done := finished_record(out_dir, ModelRecord)) is not None:
        return done
    path = modality_of(config).combine_models(model_paths=[r.model_path for r in trained],
                                              out_path=str(Path(out_dir) / "model" / "model.pt"))
    tracker_for(config).log_artifact(mlflow_run_id, Path(out_dir) / "model", artifact_path="combined/model")
    return ModelRecord(key=key, dir=out_dir, model_path=path, mlflow_run_id=mlflow_run_id).save()


@cached_task("encode-for-eval")
def encode_for_eval(*, config: _PipelineBase, key: str, out_dir: str, name: str, model_path: str, data: dict,
                    mlflow_run_id: str) -> FeaturesRecord:
    """The evaluation sets encoded once by one model (a stage or a combined model): what its evaluations read. On a
    cluster launcher a one-process job does it (``launch.encode_entry``; the flow may run on a login node without
    a GPU), else this process; either way inside a slot of the GPU pool, like training."""
    if (done := finished_record(out_dir, FeaturesRecord)) is not None:
        return done
    modality = modality_of(config)
    encode = modality.encode_kwargs(config, model_path=model_path, data=data, out_dir=out_dir)
    with gpu_slot(config):
        if modality.launch.encode_entry and config.launcher.kind != "local":
            path = run_stage_processes(config=config, what="encode", entry=modality.launch.encode_entry,
                                       kwargs={"encode": encode}, stage_dir=out_dir, result_file=ENCODE_SUMMARY,
                                       log_path=Path(out_dir) / "launch.log", single_process=True)["path"]
            path = in_step_dir(path, out_dir)  # the job's summary names it relative to the step directory
        else:
            path = modality.encode_for_eval(**encode)
    return FeaturesRecord(key=key, dir=out_dir, name=name, features=path, model_path=model_path,
                          mlflow_run_id=mlflow_run_id).save()


@cached_task("evaluate")
def evaluate(*, config: _PipelineBase, key: str, out_dir: str, name: str, members: list[Member], data: dict,
             mlflow_run_id: str) -> EvalRecord:
    """The modality's scores of one stage alone or of the concatenation of several (probes, kNN, STS, MMVP,
    retrieval: whatever it measures)."""
    if (done := finished_record(out_dir, EvalRecord)) is not None:
        return done
    metrics = modality_of(config).evaluate(config, members=members, data=data, out_dir=out_dir)
    return finish_eval_record(tracker=tracker_for(config), mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir,
                              name=name, metrics=metrics, details={"members": len(members)})


@cached_task("final-metrics")
def final_metrics(*, config: _PipelineBase, key: str, out_dir: str, trained: list[TrainRecord], data: dict,
                  mlflow_run_id: str) -> EvalRecord:
    """The modality's step on the final representation (text: Hyper-CL's conditioned projections)."""
    if (done := finished_record(out_dir, EvalRecord)) is not None:
        return done
    modality = modality_of(config)
    tracker = tracker_for(config)
    result = modality.final_metrics(config, model_paths=[x.model_path for x in trained], data=data, out_dir=out_dir)
    for path in result.get("artifacts", []):
        tracker.log_artifact(mlflow_run_id, path, artifact_path=modality.final_name)
    return finish_eval_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir,
                              name=modality.final_name, metrics=result["metrics"])


@cached_task("diagnose")
def diagnose(*, config: _PipelineBase, key: str, out_dir: str, stage: int, name: str, trained: TrainRecord,
             exported: ExportRecord, clusters: ClusterRecord | None, data: dict,
             mlflow_run_id: str) -> DiagnosisRecord:
    """Embedding diagnostics of one stage (cosine distributions per attribute and per cluster, anisotropy,
    effective rank, alignment and uniformity), logged to that stage's run."""
    if (done := finished_record(out_dir, DiagnosisRecord)) is not None:
        return done
    result = modality_of(config).diagnose(config, stage=stage, model_path=trained.model_path,
                                          embeddings_dir=exported.embeddings_dir,
                                          clusters_dir=clusters.clusters_dir if clusters else None, data=data,
                                          out_dir=str(Path(out_dir) / "diagnostics"), title=name)
    tracker = tracker_for(config)
    tracker.log_metrics(mlflow_run_id, result["metrics"])
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "diagnostics", artifact_path="eval/diagnostics")
    return DiagnosisRecord(key=key, dir=out_dir, name=name, diagnostics=result["metrics"], plot=result["plot"],
                           mlflow_run_id=mlflow_run_id).save()


@task(name="record-reuse")
def record_reuse(*, config: _PipelineBase, mlflow_run_id: str, record: StepRecord, what: str) -> None:
    """A cached step did not run: say in the current stage run where its result and artifacts came from."""
    tracker = tracker_for(config)
    tracker.set_tags(mlflow_run_id, {f"reused.{what}": "true", f"reused.{what}.source_run_id":
                                     record.mlflow_run_id, f"reused.{what}.dir": record.dir})
    if isinstance(record, EvalRecord):
        tracker.log_metrics(mlflow_run_id, {f"eval/{record.name}/{k}": v for k, v in record.metrics.items()})


@task(name="note-rerun")
def note_rerun(*, config: _PipelineBase, mlflow_run_id: str, rerun_from: int) -> None:
    tracker_for(config).set_tags(mlflow_run_id, {"rerun_from": rerun_from, "forced_recompute": "true"})


@task(name="close-run")
def close_run(*, config: _PipelineBase, mlflow_run_id: str, status: str = "FINISHED") -> None:
    tracker_for(config).end_run(mlflow_run_id, status=status)


@task(name="summarize")
def summarize(*, config: _PipelineBase, parent_run_id: str, pipeline_id: str, results: dict[str, dict],
              cluster_records: list[ClusterRecord], out_dir: str, final: dict | None = None) -> dict:
    """The pipeline's end: its plots and the cluster-size plot, summary.json and results.md, every result metric on
    the parent MLflow run, and the results tables in a Prefect markdown artifact. ``final``: the metrics of the
    modality's step on the final representation (summary entry ``final``, beside the per-representation
    results)."""
    tracker = tracker_for(config)
    modality = modality_of(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"pipeline": config.pipeline, "pipeline_id": pipeline_id, "config_hash": config.config_hash(),
               "results": results, "mlflow_run_id": parent_run_id, **({"final": final} if final else {})}
    tables = modality.tables(config, summary)
    paths = modality.plots(config, results=results, out=out)
    if cluster_records:
        paths.append(plot_cluster_sizes(sizes_by_stage={f"stage {c.stage}": c.sizes for c in cluster_records},
                                        path=out / "cluster_sizes.png"))
    write_json(out / "summary.json", summary)
    markdown = tables_markdown(tables)
    (out / "results.md").write_text(markdown)
    for path in paths:
        tracker.log_artifact(parent_run_id, path, artifact_path="eval")
    tracker.log_artifact(parent_run_id, out / "summary.json", artifact_path="eval")
    # One name per metric: each result under the name its evaluation logged it with (eval/<representation>/...);
    # the concatenations' evaluations already logged theirs on this run.
    logged = tracker.run_state(parent_run_id).metrics
    tracker.log_metrics(parent_run_id, {key: v for name, m in results.items() for k, v in m.items()
                                        if (key := f"eval/{result_slug(name)}/{k}") not in logged})
    create_markdown_artifact(markdown=f"# {config.name}\n\n{markdown}", key=f"results-{pipeline_id[:8]}",
                             description=f"{config.name}: {tables[0].title if tables else 'results'}")
    return {**summary, "dir": str(out), "tracking_hint": tracker.run_url_hint(parent_run_id)}
