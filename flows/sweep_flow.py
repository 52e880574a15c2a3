"""Ablation sweeps as one Prefect flow, for every modality: every point of a grid of ``--set`` values and every seed
runs the one pipeline flow as a child flow run; identical steps are shared through their content keys (a sweep over
mcl.clusters trains stage 0 once), and the flow publishes one comparison of the modality's sweep metric
(``Modality.sweep_metric``, ``contrastive.sweep``).

Resumable like a pipeline: a rerun of the same sweep finds every finished step in its content-keyed directory, so
only what did not finish is computed. A point that fails does not stop the others; the sweep then fails at the
end naming it, after publishing the comparison of the points that finished.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from contrastive import sweep
from contrastive.errors import ConfigError, MclpipeError
from flows.pipeline import mcl_pipeline
from flows.pipeline_run import closing_runs
from pipeline_config.loader import load_config, resolve_config_path
from pipeline_config.schema import _PipelineBase, digest_of
from tasks.steps import modality_of
from tasks.sweep_tasks import close_sweep_run, nest_pipeline_run, open_sweep_run, publish_sweep


def file_sweep(config: str) -> tuple[dict[str, list[str]], list[int] | None]:
    """The ``sweep:`` section of a config file or preset (empty grid and None when it has none)."""
    path = resolve_config_path(config)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}, None  # load_config reports the YAML error with its fix
    if not isinstance(raw, dict) or "sweep" not in raw:
        return {}, None
    return sweep.sweep_section(raw["sweep"], where=str(path))


def plan_sweep(*, config: str, grid: list[str], seeds: list[int] | None) -> tuple[dict[str, list[str]], list[int]]:
    """The grid and seeds of a sweep: the config's ``sweep:`` section, with ``--grid`` keys replacing or adding to
    its keys and ``--seeds`` replacing its seeds (default: seed 0)."""
    file_grid, file_seeds = file_sweep(config)
    merged = sweep.merge_grids(file_grid, sweep.parse_grid(grid) if grid else {})
    if not merged:
        raise ConfigError(f"nothing to sweep: give --grid KEY=V1,V2,... or a sweep: section in {config} "
                          "(docs/datasets.md)")
    return merged, seeds if seeds is not None else (file_seeds or [0])


def sweep_configs(*, config: str, grid: dict[str, list[str]], seeds: list[int],
                  overrides: list[str]) -> list[tuple[dict[str, str], int, _PipelineBase]]:
    """(point, seed, config) of every run, all loaded and checked before anything is computed."""
    runs = []
    for point in sweep.expand_grid(grid):
        for seed in seeds:
            cfg = load_config(config, [*overrides, *sweep.point_overrides(point, seed=seed)])
            modality_of(cfg).preflight(cfg)
            runs.append((point, seed, cfg))
    return runs


@flow(name="mcl-sweep", log_prints=True)
def mcl_sweep(config: str, grid: dict[str, list[str]], seeds: list[int],
              overrides: list[str] | None = None) -> dict:
    """Run the pipeline of ``config`` (a preset name or YAML path, with ``overrides``) at every grid point and seed;
    returns the comparison summary (rows, table, dir, the sweep's MLflow run)."""
    logger = get_run_logger()
    planned = sweep_configs(config=config, grid=grid, seeds=seeds, overrides=list(overrides or []))
    base = planned[0][2]
    sweep_id = digest_of(["sweep", [cfg.config_hash() for _, _, cfg in planned]])
    out_dir = Path(base.output_dir).resolve() / "sweeps" / sweep_id
    run_id = open_sweep_run(config=base, sweep_id=sweep_id, flow_run_id=flow_run.id, grid=grid, seeds=seeds)
    finished: list[sweep.SweepRun] = []
    failed: list[str] = []
    with closing_runs(lambda status: close_sweep_run(config=base, sweep_run_id=run_id, status=status)):
        for point, seed, cfg in planned:
            label = f"{sweep.point_label(point)}, seed={seed}"
            try:
                summary = mcl_pipeline.with_options(flow_run_name=f"{cfg.name}: {label}")(cfg)
            except Exception as exc:  # noqa: BLE001 - one failed point must not lose the others
                logger.error("sweep point %s failed: %s", label, exc)
                failed.append(label)
                continue
            nest_pipeline_run(config=cfg, sweep_run_id=run_id, pipeline_run_id=summary["mlflow_run_id"], label=label)
            finished.append(sweep.SweepRun(point=point, seed=seed, results=summary["results"],
                                           pipeline_id=summary["pipeline_id"]))
        result = publish_sweep(config=base, sweep_run_id=run_id, sweep_id=sweep_id, runs=finished,
                               keys=list(grid), out_dir=str(out_dir), failed=failed)
        if failed:
            raise MclpipeError(f"{len(failed)} of {len(planned)} sweep runs failed ({'; '.join(failed)}); the "
                               f"comparison of the others is in {out_dir}. Fix the cause and run the same sweep "
                               "again: finished steps are reused")
        return result
