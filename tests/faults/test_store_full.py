"""The default stores (mlflow.db and .prefect/ in the working directory) on a 6 MB tmpfs, as a new user's laptop
partition fills: `mclpipe run` ends in one line naming the directory, exit 2, no traceback (MLflow's and Prefect's
stores say "database or disk is full" without an OSError); after the filesystem grows, the same command finishes and
what had finished (the prepared data set, the pipeline's id) is reused. The pipeline's outputs (runs/) are on a disk
of their own: with them on the small disk too, whichever writer met the full disk first named it (a CI run hit it
while writing runs/, test_cli_disk_full's case). Slow: two CLI runs, each with its own Prefect server."""
import re
import subprocess

import pytest

from tests.faults.cli_process import ANSI, MCLPIPE, cli_env, one_line
from tests.faults.conftest import resize_tmpfs

pytestmark = pytest.mark.slow


@pytest.fixture
def six_mb(tmpfs):
    return tmpfs("6m")


@pytest.mark.timeout(1800)
def test_a_full_tracking_store_ends_in_one_line_and_the_rerun_finishes(six_mb, tmp_path):
    env = {**cli_env(six_mb), "PREFECT_HOME": str(six_mb / ".prefect")}  # the default stores: in the cwd
    env.pop("MLFLOW_TRACKING_URI", None)
    runs = tmp_path / "runs"
    command = [MCLPIPE, "run", "trifeature_tiny", "--set", f"output_dir={runs}"]
    full = subprocess.run(command, cwd=six_mb, env=env, capture_output=True, text=True, timeout=900)
    output = ANSI.sub("", full.stdout + full.stderr)
    assert full.returncode == 2, output[-3000:]
    line = one_line(output, "error:")
    assert line.startswith(f"error: disk full: no space left in {six_mb}") and "rerun the same command" in line
    # a tracking store's write is what failed (a step's output on a full disk is test_cli_disk_full's case), and the
    # stores are what filled the disk
    assert re.search(r"while writing (MLflow's records|the MLflow store|the temporary Prefect server's database)",
                     line), line
    stores = _size(six_mb / ".prefect") + sum(_size(path) for path in six_mb.glob("mlflow.db*"))
    assert stores > 0.6 * _size(six_mb), {path.name: _size(path) for path in six_mb.iterdir()}
    assert "Traceback" not in output, output[output.find("Traceback") - 1500:][:4000]
    last = runs / "last-stop.txt"
    assert last.exists() and line in last.read_text()
    prepared = _identities(six_mb / "data")
    assert prepared and len(list((runs / "pipelines").iterdir())) == 1

    resize_tmpfs(six_mb, size="256m")
    rerun = subprocess.run(command, cwd=six_mb, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "finished" in last.read_text()
    # the data set prepared before the disk filled is read again, not written anew; the same pipeline continues
    assert _identities(six_mb / "data") == prepared
    assert len(list((runs / "pipelines").iterdir())) == 1


def _size(path) -> int:
    """Bytes under ``path`` (a file or a directory)."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _identities(directory) -> dict:
    """{file: (inode, mtime_ns)} under ``directory``: a file written again gets a new inode or mtime."""
    return {str(p.relative_to(directory)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}
