"""Prefect tasks of the MCL pipeline: each unpacks the config, calls one ``contrastive`` function, logs to
MLflow through ``tasks.tracking`` and returns a small JSON record (paths, numbers), never tensors.

Caching: every expensive task takes a ``key`` (a digest of the config that affects it and the keys of what it
consumes) and writes into ``out_dir`` named by that key. Prefect caches the returned record under the key, and
the body itself returns early when ``out_dir/record.json`` already holds a finished result, so a new run of the
same pipeline, a retried flow run, or a run whose Prefect result store was wiped all skip finished work.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from prefect import get_run_logger, task
from tqdm.auto import tqdm
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.context import TaskRunContext

from contrastive.modalities.image import steps as stages
from contrastive.mcl import steps
from contrastive.engine.checkpoint import write_json
from contrastive.data.loading import load_dataset
from contrastive.data.image_folder import prepare_image_folder
from contrastive.data.trifeature import prepare_trifeature
from contrastive.modalities.image import dataset_config as datasets
from contrastive.evaluate import plot_attribute_accuracy, plot_cluster_sizes
from pipeline_config.loader import dump_config
from contrastive.modalities.image_text.config import ClipPipelineConfig
from contrastive.modalities.image.config import ImagePipelineConfig, check_feasible
from tasks.records import (ClusterRecord, EvalRecord, ExportRecord, PseudoLabelRecord, StepRecord, TrainRecord,
                           finished_record)
from tasks.launching import gpu_slot, run_stage_processes, uses_processes
from tasks.tracking import MetricBuffer, Tracker, log_encoder

# ---------------------------------------------------------------------------------------------------- helpers
def cache_key_from_parameters(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Prefect cache key = task name + the content key the flow computed (config + input digests)."""
    return f"{context.task.name}-{parameters['key']}"


def tracker_for(config: ImagePipelineConfig) -> Tracker:
    return Tracker(uri=config.tracking.uri, experiment=config.tracking.experiment,
                   artifact_root=Path(config.output_dir) / "mlartifacts")


STAGE_SEED_STRIDE = 1000  # > any stage count, so (seed, stage) pairs never share a stage seed


def stage_seed(config: ImagePipelineConfig | ClipPipelineConfig, stage: int) -> int:
    """Seed of one stage's training, k-means and batch plans: distinct for every (pipeline seed, stage).

    seed + stage would make stage 1 of seed s train exactly like stage 0 of seed s + 1 (a control stage has no
    pseudo-labels), so multi-seed runs would share models and understate the spread across seeds.
    """
    return config.seed * STAGE_SEED_STRIDE + stage


def cached_task(name: str, **kwargs):
    return task(name=name, cache_key_fn=cache_key_from_parameters, persist_result=True, **kwargs)


# The finish_* helpers end the tasks of BOTH pipelines (this module and tasks.clip_tasks), so an MCL and a CLIP
# stage run carry the same metric names, artifact paths and record fields, and the comparison tools read either.
def numeric_metrics(prefix: str, values: dict) -> dict[str, float]:
    """``{prefix/key: value}`` for the numeric entries of a summary dict (MLflow metrics must be numbers)."""
    return {f"{prefix}/{k}": v for k, v in values.items() if isinstance(v, (int, float))}


def finish_train_record(*, tracker: Tracker, mlflow_run_id: str, key: str, out_dir: str, stage: int, summary: dict,
                        extra_metrics: dict[str, float]) -> TrainRecord:
    """After a stage trained: tag a resumed run, log loss, time, ``extra_metrics`` (the pipeline's throughput
    numbers) and the batch plan, upload checkpoints, model and summary, and save the task record."""
    if summary["resumed_from_step"] is not None:
        tracker.set_tags(mlflow_run_id, {"resumed_from_step": summary["resumed_from_step"]})
    tracker.log_metrics(mlflow_run_id, {"train/final_loss": summary["final_loss"], "train/seconds": summary["seconds"],
                                        **extra_metrics, **numeric_metrics("batch_plan", summary["batch_plan"])})
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "checkpoints", artifact_path="checkpoints")
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "model", artifact_path="model")
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "train_summary.json")
    return TrainRecord(key=key, dir=out_dir, stage=stage, mlflow_run_id=mlflow_run_id,
                       model_path=summary["model_path"], summary=summary).save()


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


def result_slug(name: str) -> str:
    """The name the evaluation of a results-table row logs under: "stage 0" -> stage0, "MCL concat" -> mcl_concat,
    "control (no HEX) stage 1" -> control_stage1, "soup" -> soup."""
    words = name.lower().replace("(no hex)", "").split()
    return "_".join(words).replace("stage_", "stage")


