"""The end of every pipeline: the links that take a person between Prefect and MLflow, and the pipeline's model.

- MLflow -> Prefect: the parent and stage runs carry ``prefect.flow_run_url``; the parent's description (markdown
  at the top of its page) holds the results table, a link to every stage run and to the Prefect flow run.
- Prefect -> MLflow: the flow run carries a link artifact to the parent run and to each stage run, and a table
  artifact of the results.
- summary.json (what ``mclpipe results`` reads) names the runs that hold the results (``stage_runs``), which after a
  rerun that reused finished stages are the runs that computed them, not empty copies.
- The pipeline's product, the integrated representation concat(normalize(z_0), ..., normalize(z_{N-1})), is logged
  as an MLflow model on the parent run and registered (alias ``current``).
"""
from __future__ import annotations

import re
from pathlib import Path

from prefect import task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.runtime import flow_run

from contrastive.engine.files import write_json
from pipeline_config.schema import _PipelineBase
from tasks.steps import modality_of, tracker_for
from tasks.records import ExportRecord, TrainRecord
from tasks.tracking import log_encoder

LOCAL_PREFECT_UI = "http://127.0.0.1:4200"  # `make ui-prefect` (the same PREFECT_HOME as `mclpipe run`)


def prefect_ui_base() -> str:
    """The Prefect UI that shows this flow run: PREFECT_UI_URL, the UI of PREFECT_API_URL's server, or the local one
    `make ui-prefect` serves from the temporary server's database."""
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL
    ui, api = PREFECT_UI_URL.value(), PREFECT_API_URL.value()
    if ui:
        return ui.rstrip("/")
    if api:  # a Prefect server (the temporary one a plain `mclpipe run` starts leaves PREFECT_API_URL unset)
        return api.rstrip("/").removesuffix("/api")
    return LOCAL_PREFECT_UI


def flow_run_url(flow_run_id: str) -> str:
    return f"{prefect_ui_base()}/runs/flow-run/{flow_run_id}"


def pipeline_run_name() -> str:
    """The flow run's name: which pipeline and config it runs ("trifeature_mcl mcl f0850c04"), not a random one."""
    config = flow_run.parameters.get("config")
    if isinstance(config, dict):  # parameters as sent by a deployment run
        return f"{config.get('name', 'pipeline')} {config.get('pipeline', '')}".strip()
    return f"{config.name} {config.pipeline} {config.config_hash()[:8]}"


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def description_markdown(*, name: str, table: str, urls: dict[str, str], flow_url: str | None,
                         model: dict | None, model_input: str = "inputs") -> str:
    lines = [f"## {name}", "", table, "", "| stage | MLflow run |", "|---|---|"]
    lines += [f"| {label} | [{url.rsplit('/', 1)[-1][:8]}]({url}) |" for label, url in urls.items()]
    if model and "registered_uri" in model:
        lines += ["", f"Model: `mlflow.pyfunc.load_model(\"{model['registered_uri']}\")` (version "
                      f"{model['version']}): {model_input} -> embeddings"]
    if flow_url:
        lines += ["", f"Prefect flow run: [{flow_url.rsplit('/', 1)[-1][:8]}]({flow_url})"]
    return "\n".join(lines) + "\n"


@task(name="log pipeline model")
def log_pipeline_model(*, config: _PipelineBase, parent_run_id: str, trained: list[TrainRecord],
                       exports: list[ExportRecord]) -> dict:
    """The MCL representation (every stage's encoder, normalised and concatenated; one stage: its encoder) as a
    logged model of the parent run, registered under ``tracking.registered_model`` (default: the config's name)
    with the alias ``current`` moved to it."""
    tracker = tracker_for(config)
    return log_encoder(tracker, parent_run_id, name="mcl-representation", modality=config.pipeline,
                       model_paths=[r.model_path for r in trained], dims=[e.dim for e in exports],
                       registered_name=config.tracking.registered_model or config.name,
                       tags={"pipeline_id": config.config_hash(), "stages": str(len(trained))},
                       source_root=Path(config.output_dir).resolve())


@task(name="link prefect and mlflow")
def publish_links(*, config: _PipelineBase, summary: dict, stage_runs: dict[str, str],
                  opened_runs: list[str], table: str, model: dict | None = None) -> dict:
    """Link the flow run and the MLflow runs both ways and record in summary.json which runs hold the results;
    returns the summary with ``stage_runs`` (label -> run id and URL), ``mlflow_url`` and ``prefect_flow_run_url``."""
    tracker = tracker_for(config)
    parent = summary["mlflow_run_id"]
    urls = {label: tracker.run_url(run_id) for label, run_id in stage_runs.items()}
    flow_id = flow_run.id
    flow_url = flow_run_url(flow_id) if flow_id else None
    if flow_url:
        for run_id in [parent, *opened_runs]:
            tracker.set_tags(run_id, {"prefect.flow_run_url": flow_url})
    tracker.set_tags(parent, {f"stage_run.{label.replace(' ', '.')}": run_id for label, run_id in stage_runs.items()})
    serving = modality_of(config).serving
    tracker.set_description(parent, description_markdown(name=config.name, table=table, urls=urls,
                                                         flow_url=flow_url, model=model,
                                                         model_input=serving.description if serving else "inputs"))
    pipeline_key = summary["pipeline_id"][:8]
    create_link_artifact(link=tracker.run_url(parent), link_text=f"MLflow: {config.name} pipeline run",
                         key=artifact_key("mlflow", config.name, pipeline_key),
                         description="The MLflow parent run: results, plots, config and the pipeline's model")
    for label, url in urls.items():
        create_link_artifact(link=url, link_text=f"MLflow: {label}",
                             key=artifact_key("mlflow", config.name, pipeline_key, label),
                             description=f"The MLflow run holding {label}'s training, files and scores")
    create_table_artifact(table=[{"representation": name, **{k: round(v, 4) for k, v in metrics.items()}}
                                 for name, metrics in summary["results"].items()],
                          key=artifact_key("results", config.name, pipeline_key),
                          description=f"{config.name}: every result of the pipeline")
    out = {**summary, "mlflow_url": tracker.run_url(parent), "prefect_flow_run_url": flow_url,
           "stage_runs": {label: {"run_id": run_id, "url": urls[label]} for label, run_id in stage_runs.items()},
           **({"model": model} if model else {})}
    path = Path(summary["dir"]) / "summary.json"
    write_json(path, {k: v for k, v in out.items() if k not in ("dir", "tracking_hint")})
    tracker.log_artifact(parent, path, artifact_path="eval")  # the run's copy names the runs too
    return out
