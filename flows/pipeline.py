"""The MCL pipeline as a Prefect flow: stage 0 -> export -> k-means -> pseudo-labels -> stage 1 -> ... ->
concatenation, plus the control run: the same number of fresh stages with random batches (for a HEX pipeline, the
same stages with HEX switched off).

Every step's output directory is named by a content key (digest of the config that affects it and of the keys of
what it consumes), so identical steps are shared (the plain control's stage 0 *is* MCL's stage 0) and a rerun skips
whatever already finished.
"""
from __future__ import annotations

import copy
import dataclasses

from prefect import flow

from flows.pipeline_run import opened_pipeline, pipeline_dir
from flows.runner import RunRef, StageOutputs, StepRunner
from contrastive.modalities.image.config import ImagePipelineConfig
from pipeline_config.schema import digest_of
from tasks import mcl_tasks as t
from tasks.diagnostics_tasks import diagnose
from tasks.links import log_pipeline_model, pipeline_run_name, publish_links
from tasks.records import (ClusterRecord, DiagnosisRecord, EvalRecord, ExportRecord, PseudoLabelRecord,
                           TrainRecord)

def train_key(config: ImagePipelineConfig, *, stage: int, data: dict, pseudo_key: str | None,
              inherit_key: str | None = None) -> str:
    content = {"step": "train", "model": config.model.content(), "method": config.method.in_use(),
               "augment": config.augment.content(), "train": config.train.content(),
               "seed": t.stage_seed(config, stage), "data": data["digest"], "pseudo_labels": pseudo_key,
               "remainder_policy": config.mcl.remainder_policy if pseudo_key else None,
               "processes": config.distributed.world_size()}
    if inherit_key is not None:  # mcl.inherit: the weights it starts from; absent otherwise (keys unchanged)
        content["inherit_from"] = inherit_key
    return digest_of(content)


class ImageStageRunner(StepRunner):
    """The steps of the unimodal MCL pipeline: image stages, linear probes and kNN per attribute, diagnostics."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dataset_dir = self.data["dir"]  # MCL clusters the training split; its attributes score the clusters
        self.mcl_trained: dict[int, TrainRecord] = {}  # what mcl.inherit starts stage j + 1 from

    def train_and_export(self, *, kind: str, stage: int,
                         batches: PseudoLabelRecord | None) -> tuple[TrainRecord, ExportRecord]:
        run_id = self.stage_run(kind=kind, stage=stage)
        # Naive inheritance (paper Table 5) applies to MCL's stages only; the control stays fresh stages.
        init_from = self.mcl_trained.get(stage - 1) if kind == "mcl" and self.config.mcl.inherit else None
        key = train_key(self.config.for_stage(stage), stage=stage, data=self.data,
                        pseudo_key=batches.key if batches else None, inherit_key=init_from.key if init_from else None)
        trained = self.step(t.train_stage, prefix=f"train{stage}", key=key, run_id=run_id, what="train",
                            stage=stage, data=self.data, pseudo_labels=batches,
                            **({"init_from": init_from} if init_from is not None else {}))
        if kind == "mcl":
            self.mcl_trained[stage] = trained
        exported = self.step(t.export_embeddings, prefix=f"export{stage}", key=digest_of(["export", key]),
                             run_id=run_id, what="export", stage=stage, trained=trained, data=self.data)
        return trained, exported

    def evaluate(self, *, name: str, exports: list[ExportRecord], run_id: RunRef, stage: int) -> EvalRecord:
        key = digest_of(["eval", [e.key for e in exports], self.config.eval.content(), self.config.seed])
        return self.step(t.evaluate, prefix="eval", key=key, run_id=run_id, what=f"eval.{name}", stage=stage,
                         name=name, exports=exports, data=self.data)

    def evaluate_stage(self, *, stage: int, trained: TrainRecord, exported: ExportRecord,
                       run_id: RunRef) -> tuple[dict, ExportRecord]:
        return self.evaluate(name=f"stage{stage}", exports=[exported], run_id=run_id, stage=stage).metrics, exported

    def evaluate_concat(self, *, name: str, evaluated: list[ExportRecord], run_id: RunRef) -> dict:
        return self.evaluate(name=name, exports=evaluated, run_id=run_id,
                             stage=self.config.mcl.num_stages - 1).metrics

    def after_stage(self, *, stage: int, outputs: StageOutputs, run_id: RunRef) -> None:
        clusters = outputs.clusters[stage] if stage < len(outputs.clusters) else None
        self.diagnose(name=f"stage{stage}", trained=outputs.trained[stage], exported=outputs.exports[stage],
                      clusters=clusters, run_id=run_id, stage=stage)
        if self.config.mcl.cumulative_concat and 0 < stage < self.config.mcl.num_stages - 1:
            # Learning dynamics (paper Fig. 5): stages 0..j concatenated; the last j is "MCL concat" itself.
            outputs.results[f"MCL concat 0-{stage}"] = self.evaluate(
                name=f"mcl_concat_0_{stage}", exports=outputs.exports[:stage + 1], run_id=run_id, stage=stage).metrics

    def diagnose(self, *, name: str, trained: TrainRecord, exported: ExportRecord, clusters: ClusterRecord | None,
                 run_id: RunRef, stage: int) -> DiagnosisRecord:
        """Embedding diagnostics of one stage (cosine distributions, anisotropy, rank, alignment/uniformity)."""
        key = digest_of(["diagnose", exported.key, clusters.key if clusters else None,
                         self.config.for_stage(stage).augment.content(), self.config.seed])
        return self.step(diagnose, prefix="diag", key=key, run_id=run_id, what=f"diagnose.{name}", stage=stage,
                         name=name, trained=trained, exported=exported, clusters=clusters, data=self.data)

    def for_config(self, config: ImagePipelineConfig) -> "ImageStageRunner":
        """This runner for a variant of the config (the no-HEX control): same parent and MLflow runs, steps keyed
        by the variant's own content."""
        variant = copy.copy(self)  # shallow: shares stage_runs, so every run is closed at the end
        variant.config = config
        return variant


