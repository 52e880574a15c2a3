"""``mclpipe``: run MCL pipelines from the command line.

Every user mistake (bad config, missing data, unreachable tracking server) ends in one red line that says how to
fix it, exit code 2, and no traceback.
"""
from __future__ import annotations

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Optional  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from contrastive.errors import MclpipeError  # noqa: E402
from pipeline_config.loader import dump_config, load_config, preset_names  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Multistage contrastive learning (MCL) pipelines on Prefect, tracked in MLflow.")
console = Console()
err_console = Console(stderr=True)

ConfigArg = Annotated[str, typer.Argument(help="YAML config path or preset name (see `mclpipe presets`)")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="override: key.path=value (repeatable)")]


def fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def results_table(title: str, results: dict[str, dict[str, float]], metric: str = "probe") -> Table:
    attributes = sorted({k.split("/", 1)[1] for m in results.values() for k in m if k.startswith(metric + "/")})
    table = Table(title=title)
    table.add_column("representation")
    for attribute in attributes:
        table.add_column(attribute, justify="right")
    for name, metrics in results.items():
        table.add_row(name, *(f"{metrics.get(f'{metric}/{a}', float('nan')):.3f}" for a in attributes))
    return table


def run_pipeline(config) -> dict:
    """Dispatch on the config's ``pipeline`` kind; every flow returns {"results", "dir", "tracking_hint", ...}."""
    if config.pipeline == "clip":
        from flows.clip_flow import clip_pipeline
        return clip_pipeline(config)
    from flows.mcl_flow import mcl_pipeline
    from pipeline_config.schema import preflight
    preflight(config)  # fail on user mistakes before the Prefect server starts or anything is computed
    return mcl_pipeline(config)


@app.command()
def run(config: ConfigArg, overrides: SetOpt = None) -> None:
    """Run an MCL pipeline (finished steps of an identical earlier run are reused, not recomputed)."""
    try:
        cfg = load_config(config, overrides or [])
        started = time.perf_counter()
        summary = run_pipeline(cfg)
    except MclpipeError as exc:
        fail(str(exc))
        return
    elapsed = time.perf_counter() - started
    console.print(results_table(f"{cfg.name}: linear-probe accuracy (held-out split)", summary["results"]))
    console.print(results_table("kNN accuracy", summary["results"], metric="knn"))
    console.print(f"wall time {elapsed / 60:.1f} min; results in {summary['dir']}")
    console.print(f"MLflow: {summary['tracking_hint']}")


@app.command()
def reproduce(config: ConfigArg, seeds: Annotated[str, typer.Option(help="comma-separated seeds")] = "0,1,2",
              overrides: SetOpt = None) -> None:
    """Run the pipeline (MCL and control) once per seed on the same data; print mean and spread."""
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds must be comma-separated integers, got {seeds!r}")
        return
    per_seed: list[dict[str, dict[str, float]]] = []
    started = time.perf_counter()
    try:
        for seed in seed_list:
            cfg = load_config(config, [*(overrides or []), f"seed={seed}"])
            per_seed.append(run_pipeline(cfg)["results"])
    except MclpipeError as exc:
        fail(str(exc))
        return
    elapsed = time.perf_counter() - started
    rows = aggregate_seeds(per_seed)
    table = Table(title=f"{len(seed_list)} seeds ({seeds}): linear-probe accuracy, mean ± std")
    attributes = sorted({a for r in rows.values() for a in r})
    table.add_column("representation")
    for attribute in attributes:
        table.add_column(attribute, justify="right")
    for name, stats in rows.items():
        table.add_row(name, *(f"{stats[a][0]:.3f} ± {stats[a][1]:.3f}" for a in attributes))
    console.print(table)
    console.print(f"wall time {elapsed / 60:.1f} min for {len(seed_list)} seeds")
    out = Path(cfg.output_dir) / "reproduce" / f"{cfg.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seeds": seed_list, "wall_seconds": elapsed, "per_seed": per_seed,
                               "mean_std": rows}, indent=2))
    console.print(f"written {out}")


def aggregate_seeds(per_seed: list[dict[str, dict[str, float]]], metric: str = "probe"
                    ) -> dict[str, dict[str, tuple[float, float]]]:
    """{representation: {attribute: (mean, population std)}} over seeds."""
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    for name in per_seed[0]:
        attributes = sorted(k.split("/", 1)[1] for k in per_seed[0][name] if k.startswith(metric + "/"))
        rows[name] = {}
        for attribute in attributes:
            values = [r[name][f"{metric}/{attribute}"] for r in per_seed if name in r]
            rows[name][attribute] = (statistics.fmean(values), statistics.pstdev(values))
    return rows


@app.command()
def results(config: ConfigArg, overrides: SetOpt = None) -> None:
    """Print the results of the last finished run of a config (nothing is computed) and where its files are."""
    try:
        cfg = load_config(config, overrides or [])
    except MclpipeError as exc:
        fail(str(exc))
        return
    summary_path = Path(cfg.output_dir).resolve() / "pipelines" / cfg.config_hash() / "summary.json"
    if not summary_path.exists():
        fail(f"no finished run of this config (hash {cfg.config_hash()}) under {cfg.output_dir}: "
             f"run `mclpipe run {config}` with the same --set options first")
        return
    summary = json.loads(summary_path.read_text())
    console.print(results_table(f"{cfg.name}: linear-probe accuracy (held-out split)", summary["results"]))
    console.print(results_table("kNN accuracy", summary["results"], metric="knn"))
    console.print(f"files: {summary_path.parent}")
    console.print(f"MLflow parent run: {summary.get('mlflow_run_id')}")


@app.command("show-config")
def show_config(config: ConfigArg, overrides: SetOpt = None) -> None:
    """Print the fully resolved config (every valid key, with defaults) and its hash."""
    try:
        cfg = load_config(config, overrides or [])
    except MclpipeError as exc:
        fail(str(exc))
        return
    console.print(dump_config(cfg), highlight=False, markup=False)
    console.print(f"# config_hash: {cfg.config_hash()}")


@app.command()
def presets() -> None:
    """List the bundled config presets."""
    for name in preset_names():
        console.print(name)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
