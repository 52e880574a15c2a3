"""The MCL pipeline as a Prefect flow: stage 0 -> export -> k-means -> pseudo-labels -> stage 1 -> ... ->
concatenation, plus the control run: the same number of fresh stages with random batches (for a HEX pipeline, the
same stages with HEX switched off).

Every step's output directory is named by a content key (digest of the config that affects it and of the keys of
what it consumes), so identical steps are shared (the plain control's stage 0 *is* MCL's stage 0) and a rerun skips
whatever already finished.
"""
from __future__ import annotations

import copy
import inspect
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from pipeline_config.schema import PipelineConfig, digest_of
from tasks import mcl_tasks as t
from tasks.diagnostics_tasks import diagnose

RESULT_STORE = "prefect-results"


def train_key(config: PipelineConfig, *, stage: int, data: dict, pseudo_key: str | None) -> str:
    return digest_of({"step": "train", "model": config.model.content(), "method": config.method.in_use(),
                      "augment": config.augment.content(), "train": config.train.content(),
                      "seed": t.stage_seed(config, stage), "data": data["digest"], "pseudo_labels": pseudo_key,
                      "remainder_policy": config.mcl.remainder_policy if pseudo_key else None,
                      "processes": config.distributed.nproc_per_node * config.distributed.nnodes})


def run_step(step, *, storage: Path, force: bool = False, **kwargs) -> dict:
    """Call a cached task; if its cached record points at files that were deleted, recompute it.

    ``force`` recomputes even a finished step: its old output directory is kept beside the new one as
    ``<dir>.replaced-<time>`` (nothing computed is deleted).
    """
    bound = step.with_options(result_storage=storage)
    if force:
        out_dir = Path(kwargs["out_dir"])
        if out_dir.exists():
            out_dir.rename(out_dir.with_name(f"{out_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"))
        return bound.with_options(refresh_cache=True)(**kwargs)
    record = bound(**kwargs)
    if not t.is_valid_record(record):
        record = bound.with_options(refresh_cache=True)(**kwargs)
    return record


class StepRunner:
    """Runs the cached steps of one pipeline invocation (any pipeline kind): one nested MLflow run per stage,
    step outputs in directories named by content keys, reuse of cached steps recorded in the current runs."""

    def __init__(self, *, config, data: dict, parent_run_id: str, pipeline_id: str,
                 rerun_from: int | None = None):
        self.config = config
        self.rerun_from = rerun_from
        self.data = data
        self.parent_run_id = parent_run_id
        self.pipeline_id = pipeline_id
        self.flow_run_id = flow_run.id
        self.root = Path(config.output_dir).resolve()
        self.storage = self.root / RESULT_STORE
        self.stage_runs: dict[tuple[str, int], str] = {}

    def stage_run(self, *, kind: str, stage: int) -> str:
        if (kind, stage) not in self.stage_runs:
            self.stage_runs[(kind, stage)] = t.open_stage_run(
                config=self.config, parent_run_id=self.parent_run_id, stage=stage, kind=kind,
                pipeline_id=self.pipeline_id, flow_run_id=self.flow_run_id)
        return self.stage_runs[(kind, stage)]

    def step(self, task_fn, *, prefix: str, key: str, run_id: str, what: str, stage: int | None = None,
             **kwargs: Any) -> dict:
        """Run one cached step of ``stage``; with ``rerun_from``, steps of that stage and later are recomputed."""
        out_dir = str(self.root / "steps" / f"{prefix}-{key}")
        if stage is not None and "stage" in inspect.signature(task_fn.fn).parameters:
            kwargs["stage"] = stage
        force = None not in (self.rerun_from, stage) and stage >= self.rerun_from
        if force and what == "train":
            t.note_rerun(config=self.config, mlflow_run_id=run_id, rerun_from=self.rerun_from)
        record = run_step(task_fn, storage=self.storage, force=force, config=self.config, key=key,
                          out_dir=out_dir, mlflow_run_id=run_id, **kwargs)
        if record.get("mlflow_run_id") != run_id:
            t.record_reuse(config=self.config, mlflow_run_id=run_id, record=record, what=what)
        return record