def publish_summary(*, config: ImagePipelineConfig | ClipPipelineConfig, tracker: Tracker, parent_run_id: str,
                    pipeline_id: str, results: dict[str, dict], cluster_records: list[ClusterRecord], out: Path,
                    plots: list[Path], table: str, heading: str, artifact_key: str, description: str,
                    extra_summary: dict | None = None) -> dict:
    """End of a pipeline's summarize task: add the cluster-size plot, write summary.json and results.md, put plots,
    summary and all result metrics on the parent MLflow run, and the table in a Prefect markdown artifact."""
    paths = list(plots)
    if cluster_records:
        paths.append(plot_cluster_sizes(sizes_by_stage={f"stage {c.stage}": c.sizes for c in cluster_records},
                                        path=out / "cluster_sizes.png"))
    summary = {"pipeline_id": pipeline_id, "config_hash": config.config_hash(), "results": results,
               "mlflow_run_id": parent_run_id, **(extra_summary or {})}
    write_json(out / "summary.json", summary)
    (out / "results.md").write_text(table)
    for path in paths:
        tracker.log_artifact(parent_run_id, path, artifact_path="eval")
    tracker.log_artifact(parent_run_id, out / "summary.json", artifact_path="eval")
    # One name per metric: each result under the name its evaluation logged it with (eval/<representation>/...);
    # the concatenations' evaluations already logged theirs on this run.
    logged = tracker.client.get_run(parent_run_id).data.metrics
    tracker.log_metrics(parent_run_id, {key: v for name, m in results.items() for k, v in m.items()
                                        if (key := f"eval/{result_slug(name)}/{k}") not in logged})
    create_markdown_artifact(markdown=f"# {config.name}: {heading}\n\n{table}", key=f"{artifact_key}-{pipeline_id[:8]}",
                             description=description)
    return {**summary, "dir": str(out), "tracking_hint": tracker.run_url_hint(parent_run_id)}


class PrefectProgress:
    """Training callback that mirrors progress into a Prefect progress artifact (visible in the UI)."""

    def __init__(self, *, total_steps: int, description: str):
        self.total_steps = max(1, total_steps)
        self.artifact_id = create_progress_artifact(progress=0.0, description=description)
        self.last_percent = 0.0

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        percent = min(100.0, 100.0 * step / self.total_steps)
        if percent - self.last_percent >= 5 or percent >= 100:
            update_progress_artifact(self.artifact_id, progress=percent)
            self.last_percent = percent

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        get_run_logger().info("epoch %d: loss %.4f", epoch, metrics.get("train/epoch_loss", float("nan")))

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        pass


class TerminalProgress:
    """A tqdm bar on the terminal for an interactive `mclpipe run` (disabled when stderr is not a TTY)."""

    def __init__(self, *, total_steps: int, description: str):
        self.bar = tqdm(total=total_steps, desc=description, unit="step", disable=None, leave=False)

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.bar.n = min(step, self.bar.total)
        self.bar.set_postfix(loss=f"{metrics.get('train/loss', float('nan')):.3f}", refresh=True)

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        pass

    def close(self) -> None:
        self.bar.close()


def train_and_record(*, config: ImagePipelineConfig | ClipPipelineConfig, tracker: Tracker, mlflow_run_id: str,
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
    with gpu_slot(config), \
            tracker.system_metrics(mlflow_run_id, seconds=config.tracking.system_metrics_seconds):
        summary = _train(config=config, tracker=tracker, mlflow_run_id=mlflow_run_id, out_dir=out_dir, spec=spec, entry=entry,
                         train_here=train_here, total_steps=total_steps, description=description)
    return finish_train_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage,
                               summary=summary, extra_metrics={
                                   "train/samples_per_second": summary["samples_per_second"],
                                   "train/trimmed_samples": summary["trimmed_samples"], **extra_metrics(summary)})


def _train(*, config, tracker: Tracker, mlflow_run_id: str, out_dir: str, spec, entry: str, train_here,
           total_steps: int, description: str) -> dict:
    """train_and_record's training: as processes where config.launcher says (torchrun here, a Slurm or Kubernetes
    job: tasks/launching.py), or here with metrics streamed to MLflow."""
    if uses_processes(config):
        summary = run_stage_processes(config=config, what="train", entry=entry, kwargs={"spec": spec.to_json()},
                                      stage_dir=out_dir)
        metrics_file = Path(out_dir) / "train_metrics.jsonl"
        history = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() \
            else []
        tracker.log_metric_history(mlflow_run_id, [(int(h.pop("step")), h) for h in history])
    else:
        buffer = MetricBuffer(tracker=tracker, run_id=mlflow_run_id)
        terminal = TerminalProgress(total_steps=total_steps, description=description)
        progress = PrefectProgress(total_steps=total_steps, description=f"{description} training ({out_dir})")
        try:
            summary = train_here([buffer, progress, terminal])
        finally:
            terminal.close()
        buffer.flush(final=True)
    return summary


