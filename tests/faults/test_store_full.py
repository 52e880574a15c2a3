"""The default layout (mlflow.db, .prefect/ and runs/ in the working directory) on a 6 MB tmpfs, as a new user's
laptop partition fills: `mclpipe run` ends in one line naming the directory, exit 2, no traceback (MLflow's and
Prefect's stores say "database or disk is full" without an OSError); after the filesystem grows, the same command
finishes and what had finished is reused. Slow: two CLI runs, each with its own Prefect server."""
import subprocess

import pytest

from tests.faults.cli_process import ANSI, MCLPIPE, cli_env, one_line
from tests.faults.conftest import resize_tmpfs

pytestmark = pytest.mark.slow


@pytest.fixture
def six_mb(tmpfs):
    return tmpfs("6m")


@pytest.mark.timeout(1800)
def test_a_full_tracking_store_ends_in_one_line_and_the_rerun_finishes(six_mb):
    env = {**cli_env(six_mb), "PREFECT_HOME": str(six_mb / ".prefect")}  # the default: everything in the cwd
    env.pop("MLFLOW_TRACKING_URI", None)
    full = subprocess.run([MCLPIPE, "run", "trifeature_tiny"], cwd=six_mb, env=env, capture_output=True, text=True,
                          timeout=900)
    output = ANSI.sub("", full.stdout + full.stderr)
    assert full.returncode == 2, output[-3000:]
    line = one_line(output, "error:")
    assert line.startswith(f"error: disk full: no space left in {six_mb}") and "rerun the same command" in line
    assert "Traceback" not in output, output[output.find("Traceback") - 1500:][:4000]
    last = six_mb / "runs" / "last-stop.txt"  # written when the full disk still had room for it
    assert not last.exists() or "disk full" in last.read_text()

    resize_tmpfs(six_mb, size="256m")
    rerun = subprocess.run([MCLPIPE, "run", "trifeature_tiny"], cwd=six_mb, env=env, capture_output=True, text=True,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "finished" in (six_mb / "runs" / "last-stop.txt").read_text()
