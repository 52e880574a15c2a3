"""Stopping the real `mclpipe run` the way people do (issue 19): Ctrl-C typed in a terminal, SIGTERM from a
scheduler, SIGKILL. Each checks the exit status and time, the one line the CLI prints, the final states Prefect
recorded, that no process of the run is left, and (Ctrl-C) that the printed resume command ends equal to an
uninterrupted run. Slow: every test starts the CLI's own temporary Prefect server."""
import json
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.faults.cli_process import (MCLPIPE, MID_STAGE_EPOCHS, MID_STAGE_STEPS, checkpoint_of, cli_env, gone,
                                      one_line, prefect_states, start, tiny_run_args)

pytestmark = pytest.mark.slow
EPOCHS = MID_STAGE_EPOCHS
STARTUP = 600  # seconds for the CLI to reach training on a loaded 2-core machine


def model_weights(steps: Path) -> dict[str, dict]:
    return {p.parent.parent.name: torch.load(p, weights_only=True)["state_dict"]
            for p in sorted(steps.glob("train*/model/model.pt"))}


@pytest.mark.timeout(1800)  # three CLI runs, each starting its own Prefect server
def test_ctrl_c_in_a_terminal_stops_cleanly_and_the_printed_command_resumes(tmp_path):
    reference = tmp_path / "reference"
    reference.mkdir()
    finished = subprocess.run([MCLPIPE, *tiny_run_args(reference, EPOCHS)], cwd=reference, env=cli_env(reference),
                              capture_output=True, text=True, timeout=STARTUP + 600)
    assert finished.returncode == 0, finished.stderr[-3000:]

    workdir = tmp_path / "stopped"
    cli = start(workdir, tiny_run_args(workdir, EPOCHS), terminal=True)
    cli.wait_for(lambda: checkpoint_of(workdir, "train1") is not None, timeout=STARTUP + 300,
                 what="a checkpoint of stage 1")
    server = cli.server()
    assert server is not None
    processes = [server, *cli.descendants()]
    cli.type_ctrl_c()
    code, seconds = cli.wait(timeout=120)

    assert code == 130, cli.output[-3000:]
    assert seconds < 30
    line = one_line(cli.output, "interrupted:")
    assert "stopped by Ctrl-C (SIGINT) during the train step of stage 1 after step" in line
    checkpoint = checkpoint_of(workdir, "train1")
    assert f"checkpoint kept at {checkpoint}" in line
    assert "Traceback" not in cli.output and "httpx" not in cli.output
    assert gone(processes, timeout=10) == []  # the temporary Prefect server went with the CLI
    states = prefect_states(workdir)
    assert [state for _, state in states["flow_runs"]] == ["CRASHED"]
    assert sum(state == "CRASHED" for name, state in states["task_runs"] if name.startswith("train stage")) == 1
    stopped_at = torch.load(checkpoint, weights_only=True)["step"]
    assert 0 < stopped_at < MID_STAGE_STEPS  # mid-stage

    resume = shlex.split(line.split("Resume with: ", 1)[1])
    assert resume[:2] == ["mclpipe", "resume"]
    resumed = subprocess.run([MCLPIPE, *resume[1:]], cwd=workdir, env=cli_env(workdir), capture_output=True,
                             text=True, timeout=STARTUP + 600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((checkpoint.parent.parent / "train_summary.json").read_text())
    uninterrupted = json.loads((reference / "runs" / "steps" / checkpoint.parent.parent.name /
                                "train_summary.json").read_text())
    assert summary["resumed_from_step"] == stopped_at and summary["steps"] == uninterrupted["steps"]

    expected, got = model_weights(reference / "runs" / "steps"), model_weights(workdir / "runs" / "steps")
    assert sorted(got) == sorted(expected) and len(got) == 5  # 3 MCL stages + 2 control stages
    for step_dir, weights in expected.items():
        for name, value in weights.items():
            assert torch.allclose(got[step_dir][name].float(), value.float(), atol=1e-5), (step_dir, name)
    results = [json.loads(next((d / "runs" / "pipelines").glob("*/summary.json")).read_text())["results"]
               for d in (reference, workdir)]
    assert results[0] == results[1]  # bit-identical weights give the same table


def test_sigterm_writes_a_checkpoint_records_crashed_and_leaves_no_server(tmp_path):
    cli = start(tmp_path, tiny_run_args(tmp_path, EPOCHS))
    cli.wait_for(lambda: checkpoint_of(tmp_path, "train0") is not None, timeout=STARTUP,
                 what="a checkpoint of stage 0")
    processes = [cli.server(), *cli.descendants()]
    cli.process.send_signal(signal.SIGTERM)
    code, seconds = cli.wait(timeout=120)

    assert code == 143, cli.output[-3000:]
    assert seconds < 30
    line = one_line(cli.output, "interrupted:")
    checkpoint = checkpoint_of(tmp_path, "train0")
    assert f"stopped by SIGTERM during the train step of stage 0 after step" in line
    step = int(line.split("after step ", 1)[1].split(";", 1)[0])
    assert torch.load(checkpoint, weights_only=True)["step"] == step  # the step in progress was kept
    assert "Resume with: mclpipe resume" in line and "Traceback" not in cli.output
    assert gone([p for p in processes if p is not None], timeout=10) == []
    assert [state for _, state in prefect_states(tmp_path)["flow_runs"]] == ["CRASHED"]


def test_sigkill_of_the_cli_takes_its_prefect_server_down_too(tmp_path):
    cli = start(tmp_path, tiny_run_args(tmp_path, EPOCHS))
    cli.wait_for(lambda: "Beginning flow run" in cli.output, timeout=STARTUP, what="the flow run")
    server = cli.server()
    assert server is not None and server.is_running()
    cli.process.kill()
    cli.wait(timeout=30)
    started = time.time()
    assert gone([server], timeout=10) == [], "the temporary Prefect server outlived a SIGKILLed CLI"
    print(f"server gone {time.time() - started:.2f} s after the CLI was killed")
