"""The CLI as a user runs it: a real `mclpipe run` (temporary local Prefect server, MLflow on sqlite), the cache
on a second run, and one-line errors for user mistakes."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

MCLPIPE = str(Path(sys.executable).with_name("mclpipe"))


def mclpipe(tmp_path: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "COLUMNS": "200"}
    env.pop("PREFECT_API_URL", None)  # a real user run: its own temporary local server, not the test harness
    return subprocess.run([MCLPIPE, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def tiny_args(tmp_path: Path) -> list[str]:
    return ["trifeature_tiny", "--set", f"output_dir={tmp_path / 'runs'}", "--set",
            f"data.cache_dir={tmp_path / 'data'}", "--set", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]


#: a training stage's progress (the progress bar off a terminal), not counted among the lines a run prints
PROGRESS = re.compile(r": step \d+/\d+ |: trained \d+ steps in |: stopped at step ")


def test_run_then_rerun_hits_the_cache(tmp_path):
    first = mclpipe(tmp_path, "run", *tiny_args(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    for row in ("stage 0", "stage 2", "MCL concat", "control concat", "mlflow ui --backend-store-uri"):
        assert row in first.stdout, row
    # A first run explains itself in a screenful: tables, one line reading them, links; Prefect's and MLflow's
    # INFO lines go to the log file named last (issue 45).
    printed = [line for line in (first.stdout + first.stderr).splitlines() if not PROGRESS.search(line)]
    assert len(printed) <= 40, "\n".join(printed)
    assert not [line for line in printed if " INFO " in line or "Finished in state" in line], "\n".join(printed)
    table_lines = [line for line in first.stdout.splitlines() if line.startswith(("representation", "─"))
                   or re.match(r"(stage \d|MCL concat|control concat)\s+\d\.\d{3}\s", line)]
    assert len(table_lines) >= 14 and max(len(line) for line in table_lines) <= 80, "\n".join(table_lines)
    log_file = Path(first.stdout.strip().splitlines()[-1].split("full log: ", 1)[1].split(" (")[0])
    assert "Finished in state Completed()" in log_file.read_text()
    assert (tmp_path / "mlflow.db").exists()
    summary_dirs = list((tmp_path / "runs" / "pipelines").iterdir())
    assert len(summary_dirs) == 1 and (summary_dirs[0] / "probe_accuracy.png").stat().st_size > 1000

    second = mclpipe(tmp_path, "--verbose", "run", *tiny_args(tmp_path))  # Prefect's task states on the console
    assert second.returncode == 0, second.stderr[-3000:]
    log = second.stdout + second.stderr
    assert log.count("Task run 'train stage") >= 5 and "training stage" not in log  # every stage came from the cache
    assert "Cached" in log

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mclpipe")
    parents = client.search_runs([experiment.experiment_id], "tags.kind = 'pipeline'")
    assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents)

    # `mclpipe resume <id prefix>` with a new config for the last stage: only stage 2 (MCL and control) retrains.
    pipeline_id = summary_dirs[0].name
    third = mclpipe(tmp_path, "--verbose", "resume", pipeline_id[:6], "--rerun-from", "2",
                    "--set", "stage_overrides.2.train.epochs=2")
    assert third.returncode == 0, third.stderr[-3000:]
    log = third.stdout + third.stderr
    assert log.count("training stage 2") == 2 and "training stage 0" not in log and "training stage 1" not in log
    assert len(list((tmp_path / "runs" / "pipelines").iterdir())) == 2  # a new pipeline id beside the old one
    missing = mclpipe(tmp_path, "resume", "ffffffff")
    assert missing.returncode == 2 and "no pipeline matching 'ffffffff'" in missing.stderr


@pytest.mark.parametrize("extra, message", [
    (["--set", "train.epoch=3"], "train.epoch: unknown key"),
    (["--set", "mcl.clusters=[100, 100]"], "prod(K) <= M/b"),
    (["--set", "data.kind=image_folder", "--set", "data.image_folder.source=/no/such/dir"], "/no/such/dir"),
])
def test_user_mistakes_end_in_one_line(tmp_path, extra, message):
    result = mclpipe(tmp_path, "run", *tiny_args(tmp_path), *extra)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and message in error_lines[0], result.stderr[-2000:]


def test_unknown_config_file(tmp_path):
    result = mclpipe(tmp_path, "run", "nope.yaml")
    assert result.returncode == 2 and "presets" in result.stderr and "Traceback" not in result.stderr