# ---------------------------------------------------------------------------------------------------- tasks
@task(name="prepare-data")
def prepare_data(*, config: ImagePipelineConfig) -> dict:
    """Generate (or find) the dataset and check the config against its size before any training."""
    data = config.data
    if data.kind == "trifeature" and data.trifeature.hierarchy is not None:  # families for HEX (docs/hex.md)
        from contrastive.data.hierarchical import prepare_hierarchical
        t = data.trifeature
        path = prepare_hierarchical(root=data.cache_dir, num_train=t.num_train, num_test=t.num_test,
                                    spec=t.hierarchy, image_size=t.image_size, seed=t.seed)
    elif data.kind == "trifeature":
        t = data.trifeature
        path = prepare_trifeature(root=data.cache_dir, num_train=t.num_train, num_test=t.num_test,
                                  image_size=t.image_size, num_colors=t.num_colors, num_shapes=t.num_shapes,
                                  num_textures=t.num_textures, seed=t.seed)
    elif data.kind == "shards":
        from contrastive.data.shards import prepare_shards
        s = data.shards
        path = prepare_shards(train_urls=s.train_urls, test_urls=s.test_urls, root=data.cache_dir,
                              image_size=s.image_size, label_fields=s.label_fields,
                              max_skip_fraction=s.max_skip_fraction)
    elif data.kind in datasets.KINDS:  # CIFAR-MNIST, CelebA, STL-10, ImageNet, balanced Trifeature
        path = datasets.prepare(data.kind, getattr(data, data.kind), cache_dir=data.cache_dir)
    else:
        f = data.image_folder
        path = prepare_image_folder(source=f.source, root=data.cache_dir, image_size=f.image_size,
                                    labels_csv=f.labels_csv, test_fraction=f.test_fraction, seed=f.seed,
                                    storage=f.storage, split_from_folders=f.split_from_folders,
                                    max_skip_fraction=f.max_skip_fraction)
    dataset = load_dataset(path)
    num_train = len(dataset.indices("train"))
    check_feasible(config, num_train=num_train)
    skip = {"image_folder": data.image_folder.max_skip_fraction,
            "shards": data.shards.max_skip_fraction}.get(data.kind, 0.0)
    return {"dir": str(path), "digest": dataset.digest, "num_train": num_train,
            "num_test": len(dataset.indices("test")), "attributes": list(dataset.labels),
            "storage": dataset.manifest.get("storage", "memory"), "max_skip_fraction": skip}


@task(name="open-pipeline-run")
def open_pipeline_run(*, config: ImagePipelineConfig, pipeline_id: str, flow_run_id: str | None, pipeline_dir: str) -> str:
    """Open the parent MLflow run, and keep the config beside the results (``mclpipe resume`` reads it)."""
    Path(pipeline_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(pipeline_dir) / "config.json", config.model_dump(mode="json"))
    (Path(pipeline_dir) / "config.yaml").write_text(dump_config(config))
    tracker = tracker_for(config)
    tags = {"pipeline_id": pipeline_id, "config_hash": config.config_hash(), "kind": "pipeline",
            "pipeline_name": config.name}
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    # A retried flow run reopens its parent run: the one of this flow run that is a pipeline (its stage runs carry
    # the flow run's id too, and the latest of them was reopened as the parent before) of this pipeline.
    reuse = {"prefect.flow_run_id": flow_run_id, "kind": "pipeline", "pipeline_id": pipeline_id}
    run_id = tracker.start_run(name=f"{config.name}-{pipeline_id[:8]}", tags=tags,
                               reuse_tags=reuse if flow_run_id else None)
    tracker.log_params(run_id, config.model_dump(mode="json"))
    tracker.log_text(run_id, dump_config(config), "config.yaml")
    return run_id


