"""``mclpipe``: run MCL pipelines from the command line.

Every user mistake (bad config, missing data, unreachable tracking server) ends in one red line that says how to
fix it, exit code 2, and no traceback.
"""
from __future__ import annotations

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The temporary local Prefect server can take longer than its 20 s default to start on a loaded 2-core machine.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# One Prefect home for `make run` and `.venv/bin/mclpipe run` (the Makefile's), so `make ui-prefect` shows runs started
# either way; a team server given by PREFECT_API_URL keeps the user's own home and profile.
# `mclpipe resume` moves it to the run root of the pipeline it resumes when it is this CLI's choice, not the user's.
OWN_PREFECT_HOME = "PREFECT_API_URL" not in os.environ and "PREFECT_HOME" not in os.environ
if "PREFECT_API_URL" not in os.environ:
    os.environ.setdefault("PREFECT_HOME", os.path.join(os.getcwd(), ".prefect"))

import json  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Optional  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from contrastive.errors import MclpipeError, StageInterrupted  # noqa: E402
from flows import shutdown  # noqa: E402
from flows.local_server import starting_local_server  # noqa: E402
from pipeline_config.loader import described_config, load_config, preset_names  # noqa: E402
from planning.feasibility import InfeasiblePlan  # noqa: E402

# rich_markup_mode=None: help is plain text (no [markup] eaten, no ``rst`` marks).
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Multistage contrastive learning (MCL) pipelines on Prefect, tracked in MLflow.")
# emoji=False: rich would turn ``:name:`` in a value or a description into an emoji (Slurm's "H:M:S" into "HⓂS").
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)

ConfigArg = Annotated[str, typer.Argument(help="YAML config path or preset name (mclpipe presets lists them)")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="override: key.path=value (repeatable)")]


