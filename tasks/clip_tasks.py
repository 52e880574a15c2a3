"""Prefect tasks of the CLIP MCL pipeline: unpack the config, call one ``contrastive.modalities.image_text.steps`` function, log to
MLflow through ``tasks.tracking``, return a small JSON record (paths, numbers).

Same caching contract as ``tasks.mcl_tasks``: every expensive task takes ``key`` (digest of the config that affects
it and the keys of its inputs) and ``out_dir`` (named by that key), returns early when ``out_dir/record.json``
holds a finished result, and Prefect caches the record under the key. The MLflow helpers (pipeline and stage runs,
reuse tags, closing runs, and the ``finish_*`` / ``publish_summary`` ends of the tasks) are the unimodal pipeline's,
so both pipelines leave the same run tree with the same metric names.
"""
from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from contrastive.modalities.image_text import steps as stages
from contrastive.modalities.image_text.data import count_samples, data_fingerprint, expand_urls
from contrastive.modalities.image_text.evaluate import plot_metric_groups
from contrastive.modalities.image_text.model import ClipSpec, file_fingerprint, resolve_pretrained
from contrastive.modalities.image_text.config import ClipPipelineConfig, check_clip_feasible, check_clip_pretrained
from pipeline_config.schema import digest_of
from tasks.mcl_tasks import (cached_task, finish_eval_record, numeric_metrics, publish_summary, stage_seed,
                             tracker_for, train_and_record)
from tasks.records import (ClusterRecord, EvalRecord, ExportRecord, FeaturesRecord, GroupedShardsRecord, ModelRecord,
                           PseudoLabelRecord, TrainRecord, finished_record)


# ---------------------------------------------------------------------------------------------------- helpers
def clip_spec(config: ClipPipelineConfig) -> ClipSpec:
    """The one init every stage starts from."""
    m = config.model
    return ClipSpec(model_name=m.name, pretrained=m.pretrained, init_seed=m.init_seed,
                    trainable_image_blocks=m.trainable_image_blocks, lock_text=m.lock_text,
                    train_logit_scale=m.train_logit_scale, cache_dir=m.cache_dir)


def synthetic_root(config: ClipPipelineConfig) -> Path:
    params = config.data.synthetic.model_dump(mode="json")
    return Path(config.data.cache_dir).resolve() / f"clip-synthetic-{digest_of(params)[:10]}"