class StageRunner(StepRunner):
    """The steps of the unimodal MCL pipeline."""

    def train_and_export(self, *, kind: str, stage: int, pseudo: dict | None) -> tuple[dict, dict]:
        run_id = self.stage_run(kind=kind, stage=stage)
        key = train_key(self.config.for_stage(stage), stage=stage, data=self.data,
                        pseudo_key=pseudo["key"] if pseudo else None)
        trained = self.step(t.train_stage, prefix=f"train{stage}", key=key, run_id=run_id, what="train",
                            stage=stage, data=self.data, pseudo_labels=pseudo)
        exported = self.step(t.export_embeddings, prefix=f"export{stage}", key=digest_of(["export", key]),
                             run_id=run_id, what="export", stage=stage, trained=trained, data=self.data)
        return trained, exported

    def evaluate(self, *, name: str, exports: list[dict], run_id: str, stage: int) -> dict:
        key = digest_of(["eval", [e["key"] for e in exports], self.config.eval.model_dump(), self.config.seed])
        return self.step(t.evaluate, prefix="eval", key=key, run_id=run_id, what=f"eval.{name}", stage=stage,
                         name=name, exports=exports, data=self.data)

    def diagnose(self, *, name: str, trained: dict, exported: dict, clusters: dict | None, run_id: str,
                 stage: int) -> dict:
        """Embedding diagnostics of one stage (cosine distributions, anisotropy, rank, alignment/uniformity)."""
        key = digest_of(["diagnose", exported["key"], clusters["key"] if clusters else None,
                         self.config.for_stage(stage).augment.model_dump(mode="json"), self.config.seed])
        return self.step(diagnose, prefix="diag", key=key, run_id=run_id, what=f"diagnose.{name}", stage=stage,
                         name=name, trained=trained, exported=exported, clusters=clusters, data=self.data)

    def for_config(self, config: PipelineConfig) -> "StageRunner":
        """This runner for a variant of the config (the no-HEX control): same parent and MLflow runs, steps keyed
        by the variant's own content."""
        variant = copy.copy(self)  # shallow: shares stage_runs, so every run is closed at the end
        variant.config = config
        return variant


def without_hex(config: PipelineConfig) -> PipelineConfig:
    """A HEX pipeline's control: the same method and everything else, with method.hex.enabled = False."""
    control = config.model_copy(deep=True)
    control.method.hex.enabled = False
    for patch in control.stage_overrides.values():
        if isinstance(patch.get("method"), dict) and isinstance(patch["method"].get("hex"), dict):
            patch["method"]["hex"]["enabled"] = False
    return control


