"""What the CLI says when it is stopped (flows.shutdown) and how its temporary Prefect server follows its parent out
(flows.local_server), without starting Prefect: fast."""
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from contrastive.errors import DiskFullError, StageInterrupted
from flows import shutdown

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tiny_config):
    return tiny_config()


def test_resume_command_once_the_pipeline_config_is_saved(config, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mclpipe", "run", "trifeature_tiny", "--set", "train.epochs=4"])
    # Before the flow saved its config, the command that was run is the one to repeat.
    assert shutdown.resume_command(config) == "mclpipe run trifeature_tiny --set train.epochs=4"
    saved = Path(config.output_dir) / "pipelines" / config.config_hash()
    saved.mkdir(parents=True)
    (saved / "config.yaml").write_text("name: x\n")
    output_dir = Path(config.output_dir).resolve()
    assert shutdown.resume_command(config) == f"mclpipe resume {config.config_hash()[:12]} --output-dir {output_dir}"
    assert shutdown.resume_command(config, rerun_from=1).endswith(f"--output-dir {output_dir} --rerun-from 1")


def test_interrupted_message_says_what_stopped_what_is_kept_and_how_to_resume(config, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mclpipe", "run", "trifeature_tiny"])
    exc = StageInterrupted(signum=signal.SIGINT, checkpoint="/r/steps/train1-ab/checkpoints/last.pt", step=12)
    exc.what = "the train step of stage 1"
    message = shutdown.interrupted_message(exc, config)
    assert message == (f"stopped by Ctrl-C (SIGINT) during the train step of stage 1 after step 12; checkpoint kept "
                       f"at /r/steps/train1-ab/checkpoints/last.pt; finished steps are kept in "
                       f"{Path(config.output_dir).resolve() / 'steps'}. Resume with: mclpipe run trifeature_tiny")
    assert exc.exit_code == 130 and StageInterrupted(signum=signal.SIGTERM).exit_code == 143
    outside = shutdown.interrupted_message(StageInterrupted(signum=signal.SIGTERM), config)
    assert outside.startswith("stopped by SIGTERM; no training was in progress; finished steps are kept")
    assert shutdown.interrupted_message(StageInterrupted(signum=signal.SIGINT)).endswith("nothing was computed yet")


def test_stage_interrupted_survives_pickling_with_its_fields():
    import pickle
    exc = StageInterrupted(signum=signal.SIGTERM, what="x", checkpoint="/c", step=3)
    copy = pickle.loads(pickle.dumps(exc))
    assert (copy.signum, copy.what, copy.checkpoint, copy.step, str(copy)) == (15, "x", "/c", 3, str(exc))
    assert isinstance(copy, KeyboardInterrupt)  # so no `except Exception` swallows it


def record_of(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed: %s", (exc,),
                                 sys.exc_info())


def test_console_logs_drop_tracebacks_of_explained_errors_only():
    formatter = shutdown._WithoutExplainedTracebacks(logging.Formatter("%(message)s"))
    explained = record_of(DiskFullError("disk full: no space left in /x"))
    assert formatter.format(explained) == "Task run failed: disk full: no space left in /x"
    assert explained.exc_info is not None  # restored for the API log handler
    assert formatter.format(record_of(OSError(28, "No space left on device"))).count("\n") == 0
    bug = formatter.format(record_of(ValueError("a bug")))
    assert "Traceback (most recent call last)" in bug and "ValueError: a bug" in bug


CHILD = textwrap.dedent("""
    import os, sys, threading, time
    from flows import local_server
    if sys.argv[1] == "prctl":
        assert local_server.set_parent_death_signal(15)
    else:  # the watchdog alone
        threading.Thread(target=local_server._watch_parent, args=(os.getppid(),), daemon=True).start()
    print("ready", flush=True)
    time.sleep(120)
""")
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    print(child.pid, flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("guard", ["prctl", "watchdog"])
def test_the_server_process_goes_when_its_parent_is_killed(guard):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, guard], stdout=subprocess.PIPE, text=True,
                              env=env, start_new_session=True)
    child = psutil.Process(int(parent.stdout.readline()))
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    started = time.time()
    _, alive = psutil.wait_procs([child], timeout=10)
    assert alive == [], f"the child outlived its SIGKILLed parent ({guard})"
    assert time.time() - started < 10
