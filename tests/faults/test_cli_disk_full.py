"""The real `mclpipe run` with output_dir on a 1.5 MB tmpfs (issue 19): it stops with one line naming the directory
that filled up and what was being written, no traceback; the steps that finished are intact; after the filesystem
grows, the same command finishes without recomputing them. Slow: it starts the CLI's Prefect server twice."""
import json
import subprocess

import pytest

from tests.faults.cli_process import ANSI, MCLPIPE, cli_env, one_line
from tests.faults.conftest import resize_tmpfs

pytestmark = pytest.mark.slow


def finished_steps(steps) -> dict[str, float]:
    """{step directory: mtime of its record.json} for every finished step."""
    return {p.parent.name: p.stat().st_mtime for p in steps.glob("*/record.json")}


@pytest.mark.timeout(1800)  # two CLI runs, each starting its own Prefect server
def test_a_full_output_disk_ends_in_one_line_and_a_rerun_after_freeing_space_resumes(tmp_path, small_tmpfs):
    args = ["run", "trifeature_tiny", "--set", f"output_dir={small_tmpfs / 'runs'}", "--set",
            f"data.cache_dir={tmp_path / 'data'}", "--set", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    full = subprocess.run([MCLPIPE, *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True,
                          timeout=1500)
    output = ANSI.sub("", full.stdout + full.stderr)
    assert full.returncode == 2, output[-3000:]
    line = one_line(output, "error:")
    assert line.startswith(f"error: disk full: no space left in {small_tmpfs}/") and "while writing" in line
    assert "Free space there" in line and "rerun the same command" in line
    # (Prefect may warn that it could not cache a result there; that is one log line, not a raw error)
    assert "Traceback" not in output and "OSError: [Errno 28]" not in output, output[output.find("Traceback") - 2000:]
    steps = small_tmpfs / "runs" / "steps"
    before = finished_steps(steps)
    assert before, "the disk filled up before any step finished: the test config needs a larger tmpfs"
    for record in steps.glob("*/record.json"):
        json.loads(record.read_text())  # every finished step's record is whole

    resize_tmpfs(small_tmpfs, size="64m")
    rerun = subprocess.run([MCLPIPE, *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True,
                           timeout=1500)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = finished_steps(steps)
    assert {name: after[name] for name in before} == before  # reused, not recomputed
    assert len(after) > len(before)
