"""The text MCL pipeline as a Prefect flow: SimCSE stage 0 -> export sentence embeddings -> k-means ->
pseudo-labels -> stage 1 (a FRESH encoder on cluster-pure batches) -> ... -> concatenation, plus the control run
(the same number of fresh SimCSE stages on random batches, concatenated the same way).

The stage loop, k-means and pseudo-label steps are ``flows.runner.StepRunner``'s, shared with the image and CLIP
pipelines; this module supplies the text steps (``tasks.text_tasks``). Every step's directory is named by a
content key, so a rerun skips what finished and the control's stage 0 *is* MCL's stage 0.
"""
from __future__ import annotations

from prefect import flow

from flows.pipeline_run import opened_pipeline, pipeline_dir
from flows.runner import StepRunner
from pipeline_config.schema import digest_of
from contrastive.modalities.text.config import TextPipelineConfig
from tasks import mcl_tasks as t
from tasks import text_tasks as x
from tasks.records import EvalRecord, ExportRecord, PseudoLabelRecord, TrainRecord


def text_train_key(config: TextPipelineConfig, *, stage: int, data: dict, pseudo_key: str | None) -> str:
    """What a stage's weights depend on: encoder, method, training, isotropy probe, seed, data and its batches."""
    return digest_of({"step": "text-train", "model": config.model.content(), "method": config.method.content(),
                      "train": config.train.content(), "isotropy": config.isotropy.content(),
                      "seed": t.stage_seed(config, stage), "data": data["digest"], "pseudo_labels": pseudo_key,
                      "remainder_policy": config.mcl.remainder_policy if pseudo_key else None})


class TextStageRunner(StepRunner):
    """The steps of the text MCL pipeline: SimCSE stages, probes per attribute, STS Spearman, isotropy."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dataset_dir = self.data["dir"]  # MCL clusters the training sentences; their attributes score clusters

    def train_and_export(self, *, kind: str, stage: int,
                         batches: PseudoLabelRecord | None) -> tuple[TrainRecord, ExportRecord]:
        run_id = self.stage_run(kind=kind, stage=stage)
        key = text_train_key(self.config, stage=stage, data=self.data, pseudo_key=batches.key if batches else None)
        trained = self.step(x.train_text_stage, prefix=f"text-train{stage}", key=key, run_id=run_id, what="train",
                            stage=stage, data=self.data, pseudo_labels=batches)
        exported = self.step(x.export_text_embeddings, prefix=f"text-export{stage}",
                             key=digest_of(["text-export", key]), run_id=run_id, what="export", trained=trained,
                             data=self.data)
        return trained, exported

    def evaluate(self, *, name: str, stages: list[tuple[TrainRecord, ExportRecord]], run_id: str,
                 stage: int) -> EvalRecord:
        key = digest_of(["text-eval", [e.key for _, e in stages], self.config.eval.content(), self.config.seed])
        return self.step(x.evaluate_text, prefix="text-eval", key=key, run_id=run_id, what=f"eval.{name}",
                         stage=stage, name=name, exports=[e for _, e in stages], trained=[tr for tr, _ in stages],
                         data=self.data)

    def evaluate_stage(self, *, stage: int, trained: TrainRecord, exported: ExportRecord,
                       run_id: str) -> tuple[dict, tuple[TrainRecord, ExportRecord]]:
        handle = (trained, exported)
        return self.evaluate(name=f"stage{stage}", stages=[handle], run_id=run_id, stage=stage).metrics, handle

    def evaluate_concat(self, *, name: str, evaluated: list[tuple[TrainRecord, ExportRecord]], run_id: str) -> dict:
        return self.evaluate(name=name, stages=evaluated, run_id=run_id, stage=self.config.mcl.num_stages - 1).metrics


def run_text_control(runner: TextStageRunner, *, mcl_stages: list[tuple[TrainRecord, ExportRecord]]) -> dict:
    """The same number of fresh SimCSE stages on random batches (its stage 0 is MCL's), concatenated the same way:
    separates the gain of cluster-pure batches from the gain of ensembling."""
    config = runner.config
    if not config.mcl.control or config.mcl.num_stages == 1:
        return {}
    control = [mcl_stages[0]]
    for stage in range(1, config.mcl.num_stages):
        control.append(runner.train_and_export(kind="control", stage=stage, batches=None))
    return {"control concat": runner.evaluate_concat(name="control_concat", evaluated=control,
                                                     run_id=runner.parent_run_id)}


def run_hyper(runner: TextStageRunner, *, trained: list[TrainRecord]) -> dict:
    """The optional Hyper-CL step on the final representation (the concatenation of every MCL stage)."""
    config = runner.config
    key = digest_of(["text-hyper", [x.key for x in trained], config.hyper.content(), config.model.encoder,
                     config.seed])
    return runner.step(x.hyper_cl, prefix="text-hyper", key=key, run_id=runner.parent_run_id, what="hyper",
                       trained=list(trained), data=runner.data).metrics


@flow(name="text-mcl-pipeline", log_prints=True)
def text_pipeline(config: TextPipelineConfig, rerun_from: int | None = None) -> dict:
    """Multistage contrastive learning over SimCSE stages on sentences; returns the summary record."""
    data = x.prepare_text_data(config=config)
    with opened_pipeline(TextStageRunner, config=config, data=data, rerun_from=rerun_from) as runner:
        outputs = runner.run_stages()
        results = {**outputs.results, **run_text_control(runner, mcl_stages=outputs.evaluated)}
        conditioned = run_hyper(runner, trained=outputs.trained) if config.hyper.enabled else None
        return x.summarize_text(config=config, parent_run_id=runner.parent_run_id, pipeline_id=runner.pipeline_id,
                                results=results, cluster_records=outputs.clusters, out_dir=str(pipeline_dir(config)),
                                conditioned=conditioned)


def text_tables(cfg: TextPipelineConfig, summary: dict, *, results_table) -> list:
    """The tables `mclpipe run` prints for a text pipeline: probe and kNN accuracy per attribute and STS Spearman
    per representation (the image table's shape), then, with hyper.enabled, the conditioned scores (the
    summary's ``conditioned`` entry, kept out of ``results`` so seed aggregation sees representations only)."""
    from rich.table import Table

    results = summary["results"]
    tables = [results_table(f"{cfg.name}: linear-probe accuracy (held-out sentences)", results),
              results_table("kNN accuracy", results, metric="knn"),
              results_table("STS Spearman (cosine vs gold)", results, metric="sts")]
    hyper = summary.get("conditioned")
    if hyper:
        table = Table(title=f"C-STS, {int(hyper.get('csts/test_quadruples', 0))} held-out pairs (MCL concat)")
        for column in ("projection", "Spearman", "pair accuracy"):
            table.add_column(column, justify="left" if column == "projection" else "right")
        for name in ("hyper", "linear", "unconditioned"):
            table.add_row({"hyper": "Hyper-CL", "linear": "linear per condition",
                           "unconditioned": "unconditioned"}[name],
                          f"{hyper.get(f'csts/{name}_spearman', float('nan')):.3f}",
                          f"{hyper.get(f'csts/{name}_pair_accuracy', float('nan')):.3f}")
        tables.append(table)
        recall = {name: {f"recall/{k.split('/')[1].rsplit('_', 1)[0]}": v for k, v in hyper.items()
                         if k.startswith("recall/") and k.endswith(f"_{name}")}
                  for name in ("hyper", "linear", "unconditioned")}
        tables.append(results_table(f"conditioned retrieval recall@{cfg.hyper.recall_k}", recall, metric="recall"))
    return tables
