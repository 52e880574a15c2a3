"""The one MCL pipeline as a Prefect flow, for every modality (the config's ``pipeline:`` key picks it):

stage 0 -> export -> k-means -> pseudo-labels -> stage 1 (a fresh encoder on cluster-pure batches) -> ... ->
the concatenation of every stage, then the control run (the same number of fresh stages on random batches), the
modality's combined model and final step where it has them, the summary, the registered model and the links
between Prefect and MLflow.

Every step's output directory is named by a content key (digest of the config that affects it and of the keys of
what it consumes), so identical steps are shared (the plain control's stage 0 *is* MCL's stage 0) and a rerun skips
whatever already finished. What differs between images, image-text pairs, sentences and feature vectors is the
modality's (``contrastive/modalities/<name>/``); the flow, its tasks and what a run prints and records are one.
"""
from __future__ import annotations

import gc
import time
from pathlib import Path

from prefect import flow

from flows.pipeline_run import opened_pipeline, pipeline_dir
from flows.run_parameters import check_run_parameters
from flows.plan_steps import ProgressRunner, run_all
from pipeline_config.schema import config_union
from tasks import steps as t
from tasks.links import log_pipeline_model, pipeline_run_name, publish_links
from tasks.records import RECORD

#: The config of any modality (the ``pipeline:`` key tells them apart).
PipelineConfigs = config_union()


def freeze_imported_heap() -> None:
    """Collect what is garbage now, then move every surviving object (the imported libraries: ~450k objects with
    Prefect and MLflow loaded) to the collector's permanent generation. Each training stage, export and GPU k-means
    ends with a full collection (``release_device_memory``: a stage's model in reference cycles goes before the
    next one allocates), which otherwise scans all of them: 0.27 s of CPU each (2026-11-27, gc.collect in a process
    with prefect, mlflow and tasks.steps imported; 0.00 s after the freeze). Objects created later are collected as
    before; only those alive now are exempt (modules, the config, clients: they live as long as the process)."""
    gc.collect()
    gc.freeze()


class CountingRunner(ProgressRunner):
    """The flow's runner, counting the steps it computed and those it found finished (reused from an earlier run:
    a step that finds its record returns it unwritten, so a record older than the step's call is a cache hit).
    The counts go to summary.json's ``steps`` (``flows.run_record``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = {"computed": 0, "reused": 0}

    def step(self, spec):
        called = time.time()
        record = super().step(spec)
        reused = (Path(record.dir) / RECORD).stat().st_mtime < called
        self.steps["reused" if reused else "computed"] += 1
        return record


@flow(name="mcl-pipeline", flow_run_name=pipeline_run_name, log_prints=True)
def mcl_pipeline(config: PipelineConfigs, rerun_from: int | None = None) -> dict:
    """Multistage contrastive learning (MCL) end to end; returns the summary record (paths, results, links).

    Finished steps of earlier runs are reused; ``rerun_from=N`` recomputes stage N and later (MCL and control)
    and every evaluation that includes them.
    """
    check_run_parameters(config)  # a deployment's run may change only what its run_policy allows
    freeze_imported_heap()
    data = t.prepare_data(config=config)
    with opened_pipeline(CountingRunner, config=config, data=data, rerun_from=rerun_from) as runner:
        runner.follow()  # the plan (mclpipe plan) as artifacts of the flow run and the MLflow run, then progress
        outputs, results, final = run_all(runner)
        summary = t.summarize(config=config, parent_run_id=runner.parent_run_id, pipeline_id=runner.pipeline_id,
                              results=results, cluster_records=outputs.clusters, out_dir=str(pipeline_dir(config)),
                              final=final)
        summary = {**summary, "steps": runner.steps}
        model = log_pipeline_model(config=config, parent_run_id=runner.parent_run_id, trained=outputs.trained,
                                   exports=outputs.exports) if runner.modality.serving is not None else None
        return publish_links(config=config, summary=summary, stage_runs=runner.stage_run_ids(),
                             opened_runs=list(runner.stage_runs.values()),
                             table=t.tables_markdown(runner.modality.tables(config, summary)), model=model)