def _dir_fingerprint(directory: str | None) -> list | None:
    if not directory:
        return None
    root = Path(directory)
    return sorted([str(p.relative_to(root)), p.stat().st_size] for p in root.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------------- tasks
@task(name="clip-prepare-data")
def prepare_clip_data(*, config: ClipPipelineConfig) -> dict:
    """Resolve (or write the synthetic) shards, the held-out set and the MMVP directory; check K^N <= M/B and that
    the init weights resolve, before any training."""
    logger = get_run_logger()
    check_clip_pretrained(config)
    d, e = config.data, config.eval
    synthetic = None
    if d.shards is None:
        s = d.synthetic
        synthetic = stages.prepare_synthetic_data(
            root=synthetic_root(config), num_train=s.num_train, num_heldout=s.num_heldout,
            samples_per_shard=s.samples_per_shard, image_size=s.image_size, num_colors=s.num_colors,
            num_shapes=s.num_shapes, num_textures=s.num_textures, corrupt=s.corrupt,
            mmvp_pairs_per_category=s.mmvp_pairs_per_category, seed=s.seed)
        logger.info("synthetic image-text shards in %s", synthetic_root(config))
    train_urls = synthetic["train_urls"] if synthetic else expand_urls(d.shards)
    heldout_urls = expand_urls(d.heldout_shards) if d.heldout_shards else (synthetic or {}).get("heldout_urls")
    mmvp_dir = str(e.mmvp_dir) if e.mmvp_dir else (synthetic or {}).get("mmvp_dir")
    count = count_samples(train_urls, num_samples=d.num_samples)
    check_clip_feasible(config, num_train=count.total)
    weights, _ = resolve_pretrained(model_name=config.model.name, pretrained=config.model.pretrained,
                                    cache_dir=config.model.cache_dir)
    if not mmvp_dir:
        logger.warning("no MMVP directory (eval.mmvp_dir): MMVP scores are skipped")
    if not heldout_urls:
        logger.warning("no held-out shards (data.heldout_shards): retrieval recall is skipped")
    digest = digest_of({"train": data_fingerprint(train_urls), "heldout": data_fingerprint(heldout_urls or []),
                        "mmvp": _dir_fingerprint(mmvp_dir), "weights": file_fingerprint(weights)})
    return {"dir": str(Path(train_urls[0]).parent), "train_urls": train_urls, "heldout_urls": heldout_urls,
            "mmvp_dir": mmvp_dir, "num_train": count.total, "count_source": count.source, "digest": digest}


@cached_task("clip-train-stage")
def train_clip_stage(*, config: ClipPipelineConfig, key: str, out_dir: str, stage: int, data: dict,
                     grouped: GroupedShardsRecord | None, mlflow_run_id: str) -> TrainRecord:
    """Fine-tune stage ``stage`` from the shared init (random batches, or cluster-pure batches from ``grouped``);
    in this process, or under torchrun when distributed.nproc_per_node > 1. Resumes from checkpoints/last.pt."""
    if (done := finished_record(out_dir, TrainRecord)) is not None:
        return done
    tracker = tracker_for(config)
    t, m = config.train, config.mcl
    seed = stage_seed(config, stage)
    spec = stages.ClipStageSpec(
        clip=clip_spec(config).to_dict(), urls=data["train_urls"], grouped_dir=grouped.grouped_dir if grouped else None,
        stage_dir=out_dir, global_batch_size=t.global_batch_size, optim=t.optim_spec(), loop=t.loop_spec(),
        grad_checkpointing=t.grad_checkpointing, device=config.device, seed=seed, remainder_policy=m.remainder_policy,
        active_streams=m.active_streams, group_shuffle_buffer=m.group_shuffle_buffer,
        shuffle_buffer=config.data.shuffle_buffer, decode_workers=config.data.decode_workers,
        max_skip_fraction=config.data.max_skip_fraction, num_samples=config.data.num_samples,
        local_loss=config.distributed.local_loss, data_slots=config.distributed.data_slots, threads=t.threads)
    return train_and_record(
        config=config, tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage, spec=spec,
        entry="contrastive.modalities.image_text.steps:train_stage_from_json",
        train_here=lambda callbacks: stages.train_stage(spec, callbacks=callbacks), batches_from=spec.grouped_dir,
        total_steps=t.epochs * (t.max_steps_per_epoch or max(1, data["num_train"] // t.global_batch_size)),
        extra_metrics=lambda summary: numeric_metrics("data", summary["data"]))


@cached_task("clip-export-embeddings")
def export_clip_embeddings(*, config: ClipPipelineConfig, key: str, out_dir: str, trained: TrainRecord, data: dict,
                           mlflow_run_id: str) -> ExportRecord:
    """Image embeddings of every good training sample, keyed by ``__key__``."""
    if (done := finished_record(out_dir, ExportRecord)) is not None:
        return done
    tracker = tracker_for(config)
    result = stages.export_stage(model_path=trained.model_path, urls=data["train_urls"],
                                 out_dir=str(Path(out_dir) / "embeddings"), batch_size=config.eval.export_batch_size,
                                 device=config.device, max_skip_fraction=config.data.max_skip_fraction,
                                 workers=config.data.decode_workers)
    tracker.log_metrics(mlflow_run_id, numeric_metrics("export", result["data"]))
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "embeddings", artifact_path="embeddings")
    return ExportRecord(key=key, dir=out_dir, embeddings_dir=result["dir"], num_samples=result["num_samples"],
                        dim=result["dim"], mlflow_run_id=mlflow_run_id).save()


@cached_task("clip-reshard-by-group")
def reshard_clip_shards(*, config: ClipPipelineConfig, key: str, out_dir: str, stage: int,
                        pseudo: PseudoLabelRecord, data: dict, mlflow_run_id: str) -> GroupedShardsRecord:
    """Group-sorted copy of the training shards for cluster-pure stage ``stage`` (one sequential pass)."""
    if (done := finished_record(out_dir, GroupedShardsRecord)) is not None:
        return done
    tracker = tracker_for(config)
    grouped_dir = str(Path(out_dir) / "grouped")
    manifest = stages.reshard_stage(pseudo_labels_path=pseudo.path, urls=data["train_urls"], out_dir=grouped_dir,
                                    slots=config.distributed.slots(), seed=stage_seed(config, stage),
                                    spool_bytes=config.mcl.spool_mb << 20)
    tracker.log_metrics(mlflow_run_id, {f"reshard/{k}": v for k, v in manifest.items()
                                        if isinstance(v, (int, float)) and k != "seed"})
    tracker.log_artifact(mlflow_run_id, Path(grouped_dir) / "grouped.json", artifact_path="grouped")
    return GroupedShardsRecord(key=key, dir=out_dir, grouped_dir=grouped_dir, samples=manifest["samples"],
                               files=manifest["files"], mlflow_run_id=mlflow_run_id).save()


@cached_task("clip-soup")
def make_clip_soup(*, config: ClipPipelineConfig, key: str, out_dir: str, trained: list[TrainRecord],
                   mlflow_run_id: str) -> ModelRecord:
    """Model soup: the weight average of the stage models (second integration of the stages)."""
    if (done := finished_record(out_dir, ModelRecord)) is not None:
        return done
    path = stages.make_soup(model_paths=[r.model_path for r in trained],
                            out_path=str(Path(out_dir) / "model" / "model.pt"))
    tracker_for(config).log_artifact(mlflow_run_id, Path(out_dir) / "model", artifact_path="soup/model")
    return ModelRecord(key=key, dir=out_dir, model_path=path, mlflow_run_id=mlflow_run_id).save()


@cached_task("clip-encode-eval")
def encode_clip_eval(*, config: ClipPipelineConfig, key: str, out_dir: str, name: str, model_path: str, data: dict,
                     mlflow_run_id: str) -> FeaturesRecord:
    """MMVP and held-out retrieval features of one model (a stage or the soup)."""
    if (done := finished_record(out_dir, FeaturesRecord)) is not None:
        return done
    e = config.eval
    path = stages.encode_eval_sets(model_path=model_path, out_dir=out_dir, mmvp_dir=data["mmvp_dir"],
                                   heldout_urls=data["heldout_urls"], prompt=e.mmvp_prompt,
                                   retrieval_max_samples=e.retrieval_max_samples, batch_size=e.batch_size,
                                   device=config.device, max_skip_fraction=config.data.max_skip_fraction)
    return FeaturesRecord(key=key, dir=out_dir, name=name, features=path, mlflow_run_id=mlflow_run_id).save()


@cached_task("clip-score-eval")
def score_clip_eval(*, config: ClipPipelineConfig, key: str, out_dir: str, name: str, features: list[FeaturesRecord],
                    mlflow_run_id: str) -> EvalRecord:
    """MMVP per category + average and retrieval R@1/5/10 of one model or of the concatenation of several."""
    if (done := finished_record(out_dir, EvalRecord)) is not None:
        return done
    tracker = tracker_for(config)
    metrics = stages.score_eval_sets(feature_files=[f.features for f in features])
    return finish_eval_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, name=name,
                              metrics=metrics, details={"stages": [f.name for f in features]})


@task(name="clip-summarize")
def summarize_clip(*, config: ClipPipelineConfig, parent_run_id: str, pipeline_id: str,
                   results: dict[str, dict], cluster_records: list[ClusterRecord], out_dir: str) -> dict:
    """MMVP / retrieval plots and a results table on the parent MLflow run and as a Prefect artifact."""
    tracker = tracker_for(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if any(k.startswith("mmvp/") for m in results.values() for k in m):
        paths.append(plot_metric_groups(results=results, prefix="mmvp", path=out / "mmvp.png",
                                        title="MMVP-VLM pair accuracy per category"))
    if any(k.startswith("retrieval/") for m in results.values() for k in m):
        paths.append(plot_metric_groups(results=results, prefix="retrieval", path=out / "retrieval.png",
                                        title="zero-shot retrieval recall@k (held-out)", ylabel="recall (%)"))
    return publish_summary(config=config, tracker=tracker, parent_run_id=parent_run_id, pipeline_id=pipeline_id,
                           results=results, cluster_records=cluster_records, out=out, plots=paths,
                           table=clip_results_markdown(results), heading="CLIP MCL results",
                           artifact_key="clip-results", description="CLIP MCL results",
                           extra_summary={"pipeline": "clip"})


CLIP_TABLE_COLUMNS = ("mmvp/average", "retrieval/i2t_r@1", "retrieval/t2i_r@1", "retrieval/mean_r@5",
                      "retrieval/mean_r@10")


def clip_results_markdown(results: dict[str, dict]) -> str:
    lines = ["| representation | " + " | ".join(CLIP_TABLE_COLUMNS) + " |", "|---" * (len(CLIP_TABLE_COLUMNS) + 1)
             + "|"]
    for name, metrics in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{metrics.get(c, float('nan')):.1f}" for c in CLIP_TABLE_COLUMNS)
                     + " |")
    return "\n".join(lines) + "\n"
