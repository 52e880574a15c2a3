"""Prefect tasks of the text pipeline: unpack the config, call one ``contrastive.modalities.text`` function, log to MLflow
through ``tasks.tracking`` and return a small record (paths, numbers).

Same caching contract as ``tasks.mcl_tasks`` (whose MLflow helpers, ``train_and_record`` and ``finish_*`` ends
these reuse, so a text stage run carries the same metric names and artifacts as an image one, plus the isotropy
trajectory ``iso/*`` logged while training and its plot).
"""
from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from contrastive.modalities.text import steps as stages
from contrastive.modalities.text.dataset import GeneratorParams, load_text_dataset, prepare_generated_text, prepare_text_files
from contrastive.modalities.text.isotropy import plot_isotropy_history
from contrastive.modalities.text.config import TextPipelineConfig, check_text_feasible
from tasks.mcl_tasks import (cached_task, finish_eval_record, publish_summary, results_table_markdown, stage_seed,
                             tracker_for, train_and_record)
from tasks.records import ClusterRecord, EvalRecord, ExportRecord, PseudoLabelRecord, TrainRecord, finished_record


@task(name="text-prepare-data")
def prepare_text_data(*, config: TextPipelineConfig) -> dict:
    """Generate (or find) the sentences, or read the user's files (errors name file and line); check the capacity
    rule against the number of training sentences before any training."""
    d = config.data
    if d.kind == "generator":
        g = d.generator
        path = prepare_generated_text(root=d.cache_dir, params=GeneratorParams(
            num_train=g.num_train, num_test=g.num_test, num_sts_pairs=g.num_sts_pairs,
            num_csts_pairs=g.num_csts_pairs, vocab_min_count=d.vocab_min_count, seed=g.seed))
    else:
        f = d.files
        path = prepare_text_files(root=d.cache_dir, sentences_path=f.sentences, sts_path=f.sts, csts_path=f.csts,
                                  nli_path=f.nli, test_fraction=f.test_fraction, vocab_min_count=d.vocab_min_count,
                                  seed=config.seed)
    dataset = load_text_dataset(path)
    num_train = len(dataset.indices("train"))
    check_text_feasible(config, num_train=num_train)
    get_run_logger().info("text data in %s: %d training sentences, attributes %s, evaluation files %s", path,
                          num_train, dataset.attributes, sorted(dataset.manifest.get("files", {})))
    return {"dir": str(path), "digest": dataset.digest, "num_train": num_train,
            "num_test": len(dataset.indices("test")), "attributes": dataset.attributes,
            "files": dataset.manifest.get("files", {})}


def text_stage_spec(config: TextPipelineConfig, *, stage: int, out_dir: str, data: dict,
                    pseudo_labels: PseudoLabelRecord | None) -> stages.TextStageSpec:
    t = config.train
    return stages.TextStageSpec(
        dataset_dir=data["dir"], stage_dir=out_dir, pseudo_labels_path=pseudo_labels.path if pseudo_labels else None,
        encoder=config.encoder_spec().to_json(), method=config.method.model_dump(mode="json"),
        batch_size=t.batch_size, remainder_policy=config.mcl.remainder_policy, seed=stage_seed(config, stage),
        device=config.device, optim=t.optim_spec(), loop=t.loop_spec(), threads=t.threads,
        isotropy=config.isotropy.model_dump(mode="json"))


