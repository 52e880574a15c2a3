"""What a run costs besides its steps, measured with the run's own machinery: ``mclpipe plan``'s run probe
(``flows.run_costs.measure_run_costs`` spawns it once per machine for ``mclpipe plan``; issue 46).

``python -m flows.run_probe OUT_JSON WORK_DIR`` is a process that does what ``mclpipe run`` does around its steps,
with nothing to compute: the CLI's imports (``flows.cli``, ``flows.pipeline``, ``tasks.steps``: Prefect, MLflow,
torch), the temporary Prefect server (``flows.local_server.starting_local_server``, in the PREFECT_HOME the parent
gives it), a fresh MLflow sqlite store under WORK_DIR (its migrations), then one flow run of ``TASKS`` task runs,
each what a step records around its computation: an MLflow run opened, a batch of metrics, an artifact, the run
closed. It writes wall-clock marks (``time.time()``) to OUT_JSON: ``cli_imported``, ``ready`` (server up, store made),
``tasks`` (each task call's start and end, as the flow sees it), ``flow_end``; the parent adds the spawn and the exit.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

#: Task runs the probe's flow makes: their mean is a step's fixed cost, the first one's imports included (a run's
#: first step pays those too).
TASKS = 6
#: Metrics a probe task logs at once (a stage's record logs a batch of this order: losses, seconds, counts).
METRICS = 20


def main(argv: list[str]) -> int:
    out, work = Path(argv[0]), Path(argv[1])
    marks: dict = {}
    import flows.cli  # noqa: F401 - the CLI's module, as `mclpipe run` imports it before anything else
    from flows.local_server import starting_local_server
    marks["cli_imported"] = time.time()
    with starting_local_server():  # in flows.cli.run_pipeline's order: the server's start overlaps the imports
        import flows.pipeline  # noqa: F401 - the steps' imports (Prefect, MLflow, torch)
        from tasks.tracking.client import Tracker
        tracker = Tracker(uri=f"sqlite:///{work / 'mlflow.db'}", experiment="mclpipe-plan-probe",
                          artifact_root=work / "mlartifacts")
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    marks["ready"] = time.time()
    artifact = work / "record.json"
    artifact.write_text(json.dumps({"metric": list(range(256))}))
    spans: list[list[float]] = []

    @task(name="probe-step", cache_policy=NO_CACHE)
    def probe_step(index: int) -> None:
        run_id = tracker.start_run(name=f"probe {index}", tags={"mclpipe.probe": "1"})
        tracker.log_metrics(run_id, {f"probe/m{j}": float(j) for j in range(METRICS)})
        tracker.log_artifact(run_id, artifact, artifact_path="probe")
        tracker.end_run(run_id)

    @flow(name="mclpipe-plan-probe")
    def probe_flow() -> None:
        for index in range(TASKS):  # timed from the flow's side: the task run's creation and states included
            began = time.time()
            probe_step(index=index)
            spans.append([began, time.time()])

    marks["flow_called"] = time.time()
    probe_flow()
    marks["flow_end"] = time.time()
    marks["tasks"] = spans
    out.write_text(json.dumps(marks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