@task(name="open-stage-run")
def open_stage_run(*, config: ImagePipelineConfig, parent_run_id: str, stage: int, kind: str, pipeline_id: str,
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


@cached_task("train-stage")
def train_stage(*, config: ImagePipelineConfig, key: str, out_dir: str, stage: int, data: dict,
                pseudo_labels: PseudoLabelRecord | None, mlflow_run_id: str,
                init_from: TrainRecord | None = None) -> TrainRecord:
    """Train a fresh encoder for one stage (or, with ``init_from``, one that starts from that stage's weights:
    mcl.inherit); resumes from ``out_dir/checkpoints/last.pt`` if a run was killed."""
    if (done := finished_record(out_dir, TrainRecord)) is not None:
        return done
    tracker = tracker_for(config)
    config = config.for_stage(stage)
    t = config.train
    seed = stage_seed(config, stage)
    spec = stages.ImageStageSpec(
        dataset_dir=data["dir"], stage_dir=out_dir, pseudo_labels_path=pseudo_labels.path if pseudo_labels else None,
        model=config.model.model_dump(mode="json"), method=config.method.model_dump(mode="json"),
        augment=config.augment.model_dump(), batch_size=t.batch_size, seed=seed, device=config.device,
        remainder_policy=config.mcl.remainder_policy, optim=t.optim_spec(),
        loop=t.loop_spec(), threads=t.threads, workers=t.workers,
        init_model_path=init_from.model_path if init_from is not None else None)
    return train_and_record(
        config=config, tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage, spec=spec,
        entry="contrastive.modalities.image.steps:train_stage_from_json",
        train_here=lambda callbacks: stages.train_stage(spec, callbacks=callbacks),
        batches_from=spec.pseudo_labels_path,
        total_steps=t.epochs * (t.max_steps_per_epoch or max(1, data["num_train"] // t.batch_size)),
        extra_metrics=lambda summary: {"train/views_per_second": summary["views_per_second"]})


@cached_task("export-embeddings")
def export_embeddings(*, config: ImagePipelineConfig, key: str, out_dir: str, trained: TrainRecord, data: dict,
                      mlflow_run_id: str) -> ExportRecord:
    if (done := finished_record(out_dir, ExportRecord)) is not None:
        return done
    tracker = tracker_for(config)
    export = {"dataset_dir": data["dir"], "model_path": trained.model_path,
              "out_dir": str(Path(out_dir) / "embeddings"), "batch_size": 512, "device": config.device,
              "workers": config.train.workers}
    with gpu_slot(config):
        if uses_processes(config):  # each rank embeds its share of the samples into its own shards
            result = run_stage_processes(config=config, what="export",
                                         entry="contrastive.modalities.image.steps:export_stage_from_json", kwargs={"export": export}, stage_dir=export["out_dir"],
                                         result_file=stages.EXPORT_SUMMARY, log_path=Path(out_dir) / "torchrun.log")
        else:
            result = stages.export_stage_embeddings(**export)
    tracker.log_metrics(mlflow_run_id, {"export/unreadable": result["unreadable"]})
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "embeddings", artifact_path="embeddings")
    log_encoder(tracker, mlflow_run_id, name=f"stage{trained.stage}-encoder", model_paths=[trained.model_path],
                dims=[result["dim"]], tags={"stage": str(trained.stage), "train_key": trained.key})
    return ExportRecord(key=key, dir=out_dir, embeddings_dir=result["dir"], num_samples=result["num_samples"],
                        dim=result["dim"], mlflow_run_id=mlflow_run_id).save()


def sample_scope(dataset_dir: str | None) -> tuple[np.ndarray | None, dict[str, np.ndarray] | None]:
    """Which samples MCL clusters and which attributes the clusters are compared with: the training split of an
    image dataset (ids, labels aligned to them), or every exported sample without labels (``dataset_dir`` None:
    the CLIP pipeline's shards). A text dataset (the text pipeline's sentences) has the same index."""
    if dataset_dir is None:
        return None, None
    from contrastive.modalities.text.dataset import is_text_dataset, load_text_dataset
    dataset = load_text_dataset(dataset_dir) if is_text_dataset(dataset_dir) else load_dataset(dataset_dir)
    train = dataset.indices("train")
    return dataset.ids[train], {name: labels[train] for name, labels in dataset.labels.items()}


# Both pipelines run these two steps between stages.
@cached_task("cluster-embeddings")
def cluster_embeddings(*, config: ImagePipelineConfig | ClipPipelineConfig, key: str, out_dir: str, stage: int,
                       exported: ExportRecord, earlier: list[ClusterRecord], dataset_dir: str | None,
                       mlflow_run_id: str) -> ClusterRecord:
    """k-means on stage ``stage``'s embeddings (see ``sample_scope`` for which samples), AMI against earlier stages."""
    if (done := finished_record(out_dir, ClusterRecord)) is not None:
        return done
    tracker = tracker_for(config)
    ids, attributes = sample_scope(dataset_dir)
    spec = config.mcl.kmeans_spec(stage, seed=stage_seed(config, stage))
    summary = steps.cluster_stage(embeddings_dir=exported.embeddings_dir, out_dir=Path(out_dir) / "clusters",
                                  kmeans_spec=spec, earlier_cluster_dirs=[e.clusters_dir for e in earlier],
                                  ids=ids, attributes=attributes)
    return finish_cluster_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage,
                                 k=spec.k, summary=summary)


@cached_task("pseudo-labels")
def make_pseudo_labels(*, config: ImagePipelineConfig | ClipPipelineConfig, key: str, out_dir: str, for_stage: int,
                       clusters: list[ClusterRecord], exports: list[ExportRecord], dataset_dir: str | None,
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
                                      ids=sample_scope(dataset_dir)[0])
    get_run_logger().info("pseudo-labels for stage %d: %s", for_stage, stats)
    return finish_pseudo_label_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir,
                                      stats=stats)


