"""The CLIP MCL pipeline as a Prefect flow (MCL paper, Sec. 5.5):

stage 0 fine-tune (random batches) -> export image embeddings -> k-means -> pseudo-labels -> re-shard by group ->
stage 1 from the SAME init on cluster-pure batches -> export -> k-means -> pseudo-labels combine(y0, y1) -> ...
then MMVP + retrieval for every stage alone, for the concatenation of all stages and for the model soup.

Same shape and contract as ``flows.mcl_flow``: every step's directory is named by a content key, so a rerun skips
what finished and a failed run retrains only what failed; one parent MLflow run with a nested run per stage.
"""
from __future__ import annotations

from prefect import flow

from flows.pipeline_run import opened_pipeline, pipeline_dir
from flows.runner import StepRunner
from contrastive.modalities.image_text.config import ClipPipelineConfig
from pipeline_config.schema import digest_of
from tasks import clip_tasks as c
from tasks import mcl_tasks as t
from tasks.links import pipeline_run_name, publish_links
from tasks.records import (EvalRecord, ExportRecord, FeaturesRecord, GroupedShardsRecord, ModelRecord,
                           PseudoLabelRecord, TrainRecord)


def clip_train_key(config: ClipPipelineConfig, *, stage: int, data: dict, grouped_key: str | None) -> str:
    """What a stage's weights depend on: init, training settings, world size, data, and its batches' groups."""
    reader = config.mcl.model_dump(include={"remainder_policy", "active_streams", "group_shuffle_buffer"}) \
        if grouped_key else None
    return digest_of({"step": "clip-train", "model": config.model.content(), "train": config.train.content(),
                      "world_size": config.distributed.nproc_per_node, "local_loss": config.distributed.local_loss,
                      **({"data_slots": config.distributed.data_slots} if config.distributed.data_slots else {}),
                      "seed": t.stage_seed(config, stage), "data": data["digest"], "grouped": grouped_key,
                      "reader": reader, "shuffle_buffer": config.data.shuffle_buffer,
                      "max_skip_fraction": config.data.max_skip_fraction})


class ClipStageRunner(StepRunner):
    """The steps of the CLIP MCL pipeline: CLIP stages from the same init, cluster-pure batches read from a
    group-sorted re-shard, MMVP and retrieval scores, the model soup."""

    def train_and_export(self, *, kind: str, stage: int,
                         batches: GroupedShardsRecord | None) -> tuple[TrainRecord, ExportRecord]:
        run_id = self.stage_run(kind=kind, stage=stage)
        key = clip_train_key(self.config, stage=stage, data=self.data, grouped_key=batches.key if batches else None)
        trained = self.step(c.train_clip_stage, prefix=f"clip-train{stage}", key=key, run_id=run_id, what="train",
                            stage=stage, data=self.data, grouped=batches)
        exported = self.step(c.export_clip_embeddings, prefix=f"clip-export{stage}",
                             key=digest_of(["clip-export", key, self.config.data.max_skip_fraction]), run_id=run_id,
                             what="export", trained=trained, data=self.data)
        return trained, exported

    def encode(self, *, name: str, model: TrainRecord | ModelRecord, run_id: str) -> FeaturesRecord:
        e = self.config.eval
        key = digest_of(["clip-encode", model.key, self.data["digest"], e.mmvp_prompt, e.retrieval_max_samples])
        return self.step(c.encode_clip_eval, prefix="clip-encode", key=key, run_id=run_id, what=f"encode.{name}",
                         name=name, model_path=model.model_path, data=self.data)

    def score(self, *, name: str, features: list[FeaturesRecord], run_id: str) -> EvalRecord:
        key = digest_of(["clip-score", [f.key for f in features]])
        return self.step(c.score_clip_eval, prefix="clip-eval", key=key, run_id=run_id, what=f"eval.{name}",
                         name=name, features=features)

    def evaluate_stage(self, *, stage: int, trained: TrainRecord, exported: ExportRecord,
                       run_id: str) -> tuple[dict, FeaturesRecord]:
        features = self.encode(name=f"stage{stage}", model=trained, run_id=run_id)
        return self.score(name=f"stage{stage}", features=[features], run_id=run_id).metrics, features

    def evaluate_concat(self, *, name: str, evaluated: list[FeaturesRecord], run_id: str) -> dict:
        return self.score(name=name, features=evaluated, run_id=run_id).metrics

    def batches_for(self, *, stage: int, pseudo: PseudoLabelRecord, run_id: str) -> GroupedShardsRecord:
        """Cluster-pure CLIP batches stream from a copy of the training shards sorted by group."""
        key = digest_of(["clip-reshard", pseudo.key, self.data["digest"], self.config.distributed.slots(),
                         t.stage_seed(self.config, stage)])
        return self.step(c.reshard_clip_shards, prefix=f"clip-grouped{stage}", key=key, run_id=run_id,
                         what="reshard", stage=stage, pseudo=pseudo, data=self.data)

    def soup(self, *, trained: list[TrainRecord]) -> dict:
        """The model soup (weight average of the stage models), scored like a stage."""
        soup = self.step(c.make_clip_soup, prefix="clip-soup", key=digest_of(["clip-soup", [x.key for x in trained]]),
                         run_id=self.parent_run_id, what="soup", trained=trained)
        features = self.encode(name="soup", model=soup, run_id=self.parent_run_id)
        return self.score(name="soup", features=[features], run_id=self.parent_run_id).metrics


@flow(name="clip-mcl-pipeline", flow_run_name=pipeline_run_name, log_prints=True)
def clip_pipeline(config: ClipPipelineConfig) -> dict:
    """CLIP multistage contrastive learning end to end; returns {"results", "dir", "tracking_hint", ...}."""
    data = c.prepare_clip_data(config=config)
    with opened_pipeline(ClipStageRunner, config=config, data=data) as runner:
        outputs = runner.run_stages()
        results = dict(outputs.results)
        if config.mcl.num_stages > 1 and config.eval.soup:
            results["soup"] = runner.soup(trained=outputs.trained)
        summary = c.summarize_clip(config=config, parent_run_id=runner.parent_run_id, pipeline_id=runner.pipeline_id,
                                   results=results, cluster_records=outputs.clusters, out_dir=str(pipeline_dir(config)))
        return publish_links(config=config, summary=summary, stage_runs=runner.stage_run_ids(),
                             opened_runs=list(runner.stage_runs.values()), table=c.clip_results_markdown(results))