def version_of_mclpipe() -> str:
    """The installed distribution's version (pyproject.toml's, the one source of it)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("mclpipe")
    except PackageNotFoundError:  # the code run from a checkout that was never pip-installed
        return "unknown (not installed: pip install -e .)"


def _print_version(value: bool) -> None:
    if value:
        console.print(f"mclpipe {version_of_mclpipe()}", highlight=False, markup=False)
        raise typer.Exit()


@app.callback()
def console_options(
        version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                              help="print mclpipe's version and exit")] = False,
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show Prefect's and MLflow's INFO lines on the "
                                                                      "console too (they always go to the log file)")]
        = False,
        log_level: Annotated[Optional[str], typer.Option(help="the console's log level: DEBUG, INFO, WARNING (the "
                                                              "default), ERROR")] = None) -> None:
    """Multistage contrastive learning (MCL) pipelines on Prefect, tracked in MLflow."""
    from flows.console import LOG_LEVEL_ENV
    if log_level is not None and log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        fail(f"--log-level {log_level!r} is not a level: use DEBUG, INFO, WARNING or ERROR")
    if verbose or log_level:
        os.environ[LOG_LEVEL_ENV] = (log_level or "INFO").upper()


def fail(message: str, config=None, *, at_once: bool = False) -> None:
    """A mistake the user can fix: one line (also in ``<output_dir>/last-stop.txt`` once the config is known),
    exit 2. ``at_once``: exit without waiting for Prefect's queued events and logs (a server that is gone: each
    event waits seconds for a connection that never comes, minutes in all after the line was printed)."""
    shutdown.record_stop(config.output_dir if config is not None else None, f"error: {message}")
    shutdown.say(err_console, f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    if at_once:
        shutdown.exit_now(2)
    raise typer.Exit(code=2)


def interrupted(exc: StageInterrupted, config, *, rerun_from: int | None = None, command: str | None = None) -> None:
    """Ctrl-C or SIGTERM: one line (what stopped, the checkpoint kept, the resume command), also in
    ``<output_dir>/last-stop.txt``; exit 128 + signal."""
    message = shutdown.interrupted_message(exc, config, rerun_from=rerun_from, command=command)
    shutdown.record_stop(config.output_dir if config is not None else None, f"interrupted: {message}")
    shutdown.say(err_console, f"[bold yellow]interrupted:[/] {message}", highlight=False, soft_wrap=True)
    shutdown.exit_now(exc.exit_code)


def fail_disk_full(exc: OSError, config=None) -> None:
    """A full disk met outside the steps (Prefect's result store, a summary): one line naming the directory."""
    from contrastive.engine.files import disk_full_error, is_disk_full
    if not is_disk_full(exc):
        raise exc
    where = Path(exc.filename).parent if exc.filename else Path.cwd()
    fail(str(disk_full_error(directory=where, what="the pipeline's records")), config)


def load_or_fail(config: str, overrides: list[str] | None):
    try:
        return load_config(config, overrides or [])
    except MclpipeError as exc:
        fail(str(exc))


def rich_table(table) -> Table:
    """A results table (``ResultsTable``: rows {representation: {"<metric>/<column>": value}}) for the terminal."""
    from flows.console import rich_table as terminal_table
    return terminal_table(table)


def run_pipeline(config, rerun_from: int | None = None, *, force: bool = False) -> dict:
    """Run the config's pipeline (its ``pipeline:`` key picks the modality); returns the summary record
    {"results", "dir", "tracking_hint", links...}, its summary.json with the run's wall time, steps computed and
    reused, and machine (``flows.run_record``)."""
    from flows.run_record import load_average, record_run
    started, load_at_start = time.perf_counter(), load_average()
    if rerun_from is not None and not 0 <= rerun_from < config.mcl.num_stages:
        raise MclpipeError(f"--rerun-from {rerun_from} is not a stage of this pipeline (stages are 0.."
                           f"{config.mcl.num_stages - 1})")
    # Fail on user mistakes before anything is computed (the temporary Prefect server starting meanwhile is stopped);
    # an unreachable tracking server is reported now, not after the first stage. The server is spawned first, so
    # its start-up overlaps the imports of the steps (torch, MLflow) as well as the checks.
    with starting_local_server():
        from tasks.steps import modality_of, tracker_for
        if not force:  # disk, memory, capacity and shards against this machine (`mclpipe plan`), in well under 1 s,
            # before anything is written under output_dir (the log file included)
            from flows.plan_steps import check_feasible
            check_feasible(config, warn=lambda line: shutdown.say(
                err_console, f"[bold yellow]warning:[/] {line}", highlight=False, soft_wrap=True))
        modality_of(config).preflight(config)
        quiet_console_of(config)  # Prefect and MLflow are imported: their INFO lines go to the log file
        tracker_for(config)
    shutdown.quiet_user_tracebacks()
    from flows.pipeline import mcl_pipeline
    summary = mcl_pipeline(config, rerun_from=rerun_from)
    return record_run(summary, wall_seconds=time.perf_counter() - started, load_at_start=load_at_start)


def quiet_console_of(config) -> None:
    """Prefect's and MLflow's INFO lines off the console, into ``<output_dir>/logs/`` (flows.console); a log file
    that cannot be created (an output_dir not writable yet) leaves the console as it is."""
    from flows.console import log_file_for, quiet_console
    try:
        quiet_console(log_file_for(config.output_dir, config.name))
    except OSError:
        quiet_console(None)


RerunOpt = Annotated[Optional[int], typer.Option("--rerun-from", help="recompute stage N and later even if finished")]


ForceOpt = Annotated[bool, typer.Option("--force", help="skip the check of disk, memory and shards against this "
                                                        "machine made before the first step (`mclpipe plan`)")]


@app.command()
def run(config: ConfigArg, overrides: SetOpt = None, rerun_from: RerunOpt = None, force: ForceOpt = False) -> None:
    """Run an MCL pipeline (finished steps of an identical earlier run are reused, not recomputed)."""
    run_and_report(lambda: load_config(config, overrides or []), rerun_from=rerun_from, force=force)


def run_and_report(make_config, *, rerun_from: int | None, force: bool = False) -> None:
    """Load the config, run its pipeline and print the report; user mistakes end in one line, and so do Ctrl-C,
    SIGTERM (exit 130 / 143, see ``flows.shutdown``) and a full disk."""
    cfg = None
    try:
        cfg = make_config()
        started = time.perf_counter()
        summary = run_pipeline(cfg, rerun_from=rerun_from, force=force)
    except StageInterrupted as exc:
        interrupted(exc, cfg, rerun_from=rerun_from)
        return
    except InfeasiblePlan as exc:  # refused before the first step: nothing is written, not even last-stop.txt
        fail(str(exc))
        return
    except MclpipeError as exc:
        from flows.faults import with_continue_command
        fail(with_continue_command(exc, cfg, rerun_from=rerun_from), cfg)
        return
    except Exception as exc:  # a disk, store or server around the run failed: one line, else the traceback
        from contrastive.engine.files import is_disk_full
        if isinstance(exc, OSError) and is_disk_full(exc):
            fail_disk_full(exc, cfg)
        from flows.faults import explain_failure
        line = explain_failure(exc, cfg)
        if line is None:
            raise
        fail(line, cfg, at_once=shutdown.prefect_unreachable(exc))
        return
    report(cfg, summary, time.perf_counter() - started)
    shutdown.record_stop(cfg.output_dir, f"finished: pipeline {summary.get('pipeline_id', '')} in "
                                         f"{(time.perf_counter() - started) / 60:.1f} min; `mclpipe results` "
                                         f"prints its tables")


def find_pipeline_config(pipeline: str, output_dir: Path) -> Path:
    """The saved config of a pipeline id (or a unique prefix of one) under output_dir/pipelines."""
    root = output_dir / "pipelines"
    matches = sorted(root.glob(f"{pipeline}*/config.yaml")) if root.is_dir() else []
    if len(matches) != 1:
        known = ", ".join(p.name for p in sorted(root.iterdir())) if root.is_dir() else "none"
        what = "no pipeline" if not matches else f"{len(matches)} pipelines"
        raise MclpipeError(f"{what} matching {pipeline!r} under {root} (known: {known}); give the id printed by "
                           f"`mclpipe run` (the config hash) or pass --output-dir")
    return matches[0]


@app.command()
def resume(pipeline: Annotated[str, typer.Argument(help="pipeline id (config hash) or a unique prefix")],
           output_dir: Annotated[Path, typer.Option(help="where the pipeline wrote its files")] = Path("runs"),
           rerun_from: RerunOpt = None, overrides: SetOpt = None) -> None:
    """Continue a crashed or killed pipeline: finished steps are reused, a stage killed mid-way continues from its
    last checkpoint. --set changes the saved config first (e.g. --set stage_overrides.2.train.epochs=20 with
    --rerun-from 2): that is a new pipeline id, whose unchanged steps are reused. Works from any directory: the
    saved config's relative paths are those of the directory the pipeline was started in."""
    output_dir = output_dir.resolve()
    run_and_report(lambda: saved_config_at_its_root(find_pipeline_config(pipeline, output_dir), output_dir,
                                                    overrides or []),
                   rerun_from=rerun_from)


def saved_config_at_its_root(path: Path, output_dir: Path, overrides: list[str]):
    """The saved config ``path`` of a pipeline found under ``output_dir``, with this process moved to the pipeline's
    run root (``pipeline_config.run_root``): what the config names relatively (output_dir, data.cache_dir, the
    default MLflow store, Prefect's home) is what it named when the pipeline started, whatever directory the
    command runs in and wherever the whole directory was moved. A renamed output_dir is the one given."""
    from pipeline_config.run_root import run_root_of_saved
    config = load_config(path, overrides)
    root = run_root_of_saved(path, output_dir=output_dir, saved_output_dir=config.output_dir)
    os.chdir(root)
    if OWN_PREFECT_HOME:
        os.environ["PREFECT_HOME"] = str(root / ".prefect")
    if Path(config.output_dir).resolve() != output_dir:
        config.output_dir = Path(os.path.relpath(output_dir, root))
    return config


@app.command()
def serve(configs: Annotated[Optional[list[str]], typer.Argument(help="configs to serve (default: all presets)")] = None,
          overrides: SetOpt = None) -> None:
    """Register one Prefect deployment per config (its schedule from the config's schedule section) and run them
    here."""
    from flows.deployments import serve_deployments
    try:
        serve_deployments(configs, overrides)
    except MclpipeError as exc:
        fail(str(exc))


@app.command()
def deploy(config: ConfigArg, work_pool: Annotated[str, typer.Option(help="Prefect work pool name")],
           image: Annotated[Optional[str], typer.Option(help="image for docker/kubernetes pools")] = None,
           source: Annotated[Optional[str], typer.Option(help="git URL or path of this code (process pools)")] = None,
           overrides: SetOpt = None) -> None:
    """Register a deployment on the Prefect server in PREFECT_API_URL for a work pool."""
    from flows.deployments import deploy_to_work_pool
    try:
        deployment_id = deploy_to_work_pool(config_name=config, work_pool=work_pool, image=image, source=source,
                                            overrides=overrides)
    except MclpipeError as exc:
        fail(str(exc))
        return
    console.print(f"deployment {deployment_id} registered for work pool {work_pool!r}; start a worker with "
                  f"`prefect worker start --pool {work_pool}`")


def report(cfg, summary: dict, elapsed: float) -> None:
    """The results table, the wall time, where the files are and how to open MLflow on the run."""
    print_tables(cfg, summary)
    console.print(f"wall time {elapsed / 60:.1f} min; results in {summary['dir']}", soft_wrap=True)
    print_links(cfg, summary)
    console.print(f"pipeline id {summary.get('pipeline_id', '')}: `mclpipe resume` it after a crash, "
                  f"`mclpipe results` to see this table again", soft_wrap=True)
    from flows.console import current_log_file
    if current_log_file() is not None:
        console.print(f"full log: {current_log_file()} (--verbose shows it here)", soft_wrap=True, highlight=False)


def print_links(cfg, summary: dict) -> None:
    """Where the runs are, as commands that work as printed and URLs on lines of their own (never wrapped by the
    terminal table, so a terminal keeps them clickable)."""
    from tasks.tracking import default_tracking_uri, ui_command
    command = ui_command(cfg.tracking.uri or default_tracking_uri())
    url = summary.get("mlflow_url")
    if url is None:  # a summary written before the links existed
        console.print(f"MLflow parent run: {summary.get('mlflow_run_id')}", soft_wrap=True)
        return
    console.print(f"MLflow: {'`' + command + '`, then open' if command else 'open'} the pipeline run", soft_wrap=True)
    console.print(url, soft_wrap=True, highlight=False, style="link " + url)
    for label, run in summary.get("stage_runs", {}).items():
        console.print(f"  {label}: {run['url']}", soft_wrap=True, highlight=False)
    if summary.get("model", {}).get("registered_uri"):
        console.print(f"model: mlflow.pyfunc.load_model(\"{summary['model']['registered_uri']}\")", soft_wrap=True,
                      highlight=False)
    if summary.get("prefect_flow_run_url"):
        import sys
        prefect_bin = Path(sys.executable).with_name("prefect")
        here = shlex.quote(str(Path.cwd()))  # `make -C`: the command works from any directory
        command = f"make -C {here} ui-prefect" if Path("Makefile").exists() and "PREFECT_API_URL" not in os.environ \
            else f"PREFECT_HOME={os.environ.get('PREFECT_HOME', '~/.prefect')} {prefect_bin} server start"
        if "PREFECT_API_URL" in os.environ:
            console.print("Prefect: open the flow run", soft_wrap=True)
        else:
            console.print(f"Prefect: `{command}`, then open the flow run", soft_wrap=True)
        console.print(summary["prefect_flow_run_url"], soft_wrap=True, highlight=False)


def print_tables(cfg, summary: dict) -> None:
    """The modality's results tables (contrastive.modalities.base.ResultsTable) that hold a value, each in tables
    of at most 80 columns, then one line reading them."""
    from flows.console import WIDTH, fitting_tables, printable_tables, reading_line
    from tasks.steps import modality_of
    tables = printable_tables(modality_of(cfg).tables(cfg, summary))
    for table in tables:
        for part in fitting_tables(table, width=WIDTH):
            console.print()
            console.print(part, width=WIDTH)
    line = reading_line(tables)
    if line:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


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
    seed_runs: list[dict] = []  # each seed's wall time and steps computed / reused
    from flows.run_record import add_steps, finished_at, load_average, machine
    started, load_at_start = time.perf_counter(), load_average()
    cfg = None
    try:
        for seed in seed_list:
            cfg = load_config(config, [*(overrides or []), f"seed={seed}"])
            summary = run_pipeline(cfg)
            per_seed.append(summary["results"])
            seed_runs.append({"seed": seed, "pipeline_id": summary.get("pipeline_id"),
                              "wall_seconds": summary.get("wall_seconds"), "steps": summary.get("steps", {})})
    except StageInterrupted as exc:  # the seeds that finished are reused when the same command runs again
        interrupted(exc, cfg, command=shutdown.command_line())
        return
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
    out.write_text(json.dumps({"seeds": seed_list, "wall_seconds": round(elapsed, 1),
                               "steps": add_steps([r["steps"] for r in seed_runs]), "seed_runs": seed_runs,
                               "machine": machine(load_at_start=load_at_start), "finished_at": finished_at(),
                               "per_seed": per_seed, "mean_std": rows}, indent=2))
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
def sweep(config: ConfigArg,
          grid: Annotated[Optional[list[str]], typer.Option(
              "--grid", "-g", help="KEY=V1,V2,... (repeatable): the values to sweep; list values: KEY=[4,2],[8,2]; "
                                   "adds to / replaces the keys of the config's sweep: section")] = None,
          seeds: Annotated[Optional[str], typer.Option(help="comma-separated seeds, each point runs once per seed "
                                                            "(default: the sweep: section's, else 0)")] = None,
          overrides: SetOpt = None) -> None:
    """Run the pipeline at every combination of --grid values and seed as child Prefect flow runs of one sweep
    flow (shared steps computed once, a rerun redoes only what did not finish); print and write the comparison."""
    try:
        seed_list = None if seeds is None else [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds must be comma-separated integers, got {seeds!r}")
        return
    started = time.perf_counter()
    configs = []
    try:
        from flows.sweep_flow import mcl_sweep, plan_sweep, sweep_configs
        with starting_local_server():  # starts while every point is loaded and checked, before anything is computed
            parsed, seed_list = plan_sweep(config=config, grid=list(grid or []), seeds=seed_list)
            configs = sweep_configs(config=config, grid=parsed, seeds=seed_list, overrides=list(overrides or []))
        shutdown.quiet_user_tracebacks()
        summary = mcl_sweep(config=config, grid=parsed, seeds=seed_list, overrides=list(overrides or []))
    except StageInterrupted as exc:  # finished points are reused when the same command runs again
        interrupted(exc, configs[0][2] if configs else None, command=shutdown.command_line())
        return
    except MclpipeError as exc:
        fail(str(exc))
        return
    console.print(summary["table"], markup=False)
    console.print(f"sweep wall time {(time.perf_counter() - started) / 60:.1f} min; comparison in {summary['dir']} "
                  f"(comparison.md, comparison.csv, accuracy_vs_*.png); {summary['tracking_hint']}")


@app.command()
def results(config: ConfigArg, overrides: SetOpt = None) -> None:
    """Print the results of the last finished run of a config (nothing is computed) and where its files are."""
    cfg = load_or_fail(config, overrides)
    summary_path = Path(cfg.output_dir).resolve() / "pipelines" / cfg.config_hash() / "summary.json"
    if not summary_path.exists():
        fail(f"no finished run of this config (hash {cfg.config_hash()}) under {cfg.output_dir}: "
             f"run `mclpipe run {config}` with the same --set options first")
        return
    summary = json.loads(summary_path.read_text())
    print_tables(cfg, summary)
    console.print(f"files: {summary_path.parent}", soft_wrap=True)
    print_links(cfg, summary)


@app.command()
def status(output_dir: Annotated[Path, typer.Option(help="the runs' output_dir")] = Path("runs")) -> None:
    """How the last mclpipe run / resume under output_dir ended: its final line (finished, error or
    interrupted, with the command that continues it), kept even when the terminal or pipe it printed to closed."""
    path = output_dir.resolve() / shutdown.LAST_STOP
    if not path.exists():
        fail(f"no run has ended under {output_dir.resolve()} yet (no {shutdown.LAST_STOP}); pass the run's "
             "output_dir with --output-dir")
        return
    shutdown.say(console, path.read_text().strip(), highlight=False, markup=False, soft_wrap=True)


@app.command()
def plan(config: ConfigArg, overrides: SetOpt = None,
         recalibrate: Annotated[bool, typer.Option(help="measure the rates again (cached per machine and config)")]
         = False,
         calibrate: Annotated[bool, typer.Option(help="measure the rates on this data and device when none are "
                                                      "cached (seconds); --no-calibrate: closed forms only")] = True
         ) -> None:
    """What a run will cost before it runs: one row per step (time, peak RAM, disk written, GPU memory per
    device), the total and the critical path, what each figure rests on, and what this machine cannot hold."""
    from flows.plan_steps import build_plan
    from planning.feasibility import feasibility
    from planning.report import summary_lines, table_rows
    cfg = load_or_fail(config, overrides)
    try:
        result = build_plan(cfg, calibrate=calibrate, recalibrate=recalibrate,
                            log=lambda line: err_console.print(line, highlight=False, markup=False))
    except MclpipeError as exc:
        fail(str(exc))
        return
    rows = table_rows(result)
    out = Table(title=f"plan of {cfg.name} (pipeline id {cfg.config_hash()})")
    for column in rows[0]:
        out.add_column(column, justify="left" if column in ("step", "rests on") else "right")
    for row in rows:
        out.add_row(*row.values())
    wide = Console(width=max(console.width, 180), emoji=False) if not console.is_terminal else console  # the bases on one line
    wide.print(out)
    for line in summary_lines(result):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for finding in feasibility(cfg, result):
        colour = "red" if finding.level == "error" else "yellow"
        console.print(f"[bold {colour}]{finding.level}:[/] {finding.message}", highlight=False, soft_wrap=True)


@app.command("show-config")
def show_config(config: ConfigArg, overrides: SetOpt = None) -> None:
    """Print the fully resolved config: every valid key with its description, the values that differ from the
    defaults marked [changed], and its hash. The output is YAML that loads back to the same config."""
    cfg = load_or_fail(config, overrides)
    console.print(described_config(cfg), highlight=False, markup=False, soft_wrap=True)
    console.print(f"# config_hash: {cfg.config_hash()}")


@app.command("convert-checkpoint")
def convert_checkpoint(path: Annotated[Path, typer.Argument(help="a checkpoint or model file of an earlier mclpipe")]) -> None:
    """Rewrite a checkpoint or model file written by an earlier mclpipe in the format that loads without running
    code. The old file is read with only the data types earlier versions stored allowed; nothing in it runs, and a
    file holding anything else is refused (docs/operating.md)."""
    from contrastive.engine.checkpoint import convert_to_safe_format
    try:
        console.print(convert_to_safe_format(path), highlight=False, markup=False, soft_wrap=True)
    except MclpipeError as exc:
        fail(str(exc))


@app.command()
def presets() -> None:
    """List the bundled config presets."""
    for name in preset_names():
        console.print(name)


def main() -> None:
    shutdown.install()
    app()


if __name__ == "__main__":
    main()