@cached_task("evaluate")
def evaluate(*, config: ImagePipelineConfig, key: str, out_dir: str, name: str, exports: list[ExportRecord], data: dict,
             mlflow_run_id: str) -> EvalRecord:
    """Linear probe + kNN per attribute for one stage alone or the concatenation of several stages."""
    if (done := finished_record(out_dir, EvalRecord)) is not None:
        return done
    tracker = tracker_for(config)
    e = config.eval
    metrics = stages.evaluate_embeddings(dataset_dir=data["dir"], embeddings_dirs=[x.embeddings_dir for x in exports],
                                         probe_c=e.probe_c, probe_max_iter=e.probe_max_iter,
                                         probe_max_train=e.probe_max_train, knn_k=e.knn_k, seed=config.seed)
    return finish_eval_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, name=name,
                              metrics=metrics)


@task(name="record-reuse")
def record_reuse(*, config: ImagePipelineConfig, mlflow_run_id: str, record: StepRecord, what: str) -> None:
    """A cached step did not run: say in the current stage run where its result and artifacts came from."""
    tracker = tracker_for(config)
    tracker.set_tags(mlflow_run_id, {f"reused.{what}": "true", f"reused.{what}.source_run_id":
                                     record.mlflow_run_id, f"reused.{what}.dir": record.dir})
    if isinstance(record, EvalRecord):
        tracker.log_metrics(mlflow_run_id, {f"eval/{record.name}/{k}": v for k, v in record.metrics.items()})


@task(name="note-rerun")
def note_rerun(*, config: ImagePipelineConfig, mlflow_run_id: str, rerun_from: int) -> None:
    tracker_for(config).set_tags(mlflow_run_id, {"rerun_from": rerun_from, "forced_recompute": "true"})


@task(name="close-run")
def close_run(*, config: ImagePipelineConfig, mlflow_run_id: str, status: str = "FINISHED") -> None:
    tracker_for(config).end_run(mlflow_run_id, status=status)


@task(name="summarize")
def summarize(*, config: ImagePipelineConfig, parent_run_id: str, pipeline_id: str, results: dict[str, dict],
              cluster_records: list[ClusterRecord], out_dir: str) -> dict:
    """Plots and a results table for the whole pipeline, on the parent MLflow run and as a Prefect artifact."""
    tracker = tracker_for(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    probe = plot_attribute_accuracy(results=results, path=out / "probe_accuracy.png")
    knn = plot_attribute_accuracy(results=results, path=out / "knn_accuracy.png", metric="knn",
                                  title="kNN accuracy per attribute")
    return publish_summary(config=config, tracker=tracker, parent_run_id=parent_run_id, pipeline_id=pipeline_id,
                           results=results, cluster_records=cluster_records, out=out, plots=[probe, knn],
                           table=results_table_markdown(results), heading="linear-probe accuracy",
                           artifact_key="mcl-results", description="MCL results")


def results_table_markdown(results: dict[str, dict], metric: str = "probe") -> str:
    attributes = sorted({k.split("/", 1)[1] for m in results.values() for k in m if k.startswith(metric + "/")})
    lines = ["| representation | " + " | ".join(attributes) + " |", "|---" * (len(attributes) + 1) + "|"]
    for name, metrics in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{metrics.get(f'{metric}/{a}', float('nan')):.3f}"
                                                  for a in attributes) + " |")
    return "\n".join(lines) + "\n"
