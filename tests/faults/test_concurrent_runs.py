"""Two pipelines started at once in a fresh directory (issue 19): the local stores (MLflow's sqlite schema, Prefect's
database) are created once without a race, and steps the pipelines share are computed once (a lock per step
directory: the second run waits, then reuses the first one's result)."""
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.locks import lock_path, step_lock
from tests.faults.cli_process import MCLPIPE, cli_env, tiny_run_args


def test_a_step_lock_makes_the_second_holder_wait_and_says_so(tmp_path):
    out_dir = tmp_path / "steps" / "train0-abc"
    order, messages, holding = [], [], threading.Event()

    def first():
        with step_lock(out_dir):
            holding.set()
            time.sleep(0.5)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    holding.wait(timeout=10)
    with step_lock(out_dir, on_wait=messages.append):
        order.append("second in")
    thread.join()
    assert order == ["first done", "second in"]
    assert len(messages) == 1 and "train0-abc" in messages[0] and "reused" in messages[0]
    assert lock_path(out_dir) == tmp_path / "steps" / ".locks" / "train0-abc.lock"
    with step_lock(out_dir, on_wait=messages.append):  # free again: no waiting, no message
        pass
    assert len(messages) == 1


OPEN_TRACKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    while not Path(sys.argv[2]).exists():  # start together
        time.sleep(0.01)
    from tasks.tracking import Tracker
    tracker = Tracker(uri=sys.argv[1], experiment="mclpipe")
    print(tracker.experiment_id)
""")


@pytest.mark.slow
def test_processes_opening_a_fresh_mlflow_store_together_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    go = tmp_path / "go"
    root = str(Path(__file__).resolve().parents[2])
    processes = [subprocess.Popen([sys.executable, "-c", OPEN_TRACKER, uri, str(go)], cwd=root, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    time.sleep(5)  # every process has imported mlflow and waits at the start line
    go.touch()
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in processes]
    for code, _, stderr in results:
        assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert len({stdout.strip() for _, stdout, _ in results}) == 1  # one experiment, found by all
    assert len(MlflowClient(tracking_uri=uri).search_experiments()) == 1


def training_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "training stage" in line]


@pytest.mark.slow
@pytest.mark.timeout(2400)  # two pipelines at once on a 2-core machine, then a third run
@pytest.mark.parametrize("shared", [True, False], ids=["shared steps", "no shared steps"])
def test_two_runs_started_together_in_a_fresh_directory(tmp_path, shared):
    second_seed = "seed=0" if shared else "seed=1"
    commands = [tiny_run_args(tmp_path, "seed=0"), tiny_run_args(tmp_path, second_seed)]
    env = cli_env(tmp_path)
    runs = [subprocess.Popen([MCLPIPE, *args], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT) for args in commands]
    logs = [run.communicate(timeout=1500)[0] for run in runs]
    for run, log in zip(runs, logs):
        assert run.returncode == 0, log[-4000:]
        assert "Traceback" not in log and "duplicate column" not in log, log[-4000:]
    trained = [line for log in logs for line in training_lines(log)]
    # 3 MCL stages + 2 control stages per pipeline: trained once each when the pipelines are the same.
    assert len(trained) == (5 if shared else 10), trained
    summaries = sorted((tmp_path / "runs" / "pipelines").glob("*/summary.json"))
    assert len(summaries) == (1 if shared else 2)
    if shared:
        assert any("waiting for another mclpipe run" in log for log in logs)
        reference = subprocess.run([MCLPIPE, *commands[0]], cwd=tmp_path, env=env, capture_output=True, text=True,
                                   timeout=1500)
        assert reference.returncode == 0 and not training_lines(reference.stdout + reference.stderr)
    for summary in summaries:
        assert json.loads(summary.read_text())["results"]["MCL concat"]