@flow(name="mcl-pipeline", log_prints=True)
def mcl_pipeline(config: PipelineConfig, rerun_from: int | None = None) -> dict:
    """Multistage contrastive learning (MCL) end to end; returns the summary record (paths and accuracies).

    Finished steps of earlier runs are reused; ``rerun_from=N`` recomputes stage N and later (MCL and control)
    and every evaluation that includes them.
    """
    logger = get_run_logger()
    pipeline_id = config.config_hash()
    last = config.mcl.num_stages - 1
    data = t.prepare_data(config=config)
    parent = t.open_pipeline_run(config=config, pipeline_id=pipeline_id, flow_run_id=flow_run.id,
                                 pipeline_dir=str(Path(config.output_dir).resolve() / "pipelines" / pipeline_id))
    runner = StageRunner(config=config, data=data, parent_run_id=parent, pipeline_id=pipeline_id,
                         rerun_from=rerun_from)
    results: dict[str, dict] = {}
    status = "FAILED"
    try:
        exports, clusters, pseudo = [], [], None
        for stage in range(config.mcl.num_stages):
            run_id = runner.stage_run(kind="mcl", stage=stage)
            trained, exported = runner.train_and_export(kind="mcl", stage=stage, pseudo=pseudo)
            exports.append(exported)
            results[f"stage {stage}"] = runner.evaluate(name=f"stage{stage}", exports=[exported],
                                                        run_id=run_id, stage=stage)["metrics"]
            if stage + 1 < config.mcl.num_stages:
                cluster_key = digest_of(["cluster", exported["key"], config.mcl.kmeans_settings(stage),
                                         t.stage_seed(config, stage), [c["key"] for c in clusters]])
                clusters.append(runner.step(t.cluster_embeddings, prefix=f"cluster{stage}", key=cluster_key,
                                            run_id=run_id, what="cluster", stage=stage, exported=exported,
                                            data=data, earlier=list(clusters)))
                pseudo_key = digest_of(["pseudo", [c["key"] for c in clusters], config.mcl.small_group_policy,
                                        config.for_stage(stage + 1).train.batch_size])
                pseudo = runner.step(t.make_pseudo_labels, prefix=f"pseudo{stage + 1}", key=pseudo_key,
                                     run_id=run_id, what="pseudo_labels", stage=stage, for_stage=stage + 1,
                                     clusters=list(clusters),
                                     exports=list(exports), data=data)
            runner.diagnose(name=f"stage{stage}", trained=trained, exported=exported, run_id=run_id, stage=stage,
                            clusters=clusters[stage] if stage < len(clusters) else None)
            logger.info("stage %d done: %s", stage, results[f"stage {stage}"])
        if config.mcl.num_stages > 1:
            results["MCL concat"] = runner.evaluate(name="mcl_concat", exports=exports, run_id=parent,
                                                    stage=last)["metrics"]
        hex_on = config.method.hex.enabled
        if config.mcl.control and (config.mcl.num_stages > 1 or hex_on):
            # A HEX pipeline's control is the same method without HEX, so it retrains (and reports) stage 0 too;
            # otherwise stage 0 has no pseudo-labels and the control shares it.
            control = runner.for_config(without_hex(config)) if hex_on else runner
            label = "control (no HEX)" if hex_on else "control"
            control_exports = [] if hex_on else [exports[0]]
            for stage in range(len(control_exports), config.mcl.num_stages):
                run_id = control.stage_run(kind="control", stage=stage)
                trained, exported = control.train_and_export(kind="control", stage=stage, pseudo=None)
                control_exports.append(exported)
                control.diagnose(name=f"control_stage{stage}", trained=trained, exported=exported, clusters=None,
                                 run_id=run_id, stage=stage)
                if hex_on:
                    results[f"{label} stage {stage}"] = control.evaluate(
                        name=f"control_stage{stage}", exports=[exported], run_id=run_id, stage=stage)["metrics"]
            if config.mcl.num_stages > 1:
                results[f"{label} concat"] = control.evaluate(name="control_concat", exports=control_exports,
                                                              run_id=parent, stage=last)["metrics"]
        summary = t.summarize(config=config, parent_run_id=parent, pipeline_id=pipeline_id, results=results,
                              cluster_records=clusters, out_dir=str(runner.root / "pipelines" / pipeline_id))
        status = "FINISHED"
        return summary
    finally:
        close_runs(config=config, run_ids=[*runner.stage_runs.values(), parent], status=status)


def close_runs(*, config: PipelineConfig, run_ids: list[str], status: str) -> None:
    """Mark MLflow runs finished/failed; a tracking outage here must not hide the error that ended the flow."""
    logger = get_run_logger()
    for run_id in run_ids:
        try:
            t.close_run(config=config, mlflow_run_id=run_id, status=status)
        except Exception as exc:  # noqa: BLE001 - reported, the original outcome stands
            logger.warning("could not mark MLflow run %s %s: %s", run_id, status, exc)
