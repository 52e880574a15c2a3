"""Thin Prefect tasks of a sweep: its MLflow run (the parent of every pipeline it ran) and the comparison it
publishes (markdown artifact, CSV, plots). The grid and the table are ``contrastive.sweep``."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from contrastive import sweep
from contrastive.engine.files import write_json
from pipeline_config.schema import _PipelineBase
from tasks.steps import modality_of, tracker_for


@task(name="open-sweep-run")
def open_sweep_run(*, config: _PipelineBase, sweep_id: str, flow_run_id: str | None, grid: dict[str, list[str]],
                   seeds: list[int]) -> str:
    tracker = tracker_for(config)
    tags = {"kind": "sweep", "sweep_id": sweep_id, "pipeline_name": config.name}
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    run_id = tracker.start_run(name=f"sweep-{config.name}-{sweep_id[:8]}", tags=tags,
                               reuse_tags={"prefect.flow_run_id": flow_run_id} if flow_run_id else None)
    tracker.log_params(run_id, {**{f"grid.{k}": ",".join(v) for k, v in grid.items()},
                                "seeds": ",".join(map(str, seeds))})
    return run_id


@task(name="nest-pipeline-run")
def nest_pipeline_run(*, config: _PipelineBase, sweep_run_id: str, pipeline_run_id: str, label: str) -> None:
    """Show a finished pipeline's MLflow run under the sweep's run (the UI nests by ``mlflow.parentRunId``)."""
    tracker_for(config).set_tags(pipeline_run_id, {"mlflow.parentRunId": sweep_run_id, "sweep.point": label})


@task(name="publish-sweep")
def publish_sweep(*, config: _PipelineBase, sweep_run_id: str, sweep_id: str, runs: list[sweep.SweepRun],
                  keys: list[str], out_dir: str, failed: list[str]) -> dict:
    """comparison.md / comparison.csv / accuracy_vs_<key>.png of the modality's sweep metric in ``out_dir``, on the
    sweep's MLflow run and as the Prefect markdown artifact ``mcl-sweep-<id>``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tracker = tracker_for(config)
    metric = modality_of(config).sweep_metric
    rows = sweep.aggregate(runs, metric=metric.prefix)
    table = sweep.comparison_markdown(rows, keys=keys) if rows else "(no finished runs)\n"
    (out / "comparison.md").write_text(table)
    paths = [sweep.write_csv(rows, out / "comparison.csv", keys=keys)]
    if rows:
        paths += [sweep.plot_against(rows, key=k, path=out / f"accuracy_vs_{k.replace('.', '_')}.png",
                                     ylabel=metric.label, percent=metric.percent) for k in keys]
    paths.append(out / "comparison.md")
    summary = {"sweep_id": sweep_id, "mlflow_run_id": sweep_run_id, "keys": keys, "rows": rows, "failed": failed,
               "pipelines": [{"point": r.point, "seed": r.seed, "pipeline_id": r.pipeline_id} for r in runs]}
    write_json(out / "summary.json", summary)
    for path in [*paths, out / "summary.json"]:
        tracker.log_artifact(sweep_run_id, path, artifact_path="sweep")
    failed_note = f"\n\nfailed (rerun the sweep to retry only these): {', '.join(failed)}\n" if failed else ""
    create_markdown_artifact(markdown=f"# sweep {config.name}: {metric.label}, mean ± std over seeds\n\n"
                                      f"{table}{failed_note}", key=f"mcl-sweep-{sweep_id[:8]}",
                             description=f"sweep over {', '.join(keys)}")
    return {**summary, "dir": str(out), "table": table, "tracking_hint": tracker.run_url_hint(sweep_run_id)}


@task(name="close-sweep-run")
def close_sweep_run(*, config: _PipelineBase, sweep_run_id: str, status: str) -> None:
    tracker_for(config).end_run(sweep_run_id, status=status)
