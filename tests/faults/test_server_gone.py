"""The run's temporary Prefect server SIGKILLed mid-stage (as the OOM killer would): the CLI ends in one line that
says what happened and the command that continues, no traceback; the command resumes and finishes with the same
results as a run that was not disturbed. Slow: three CLI runs, each with its own Prefect server."""
import json
import shlex
import signal
import subprocess

import pytest

from tests.faults.cli_process import MCLPIPE, checkpoint_of, cli_env, one_line, start, tiny_run_args

pytestmark = pytest.mark.slow
EPOCHS = "train.epochs=4"


@pytest.mark.timeout(2400)
def test_a_killed_prefect_server_ends_in_one_line_and_the_printed_command_resumes(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    finished = subprocess.run([MCLPIPE, *tiny_run_args(reference, EPOCHS)], cwd=reference, env=cli_env(reference),
                              capture_output=True, text=True, timeout=1200)
    assert finished.returncode == 0, finished.stderr[-3000:]

    workdir = tmp_path / "killed"
    cli = start(workdir, tiny_run_args(workdir, EPOCHS))
    cli.wait_for(lambda: checkpoint_of(workdir, "train1") is not None, timeout=900, what="a checkpoint of stage 1")
    cli.server().send_signal(signal.SIGKILL)
    code, _ = cli.wait(timeout=900)
    assert code == 2, cli.output[-3000:]
    line = one_line(cli.output, "error:")
    assert "the Prefect server" in line and "stopped answering mid-run" in line and "Continue with: mclpipe" in line
    assert "Traceback" not in cli.output, cli.output[cli.output.find("Traceback") - 500:][:4000]
    assert "stopped answering" in (workdir / "runs" / "last-stop.txt").read_text()

    resume = shlex.split(line.split("Continue with: ", 1)[1])
    resumed = subprocess.run([MCLPIPE, *resume[1:]], cwd=workdir, env=cli_env(workdir), capture_output=True,
                             text=True, timeout=1200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = [json.loads(next((d / "runs" / "pipelines").glob("*/summary.json")).read_text())["results"]
               for d in (reference, workdir)]
    assert results[0] == results[1]
