"""How close `mclpipe plan`'s per-step projections at 1M come to `make bench-scale`'s measured rows at 1M, from a
calibration at the small end (``python -m bench.plan_scale [--size 100000] [--pipelines clip,image]``; issue 46).

For each pipeline, in a fresh work directory: bench-scale's own data at ``--size`` samples (``bench.scale``'s
shards or image folder, its configs), the plan's calibration on it (``planning.calibrate.calibrate``: a few
batches of each kind of step, what `mclpipe plan` measures on a machine it has not seen), then the plan of the same
config with the data's size scaled to 1,000,000 samples (training samples, exported rows and data bytes times
1M / size; the width as calibrated). Each step row that bench-scale measures at 1M is compared with its row in
BENCHMARKS.md ("`make bench-scale`: data path at M = ..."): export, k-means, pseudo-labels and (CLIP) the re-shard
of stage 0 / for stage 1. Each row includes one task run with its records, as the run probe measures it
(bench-scale times the step's task inside a Prefect flow, its MLflow records included); not the run's start or end.
The preparation is left out: the plan projects a run that finds the data prepared (its calibration times the second
call), bench-scale the first preparation. ``--target N --measured FILE`` compares at N samples with a
``python -m bench.scale --json FILE`` run instead (the same code and day as the calibration). Not part of
`make bench`: minutes of CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
TARGET = 1_000_000
#: bench-scale's step names -> (the plan's category, the title of its first row)
STEPS = {"export": ("export", "export stage 0"), "kmeans": ("cluster", "k-means stage 0"),
         "pseudo_labels": ("pseudo_labels", "pseudo-labels for stage 1"),
         "reshard": ("regroup", "regroup batches for stage 1 (MCL)")}


def seconds_of(text: str) -> float:
    """'8.9 min' / '276.4 s' / '1.2 h' -> seconds."""
    value, unit = text.strip().split()
    return float(value.replace(",", "")) * {"s": 1, "min": 60, "h": 3600}[unit]


def measured_in_json(path: Path, *, target: int) -> dict[tuple[str, str], float]:
    """{(pipeline, step): seconds} at ``target`` samples from a ``bench.scale --json`` file."""
    saved = json.loads(Path(path).read_text())
    return {(r["pipeline"], r["step"]): r["seconds"] for r in saved["results"]
            if r["size"] == target and r["status"] == "ok" and r["seconds"] is not None}


def measured_at_target(markdown: str) -> dict[tuple[str, str], float]:
    """{(pipeline, step): seconds} of the bench-scale rows at 1,000,000 in BENCHMARKS.md (the table's rows read
    ``| clip | export | 1,000,000 | 8.9 min | ...``)."""
    rows = {}
    for line in markdown.splitlines():
        match = re.match(r"\|\s*(clip|image)\s*\|\s*(\w+)\s*\|\s*1,000,000\s*\|\s*([\d.,]+ (?:s|min|h))\s*\|", line)
        if match:
            rows[(match[1], match[2])] = seconds_of(match[3])
    return rows


def projected_at_target(pipeline: str, work: Path, *, target: int, run_costs) -> tuple[dict[str, float], dict]:
    """{bench-scale step: projected seconds at 1M} from a calibration on the data in ``work``, and the
    calibration's facts (its size, seconds, each rate's basis)."""
    from bench import scale
    from flows.plan_steps import planned_steps
    from planning import model as P
    from planning.calibrate import calibrate

    config = scale.config_for(pipeline, work)
    calibration = calibrate(config, log=lambda line: print(f"  {line}", flush=True))
    ratio = target / calibration.num_train
    exported = calibration.num_exported or calibration.num_train  # a partial export knows its rows per second only
    size = P.DataSize(num_train=target, num_exported=round(exported * ratio),
                      dim=calibration.dim, data_bytes=round((calibration.data_bytes or 0) * ratio) or None)
    plan = P.estimate(config, planned_steps(config), calibration=calibration, size=size, run_costs=run_costs)
    rows = {row.title: row for row in plan.rows}
    projected = {step: rows[title].seconds for step, (_, title) in STEPS.items() if title in rows}
    facts = {"num_train": calibration.num_train, "calibration_s": round(calibration.seconds, 1),
             "basis": {step: rows[title].basis for step, (_, title) in STEPS.items() if title in rows}}
    return projected, facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000, help="samples of the calibration's data (the small end)")
    parser.add_argument("--pipelines", default="clip,image")
    parser.add_argument("--target", type=int, default=TARGET, help="samples the plan projects to")
    parser.add_argument("--measured", type=Path, help="a bench.scale --json file measured at --target (default: "
                                                          "BENCHMARKS.md's rows at 1M)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    from bench import scale
    from flows.run_costs import measure_run_costs
    if args.measured is not None:
        measured = measured_in_json(args.measured, target=args.target)
    elif args.target == TARGET:
        measured = measured_at_target(BENCHMARKS.read_text())
    else:
        parser.error("--target other than 1,000,000 needs --measured")
    report = {"size": args.size, "target": args.target, "rows": [],
              "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for pipeline in args.pipelines.split(","):
        with tempfile.TemporaryDirectory(prefix=f"plan-scale-{pipeline}-") as tmp:
            work = Path(tmp)
            began = time.perf_counter()
            scale.write_data(pipeline, work, size=args.size)
            print(f"{pipeline}: {args.size:,} samples written in {time.perf_counter() - began:.0f} s", flush=True)
            if "run_costs" not in report:  # once: a task run's cost does not depend on the pipeline
                costs = measure_run_costs(scale.config_for(pipeline, work),
                                          log=lambda line: print(f"  {line}", flush=True))
                report["run_costs"] = {"task_s": costs.task_s}
            projected, facts = projected_at_target(pipeline, work, target=args.target, run_costs=costs)
        for step, seconds in projected.items():
            actual = measured.get((pipeline, step))
            error = None if actual is None or seconds is None else (seconds - actual) / actual
            report["rows"].append({"pipeline": pipeline, "step": step, "projected_s": seconds, "measured_s": actual,
                                   "error": error, "calibrated_on": facts["num_train"],
                                   "basis": facts["basis"].get(step, "")})
        report.setdefault("calibration_s", {})[pipeline] = facts["calibration_s"]
    report["load_average"] = os.getloadavg()
    source = args.measured or "BENCHMARKS.md"
    print(f"\n| pipeline | step | calibrated on | projected at {args.target:,} | measured at {args.target:,} "
          f"({source}) | error |")
    print("|---|---|---:|---:|---:|---:|")
    for row in report["rows"]:
        error = "-" if row["error"] is None else f"{row['error']:+.0%}"
        fmt = (lambda s: "-" if s is None else f"{s:,.1f} s")
        print(f"| {row['pipeline']} | {row['step']} | {row['calibrated_on']:,} | {fmt(row['projected_s'])} | "
              f"{fmt(row['measured_s'])} | {error} |")
    print(f"\nload average after: {', '.join(f'{v:.1f}' for v in report['load_average'])}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
