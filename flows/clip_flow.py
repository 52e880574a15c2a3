"""The CLIP MCL pipeline as a Prefect flow (MCL paper, Sec. 5.5):

stage 0 fine-tune (random batches) -> export image embeddings -> k-means -> pseudo-labels -> re-shard by group ->
stage 1 from the SAME init on cluster-pure batches -> export -> k-means -> pseudo-labels combine(y0, y1) -> ...
then MMVP + retrieval for every stage alone, for the concatenation of all stages and for the model soup.

Same shape and contract as ``flows.mcl_flow``: every step's directory is named by a content key, so a rerun skips
what finished and a failed run retrains only what failed; one parent MLflow run with a nested run per stage.
"""
from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.mcl_flow import StepRunner, close_runs
from pipeline_config.schema import ClipPipelineConfig, digest_of
from tasks import clip_tasks as c
from tasks import mcl_tasks as t


def clip_train_key(config: ClipPipelineConfig, *, stage: int, data: dict, grouped_key: str | None) -> str:
    """What a stage's weights depend on: init, training settings, world size, data, and its batches' groups."""
    reader = config.mcl.model_dump(include={"remainder_policy", "active_streams", "group_shuffle_buffer"}) \
        if grouped_key else None
    return digest_of({"step": "clip-train", "model": config.model.content(), "train": config.train.content(),
                      "world_size": config.distributed.nproc_per_node, "local_loss": config.distributed.local_loss,
                      "seed": t.stage_seed(config, stage), "data": data["digest"], "grouped": grouped_key,
                      "reader": reader, "shuffle_buffer": config.data.shuffle_buffer,
                      "max_skip_fraction": config.data.max_skip_fraction})


class ClipStageRunner(StepRunner):
    """The steps of the CLIP MCL pipeline (same runner as ``flows.mcl_flow.StageRunner``)."""

    def train_and_export(self, *, stage: int, grouped: dict | None) -> tuple[dict, dict]:
        run_id = self.stage_run(kind="mcl", stage=stage)
        key = clip_train_key(self.config, stage=stage, data=self.data, grouped_key=grouped["key"] if grouped else None)
        trained = self.step(c.train_clip_stage, prefix=f"clip-train{stage}", key=key, run_id=run_id, what="train",
                            stage=stage, data=self.data, grouped=grouped)
        exported = self.step(c.export_clip_embeddings, prefix=f"clip-export{stage}",
                             key=digest_of(["clip-export", key, self.config.data.max_skip_fraction]), run_id=run_id,
                             what="export", trained=trained, data=self.data)
        return trained, exported

    def encode(self, *, name: str, model: dict, run_id: str) -> dict:
        e = self.config.eval
        key = digest_of(["clip-encode", model["key"], self.data["digest"], e.mmvp_prompt, e.retrieval_max_samples])
        return self.step(c.encode_clip_eval, prefix="clip-encode", key=key, run_id=run_id, what=f"encode.{name}",
                         name=name, model_path=model["model_path"], data=self.data)

    def score(self, *, name: str, features: list[dict], run_id: str) -> dict:
        key = digest_of(["clip-score", [f["key"] for f in features]])
        return self.step(c.score_clip_eval, prefix="clip-eval", key=key, run_id=run_id, what=f"eval.{name}",
                         name=name, features=features)

    def next_stage_groups(self, *, stage: int, exports: list[dict], clusters: list[dict], run_id: str) -> dict:
        """Cluster stage ``stage``, combine ALL stages' clusters into pseudo-labels, re-shard for stage + 1."""
        m = self.config.mcl
        cluster_key = digest_of(["clip-cluster", exports[-1]["key"], m.kmeans_settings(stage),
                                 t.stage_seed(self.config, stage), [x["key"] for x in clusters]])
        clusters.append(self.step(c.cluster_clip_embeddings, prefix=f"clip-cluster{stage}", key=cluster_key,
                                  run_id=run_id, what="cluster", stage=stage, exported=exports[-1],
                                  earlier=list(clusters)))
        pseudo_key = digest_of(["clip-pseudo", [x["key"] for x in clusters], m.small_group_policy,
                                self.config.train.global_batch_size])
        pseudo = self.step(c.make_clip_pseudo_labels, prefix=f"clip-pseudo{stage + 1}", key=pseudo_key,
                           run_id=run_id, what="pseudo_labels", for_stage=stage + 1, clusters=list(clusters),
                           exports=list(exports))
        reshard_key = digest_of(["clip-reshard", pseudo_key, self.data["digest"],
                                 self.config.distributed.nproc_per_node, t.stage_seed(self.config, stage + 1)])
        return self.step(c.reshard_clip_shards, prefix=f"clip-grouped{stage + 1}", key=reshard_key, run_id=run_id,
                         what="reshard", stage=stage + 1, pseudo=pseudo, data=self.data)


@flow(name="clip-mcl-pipeline", log_prints=True)
def clip_pipeline(config: ClipPipelineConfig) -> dict:
    """CLIP multistage contrastive learning end to end; returns {"results", "dir", "tracking_hint", ...}."""
    logger = get_run_logger()
    pipeline_id = config.config_hash()
    data = c.prepare_clip_data(config=config)
    pipeline_dir = Path(config.output_dir).resolve() / "pipelines" / pipeline_id
    parent = t.open_pipeline_run(config=config, pipeline_id=pipeline_id, flow_run_id=flow_run.id,
                                 pipeline_dir=str(pipeline_dir))
    runner = ClipStageRunner(config=config, data=data, parent_run_id=parent, pipeline_id=pipeline_id)
    results: dict[str, dict] = {}
    status = "FAILED"
    try:
        trained_all, exports, clusters, features, grouped = [], [], [], [], None
        for stage in range(config.mcl.num_stages):
            run_id = runner.stage_run(kind="mcl", stage=stage)
            trained, exported = runner.train_and_export(stage=stage, grouped=grouped)
            trained_all.append(trained)
            exports.append(exported)
            features.append(runner.encode(name=f"stage{stage}", model=trained, run_id=run_id))
            results[f"stage {stage}"] = runner.score(name=f"stage{stage}", features=[features[-1]],
                                                     run_id=run_id)["metrics"]
            if stage + 1 < config.mcl.num_stages:
                grouped = runner.next_stage_groups(stage=stage, exports=exports, clusters=clusters, run_id=run_id)
            logger.info("CLIP stage %d done: %s", stage, results[f"stage {stage}"])
        if config.mcl.num_stages > 1:
            results["MCL concat"] = runner.score(name="mcl_concat", features=features, run_id=parent)["metrics"]
            if config.eval.soup:
                soup = runner.step(c.make_clip_soup, prefix="clip-soup",
                                   key=digest_of(["clip-soup", [x["key"] for x in trained_all]]), run_id=parent,
                                   what="soup", trained=trained_all)
                soup_features = runner.encode(name="soup", model=soup, run_id=parent)
                results["soup"] = runner.score(name="soup", features=[soup_features], run_id=parent)["metrics"]
        summary = c.summarize_clip(config=config, parent_run_id=parent, pipeline_id=pipeline_id, results=results,
                                   cluster_records=clusters, out_dir=str(pipeline_dir))
        status = "FINISHED"
        return summary
    finally:
        close_runs(config=config, run_ids=[*runner.stage_runs.values(), parent], status=status)
