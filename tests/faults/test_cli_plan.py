"""The real `mclpipe plan` on a preset, as a user types it before a first run (issue 46): it measures this machine
once (the calibration of the config's own steps and the run probe, which starts a temporary Prefect server and an
MLflow store as a run does), prints one row per step of the pipeline, the total that projects `mclpipe run`'s wall
time with the run's start, bookkeeping and end, and what each figure rests on; it computes nothing under
output_dir; a second `plan` reads both caches and measures nothing. Slow: the probe and the calibration take a
minute here."""
import json
import subprocess

import pytest

from flows.plan_steps import planned_steps
from pipeline_config.loader import load_config
from planning.model import calibration_path, run_costs_path
from tests.faults.cli_process import ANSI, MCLPIPE, cli_env

pytestmark = pytest.mark.slow


def plan(tmp_path, *args: str) -> str:
    done = subprocess.run([MCLPIPE, "plan", *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True,
                          text=True, timeout=900)
    output = ANSI.sub("", done.stdout + done.stderr)
    assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return output


@pytest.mark.timeout(1200)
def test_plan_measures_once_prints_every_step_and_a_total_with_the_runs_own_costs(tmp_path):
    sets = [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    args = ["embeddings_tiny", *[arg for value in sets for arg in ("--set", value)]]
    config = load_config("embeddings_tiny", sets)
    first = plan(tmp_path, *args)

    for step in planned_steps(config):  # every step of the pipeline has its row
        assert step.title in first, (step.title, first[-3000:])
    total = next(line for line in first.splitlines() if line.startswith("total "))
    assert "the wall time of `mclpipe run`" in total and "start, bookkeeping and end" in total, total
    assert "time not projected" not in first and "not projected (" not in first
    costs = json.loads(run_costs_path(config).read_text())  # the probe ran: a start of seconds, task runs of less
    assert 0 < costs["task_s"] < costs["start_s"], costs
    assert calibration_path(config).is_file()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()  # nothing of a run

    cached = {p: p.stat().st_mtime_ns for p in (calibration_path(config), run_costs_path(config))}
    second = plan(tmp_path, *args)
    assert {p: p.stat().st_mtime_ns for p in cached} == cached  # read, not measured again
    assert next(line for line in second.splitlines() if line.startswith("total ")) == total