def without_hex(config: ImagePipelineConfig) -> ImagePipelineConfig:
    """A HEX pipeline's control: the same method and everything else, with method.hex.enabled = False."""
    control = config.model_copy(deep=True)
    control.method.hex = dataclasses.replace(control.method.hex, enabled=False)
    for patch in control.stage_overrides.values():
        if isinstance(patch.get("method"), dict) and isinstance(patch["method"].get("hex"), dict):
            patch["method"]["hex"]["enabled"] = False
    return control


@flow(name="mcl-pipeline", flow_run_name=pipeline_run_name, log_prints=True)
def mcl_pipeline(config: ImagePipelineConfig, rerun_from: int | None = None) -> dict:
    """Multistage contrastive learning (MCL) end to end; returns the summary record (paths and accuracies).

    Finished steps of earlier runs are reused; ``rerun_from=N`` recomputes stage N and later (MCL and control)
    and every evaluation that includes them.
    """
    data = t.prepare_data(config=config)
    with opened_pipeline(ImageStageRunner, config=config, data=data, rerun_from=rerun_from) as runner:
        parent, pipeline_id = runner.parent_run_id, runner.pipeline_id
        outputs = runner.run_stages()
        results = {**outputs.results, **run_control(runner, mcl_exports=outputs.exports)}
        summary = t.summarize(config=config, parent_run_id=parent, pipeline_id=pipeline_id, results=results,
                              cluster_records=outputs.clusters, out_dir=str(pipeline_dir(config)))
        model = log_pipeline_model(config=config, parent_run_id=parent, trained=outputs.trained,
                                   exports=outputs.exports)
        return publish_links(config=config, summary=summary, stage_runs=runner.stage_run_ids(),
                             opened_runs=list(runner.stage_runs.values()),
                             table=t.results_table_markdown(results), model=model)


def run_control(runner: ImageStageRunner, *, mcl_exports: list[ExportRecord]) -> dict[str, dict]:
    """The control run: the same number of fresh stages on ordinary random batches, concatenated the same way, so
    the gain of feature-aware negatives is separated from the gain of ensembling. Its stage 0 *is* MCL's stage 0.
    A HEX pipeline's control is the same method without HEX, so it retrains (and reports) stage 0 too."""
    config = runner.config
    hex_on = config.method.hex.enabled
    if not config.mcl.control or (config.mcl.num_stages == 1 and not hex_on):
        return {}
    control = runner.for_config(without_hex(config)) if hex_on else runner
    label = "control (no HEX)" if hex_on else "control"
    results: dict[str, dict] = {}
    control_exports = [] if hex_on else [mcl_exports[0]]
    for stage in range(len(control_exports), config.mcl.num_stages):
        run_id = control.stage_run(kind="control", stage=stage)
        trained, exported = control.train_and_export(kind="control", stage=stage, batches=None)
        control_exports.append(exported)
        control.diagnose(name=f"control_stage{stage}", trained=trained, exported=exported, clusters=None,
                         run_id=run_id, stage=stage)
        if hex_on:
            results[f"{label} stage {stage}"] = control.evaluate(
                name=f"control_stage{stage}", exports=[exported], run_id=run_id, stage=stage).metrics
    if config.mcl.num_stages > 1:
        results[f"{label} concat"] = control.evaluate_concat(name="control_concat", evaluated=control_exports,
                                                             run_id=runner.parent_run_id)
    return results