@cached_task("text-train-stage")
def train_text_stage(*, config: TextPipelineConfig, key: str, out_dir: str, stage: int, data: dict,
                     pseudo_labels: PseudoLabelRecord | None, mlflow_run_id: str) -> TrainRecord:
    """Train a fresh SimCSE encoder for one stage (cluster-pure batches from ``pseudo_labels``); resumes from
    ``out_dir/checkpoints/last.pt``; logs the isotropy trajectory and its plot."""
    if (done := finished_record(out_dir, TrainRecord)) is not None:
        return done
    tracker = tracker_for(config)
    spec = text_stage_spec(config, stage=stage, out_dir=out_dir, data=data, pseudo_labels=pseudo_labels)
    t = config.train
    record = train_and_record(
        config=config, tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, stage=stage, spec=spec,
        entry="", train_here=lambda callbacks: stages.train_text_stage(spec, callbacks=callbacks),
        batches_from=spec.pseudo_labels_path,
        total_steps=t.epochs * (t.max_steps_per_epoch or max(1, data["num_train"] // t.batch_size)),
        extra_metrics=lambda summary: {})
    history_path = Path(out_dir) / "isotropy.json"
    if history_path.exists():
        import json
        history = json.loads(history_path.read_text())["history"]
        if history:
            plot = plot_isotropy_history(history=history, path=Path(out_dir) / "isotropy.png",
                                         title=f"{config.name} stage {stage}: isotropy over training")
            tracker.log_artifact(mlflow_run_id, plot, artifact_path="eval")
            tracker.log_artifact(mlflow_run_id, history_path, artifact_path="eval")
    return record


@cached_task("text-export-embeddings")
def export_text_embeddings(*, config: TextPipelineConfig, key: str, out_dir: str, trained: TrainRecord, data: dict,
                           mlflow_run_id: str) -> ExportRecord:
    if (done := finished_record(out_dir, ExportRecord)) is not None:
        return done
    tracker = tracker_for(config)
    result = stages.export_text_embeddings(dataset_dir=data["dir"], model_path=trained.model_path,
                                           out_dir=Path(out_dir) / "embeddings", batch_size=256, device=config.device)
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "embeddings", artifact_path="embeddings")
    return ExportRecord(key=key, dir=out_dir, embeddings_dir=result["dir"], num_samples=result["num_samples"],
                        dim=result["dim"], mlflow_run_id=mlflow_run_id).save()


@cached_task("text-evaluate")
def evaluate_text(*, config: TextPipelineConfig, key: str, out_dir: str, name: str, exports: list[ExportRecord],
                  trained: list[TrainRecord], data: dict, mlflow_run_id: str) -> EvalRecord:
    """Probe + kNN per attribute, STS Spearman and isotropy of one stage or the concatenation of several."""
    if (done := finished_record(out_dir, EvalRecord)) is not None:
        return done
    tracker = tracker_for(config)
    e = config.eval
    metrics = stages.evaluate_text_embeddings(
        dataset_dir=data["dir"], embeddings_dirs=[x.embeddings_dir for x in exports],
        model_paths=[x.model_path for x in trained], probe_c=e.probe_c, probe_max_iter=e.probe_max_iter,
        probe_max_train=e.probe_max_train, knn_k=e.knn_k, seed=config.seed, device=config.device)
    return finish_eval_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, name=name,
                              metrics=metrics)


@task(name="text-summarize")
def summarize_text(*, config: TextPipelineConfig, parent_run_id: str, pipeline_id: str, results: dict[str, dict],
                   cluster_records: list[ClusterRecord], out_dir: str, conditioned: dict | None = None) -> dict:
    """Probe, kNN and STS tables and plots for the whole pipeline, on the parent MLflow run and as a Prefect
    artifact (the image pipeline's summary, with the STS column); ``conditioned``: the Hyper-CL step's metrics
    (summary entry "conditioned", beside the per-representation results)."""
    from contrastive.evaluate import plot_attribute_accuracy

    tracker = tracker_for(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = []
    if any(k.startswith("probe/") for m in results.values() for k in m):
        plots.append(plot_attribute_accuracy(results=results, path=out / "probe_accuracy.png"))
    table = "\n".join(f"### {title}\n\n{results_table_markdown(results, metric=metric)}" for title, metric in
                      (("linear probe", "probe"), ("kNN", "knn"), ("STS Spearman", "sts"), ("isotropy", "iso")))
    if conditioned:
        table += "\n### Hyper-CL on held-out C-STS pairs (MCL concat)\n\n" + "\n".join(
            f"- {name}: {value:.4g}" for name, value in sorted(conditioned.items())) + "\n"
    return publish_summary(config=config, tracker=tracker, parent_run_id=parent_run_id, pipeline_id=pipeline_id,
                           results=results, cluster_records=cluster_records, out=out, plots=plots, table=table,
                           heading="probe accuracy, STS and isotropy", artifact_key="text-mcl-results",
                           description="text MCL results",
                           extra_summary={"conditioned": conditioned} if conditioned else None)


@cached_task("text-hyper-cl")
def hyper_cl(*, config: TextPipelineConfig, key: str, out_dir: str, trained: list[TrainRecord], data: dict,
             mlflow_run_id: str) -> EvalRecord:
    """Hyper-CL over the MCL concatenation of ``trained``: C-STS Spearman, pair accuracy and recall@k per attribute
    against the unconditioned representation and a linear projection per condition."""
    if (done := finished_record(out_dir, EvalRecord)) is not None:
        return done
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.text.conditioned import run_hyper_cl
    from contrastive.modalities.text.hyper import HyperSpec

    tracker = tracker_for(config)
    h = config.hyper
    spec = HyperSpec(rank=h.rank, hidden=h.hidden, temperature=h.temperature, mse_weight=h.mse_weight,
                     batch_size=h.batch_size, seed=config.seed)
    metrics = run_hyper_cl(dataset_dir=data["dir"], model_paths=[x.model_path for x in trained], out_dir=out_dir,
                           spec=spec, conditions=h.condition_source(config.model.encoder),
                           test_fraction=h.test_fraction, score_range=(h.score_min, h.score_max),
                           optim=OptimSpec(name="adam", lr=h.lr), loop=LoopSpec(epochs=h.epochs, log_every_steps=10),
                           recall_k=h.recall_k, device=config.device)
    tracker.log_artifact(mlflow_run_id, Path(out_dir) / "hyper.pt", artifact_path="hyper")
    return finish_eval_record(tracker=tracker, mlflow_run_id=mlflow_run_id, key=key, out_dir=out_dir, name="hyper",
                              metrics=metrics)
