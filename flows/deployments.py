"""Prefect deployments of mclpipe's pipelines: `mclpipe serve` (local process, schedules from the configs) and
`mclpipe deploy` (a team's Prefect server and work pool).

The flow's parameter is the typed config itself, so the Prefect UI renders it as a form and enforces the schema
when someone starts a run by hand. The config stored here is the operator's: a run may change only the keys its
``run_policy`` lists, which the flow checks before any compute (``flows/run_parameters.py``).
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from prefect.schedules import Cron, Interval

from contrastive.errors import ConfigError
from pipeline_config.loader import load_config, preset_names
from flows.pipeline import mcl_pipeline
from pipeline_config.schema import _PipelineBase

REPO_ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/pipeline.py:mcl_pipeline"  # the one pipeline flow, for every modality


def schedules_of(config: _PipelineBase) -> list:
    schedule = config.schedule
    if schedule.cron:
        return [Cron(schedule.cron, timezone=schedule.timezone)]
    if schedule.interval_minutes:
        return [Interval(timedelta(minutes=schedule.interval_minutes), timezone=schedule.timezone)]
    return []


def deployment_name(config: _PipelineBase) -> str:
    return config.name


def description_of(config: _PipelineBase, config_name: str) -> str:
    """What the deployment page shows: the config it runs and what a run of it may change."""
    allowed = ", ".join(config.run_policy.overridable) or "nothing"
    return (f"{config.pipeline} pipeline from config {config_name!r} (config hash {config.config_hash()}). A run may "
            f"change only: {allowed} (paths under {', '.join(config.run_policy.path_roots) or 'no root'}); the rest "
            "is fixed at deploy time (run_policy, docs/ui.md)")


def with_config_form(deployment, config: _PipelineBase):
    """``deployment`` with its parameter schema narrowed to ``config``'s own modality: the flow's ``config`` parameter
    is the union of every modality's config (a oneOf with a discriminator), which Prefect's deployment form shows only
    as raw JSON; typed as the one config class the deployment runs, it is the form of that config's sections and
    fields (the Custom run form of docs/ui.md). Prefect has no public argument for it, so the private schema that
    ``to_deployment`` derived from the flow's signature is replaced."""
    import inspect

    from prefect.utilities.callables import generate_parameter_schema, parameter_docstrings

    signature = inspect.signature(mcl_pipeline.fn, eval_str=True)
    parameters = [p.replace(annotation=type(config)) if p.name == "config" else p
                  for p in signature.parameters.values()]
    deployment._parameter_openapi_schema = generate_parameter_schema(
        signature.replace(parameters=parameters), parameter_docstrings(inspect.getdoc(mcl_pipeline.fn)))
    return deployment


def build_deployments(config_names: list[str] | None = None, overrides: list[str] | None = None) -> list:
    """One RunnerDeployment per config (default: every bundled preset), each with its config as the default
    parameters and its schedule from the config's ``schedule`` section (none = run on demand from the UI)."""
    deployments = []
    for name in config_names or preset_names():
        config = load_config(name, overrides or [])
        deployments.append(with_config_form(mcl_pipeline.to_deployment(
            name=deployment_name(config), parameters={"config": config.model_dump(mode="json")},
            schedules=schedules_of(config), tags=["mclpipe", config.pipeline],
            description=description_of(config, name)),
            config))
    return deployments


def serve_deployments(config_names: list[str] | None = None, overrides: list[str] | None = None) -> None:
    """Register the deployments and run their flow runs in this process until interrupted."""
    from prefect import serve
    serve(*build_deployments(config_names, overrides))


def deploy_to_work_pool(*, config_name: str, work_pool: str, image: str | None = None,
                        overrides: list[str] | None = None, source: str | None = None) -> str:
    """Register a deployment on a team's Prefect server for a work pool (process, docker or kubernetes).

    Process pools run the code from ``source`` (a git URL or a path the workers can read; default this checkout);
    docker/kubernetes pools run ``image`` (build it from the Dockerfile and push it first). Returns the
    deployment id.
    """
    config = load_config(config_name, overrides or [])
    require_work_pool(work_pool)
    flow = mcl_pipeline
    if image is None:
        flow = flow.from_source(source=source or str(REPO_ROOT), entrypoint=ENTRYPOINT)
    # Not flow.deploy(): in prefect 3.8.8 it first lists the pool's online workers with offset and limit sent as
    # null, which the server (under fastapi 0.154) rejects with 422, so `mclpipe deploy` never reached the server.
    # to_deployment + apply registers the same deployment (storage pull step, entrypoint, pool, image) without it.
    deployment = flow.to_deployment(
        name=deployment_name(config), work_pool_name=work_pool, parameters={"config": config.model_dump(mode="json")},
        schedules=schedules_of(config), tags=["mclpipe", config.pipeline],
        description=description_of(config, config_name))
    return str(with_config_form(deployment, config).apply(work_pool_name=work_pool, image=image))


def require_work_pool(name: str) -> None:
    """The work pool must exist on the server before a deployment names it (a worker of it runs the flow runs)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            raise ConfigError(f"work pool {name!r} does not exist on the Prefect server at "
                              f"{PREFECT_API_URL.value() or 'the local server'}: create it first (prefect work-pool "
                              f"create {name} --type process, or docker / kubernetes)") from None
