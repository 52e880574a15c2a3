"""The run's temporary Prefect server SIGKILLed mid-stage (as the OOM killer would): by default it is started again
on its port and database and the run finishes with one warning and the results of a run that was not disturbed;
with restarts off (MCLPIPE_PREFECT_SERVER_RESTARTS=0, or a server that keeps dying) the CLI ends in one line that
says what happened and the command that continues, no traceback, and that command finishes with the same results.
Slow: four CLI runs, each with its own Prefect server."""
import json
import shlex
import signal
import subprocess

import pytest

from tests.faults.cli_process import MCLPIPE, checkpoint_of, cli_env, one_line, start, tiny_run_args

pytestmark = pytest.mark.slow
EPOCHS = "train.epochs=4"


def _results(workdir):
    return json.loads(next((workdir / "runs" / "pipelines").glob("*/summary.json")).read_text())["results"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The results of an undisturbed run."""
    workdir = tmp_path_factory.mktemp("reference")
    finished = subprocess.run([MCLPIPE, *tiny_run_args(workdir, EPOCHS)], cwd=workdir, env=cli_env(workdir),
                              capture_output=True, text=True, timeout=1200)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return _results(workdir)


@pytest.mark.timeout(2400)
def test_a_killed_prefect_server_is_started_again_and_the_run_finishes(tmp_path, reference):
    workdir = tmp_path / "killed"
    cli = start(workdir, tiny_run_args(workdir, EPOCHS))
    cli.wait_for(lambda: checkpoint_of(workdir, "train1") is not None, timeout=900, what="a checkpoint of stage 1")
    killed = cli.server()
    killed.send_signal(signal.SIGKILL)
    code, _ = cli.wait(timeout=900)
    assert code == 0, cli.output[-3000:]
    assert "Traceback" not in cli.output, cli.output[cli.output.find("Traceback") - 500:][:4000]
    said = [line for line in cli.output.splitlines() if "Prefect server died" in line]
    assert len(said) == 1 and "killed by signal 9" in said[0] and "the run goes on" in said[0], cli.output[-3000:]
    assert _results(workdir) == reference


@pytest.mark.timeout(2400)
def test_a_killed_prefect_server_ends_in_one_line_and_the_printed_command_resumes(tmp_path, reference, monkeypatch):
    monkeypatch.setenv("MCLPIPE_PREFECT_SERVER_RESTARTS", "0")
    # Each Prefect call on a dead server retries PREFECT_CLIENT_MAX_RETRIES times (5 by default: about a minute a
    # call, three calls here before the run ends); one retry reaches the same line in seconds (docs/operating.md).
    monkeypatch.setenv("PREFECT_CLIENT_MAX_RETRIES", "1")
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
    assert _results(workdir) == reference
