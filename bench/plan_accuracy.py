"""How close `mclpipe plan` comes: its projected total against the measured wall time of `mclpipe run`, per preset
(``python -m bench.plan_accuracy [--presets a,b]``; issue 46).

For each preset, in a fresh work directory: the plan with a fresh calibration (``flows.plan_steps.build_plan``,
``recalibrate``: what `mclpipe plan` does on a machine it has not seen), then `mclpipe run` of the same config as a
user runs it (a subprocess with its own Prefect home and temporary server), timed from the outside. The run's task
runs (start and end in its Prefect database) give each step's measured seconds, matched to the plan's rows by their
titles (the task run names). The plan's total projects the run's wall time (its steps, each with its task run and
records, and the run's start, bookkeeping and end as the run probe measured them), so that is what it is compared
with; its steps alone are compared with the task runs'. Printed: a markdown table per preset and the totals with
their errors, and the load average after each run; ``--json`` keeps every figure. Not part of `make bench`: minutes of CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = ("trifeature_tiny", "clip_tiny", "text_tiny", "embeddings_tiny", "trifeature_quick")
MCLPIPE = str(Path(sys.executable).with_name("mclpipe"))


def settings(work: Path) -> list[str]:
    return [f"output_dir={work / 'runs'}", f"data.cache_dir={work / 'data'}",
            f"tracking.uri=sqlite:///{work / 'mlflow.db'}"]


def task_seconds(prefect_home: Path) -> dict[str, float]:
    """{task run name: seconds} of the run's task runs (the step titles; the data's preparation as 'prepare
    data')."""
    with sqlite3.connect(prefect_home / "prefect.db") as db:
        rows = db.execute("select name, (julianday(end_time) - julianday(start_time)) * 86400 from task_run "
                          "where end_time is not null").fetchall()
    out: dict[str, float] = {}
    for name, seconds in rows:
        key = "prepare data" if name.startswith("prepare-data") else name  # tasks.steps.prepare_data's task
        out[key] = out.get(key, 0.0) + float(seconds or 0.0)
    return out


def measure(preset: str, work: Path) -> dict:
    from flows.plan_steps import build_plan
    from pipeline_config.loader import load_config
    config = load_config(preset, settings(work))
    began = time.perf_counter()
    plan = build_plan(config, recalibrate=True, log=lambda line: print(f"  {line}", file=sys.stderr))
    calibration_s = time.perf_counter() - began
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    args = [MCLPIPE, "run", preset, *[a for s in settings(work) for a in ("--set", s)]]
    began = time.perf_counter()
    done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{preset}: mclpipe run failed:\n{done.stderr[-3000:]}")
    measured = task_seconds(work / "prefect")
    steps = [{"step": r.title, "projected": r.seconds, "measured": measured.get(r.title)} for r in plan.rows]
    return {"preset": preset, "calibration_s": calibration_s, "projected_s": plan.total_s, "wall_s": wall,
            "projected_steps_s": plan.total_s - plan.overhead_s, "overhead": plan.overhead,
            "steps_s": sum(s["measured"] or 0.0 for s in steps), "steps": steps,
            "load": [round(x, 1) for x in os.getloadavg()],
            "device": plan.calibration.device if plan.calibration else "?"}


def error(projected: float, measured: float) -> str:
    return f"{100 * (projected - measured) / measured:+.0f} %" if measured else "-"


def report(results: list[dict], *, machine: str, started: str) -> str:
    lines = [f"Measured {started} on {machine}.", "",
             "| preset | load average after the run (1, 5, 15 min) | calibration | projected total (of it: the run's "
             "start, bookkeeping, end) | measured: wall of `mclpipe run` | error | projected steps | measured: steps "
             "(task runs) | error |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        overhead = sum(r.get("overhead", {}).values())
        steps = r.get("projected_steps_s", r["projected_s"])
        lines.append(f"| {r['preset']} | {', '.join(str(x) for x in r.get('load', []))} | {r['calibration_s']:.0f} s "
                     f"| {r['projected_s']:.0f} s ({overhead:.0f} s) | {r['wall_s']:.0f} s | "
                     f"{error(r['projected_s'], r['wall_s'])} | {steps:.0f} s | {r['steps_s']:.0f} s | "
                     f"{error(steps, r['steps_s'])} |")
    return "\n".join(lines) + "\n"


def step_report(result: dict) -> str:
    lines = [f"{result['preset']}:", "", "| step | projected | measured | error |", "|---|---:|---:|---:|"]
    for s in result["steps"]:
        p, m = s["projected"], s["measured"]
        lines.append(f"| {s['step']} | {'-' if p is None else f'{p:.1f} s'} | {'-' if m is None else f'{m:.1f} s'} | "
                     f"{error(p, m) if p is not None and m else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = []
    for preset in [p for p in args.presets.split(",") if p]:
        print(f"{preset}: plan, then run", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix=f"plan-accuracy-{preset}-") as tmp:
            results.append(measure(preset, Path(tmp)))
        print(step_report(results[-1]))
        sys.stdout.flush()
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    print(report(results, machine=machine, started=started))
    if args.json:
        args.json.write_text(json.dumps({"started": started, "machine": machine, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
