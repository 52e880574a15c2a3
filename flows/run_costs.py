"""What ``mclpipe run`` pays besides its steps' computation on this machine, measured by the run probe
(``flows.run_probe``) in a process of its own: the start (imports, the temporary Prefect server, the MLflow store),
a task run with a step's records, the end. It runs the flows' own machinery, so it lives here, above ``planning``,
which only reads the cached result (``planning.model.cached_run_costs``). The probe is started by its module's name
so that importing this module imports none of the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from contrastive.errors import MclpipeError
from planning.model import RunCosts, run_costs_from_marks, run_costs_path
from planning.probes import machine_id

#: Seconds the run probe may take before the plan gives up on it (it takes 10-30 s on 2 busy cores).
PROBE_TIMEOUT_S = 300


def measure_run_costs(config, *, log: Callable[[str], None] = print) -> RunCosts:
    """The run probe (``flows.run_probe``) in a process of its own with a throwaway PREFECT_HOME and MLflow store,
    timed from its spawn to its exit; cached for this machine (``planning.model.run_costs_path``)."""
    log("calibrating: a run's start, task runs and end (the run probe: a temporary Prefect server, an MLflow store)")
    root = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="mclpipe-run-probe-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        env.pop("PREFECT_API_URL", None)  # the run's own temporary server, never a server of the user's
        spawned = time.time()
        try:
            done = subprocess.run([sys.executable, "-m", "flows.run_probe", str(work / "marks.json"), str(work)],
                                  env=env, cwd=tmp, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise MclpipeError(f"the plan's run probe took over {PROBE_TIMEOUT_S} s (python -m flows.run_probe): "
                               "is the machine overloaded? `mclpipe plan` again when it is not") from exc
        exited = time.time()
        if done.returncode != 0:
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
            raise MclpipeError(f"the plan's run probe (python -m flows.run_probe) failed: {tail[0]}; a `mclpipe run` "
                               "would fail the same way: fix that first")
        marks = json.loads((work / "marks.json").read_text())
    start_s, task_s, end_s = run_costs_from_marks(marks, spawned=spawned, exited=exited)
    costs = RunCosts(machine=machine_id(), measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     start_s=start_s, task_s=task_s, end_s=end_s, tasks=len(marks["tasks"]))
    path = run_costs_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(costs.to_json())
    return costs
