"""A tiny pipeline deployed to a process work pool of the team stack (tests/e2e/stack.py) and a real
`prefect worker start --pool <pool> --type process` executing its flow runs, as docs/operating.md tells a team to
run it, signed in to both servers with the credentials of the stack's .env (PREFECT_API_AUTH_STRING,
MLFLOW_TRACKING_USERNAME/PASSWORD in its environment): for the retry test (tests/e2e/test_worker_retry.py) and the
browser's custom run (test_ui_deployment.py).

The worker is a subprocess with the stack's environment; it and every process it started (the flow runs'
processes) are ended by their ids when the fixture ends, however the test ended.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.e2e.stack import BIN, REPO, Stack, tiny_run_args

POOL = "cpu-pool"
PIPELINE = "worker_tiny"  # the config's name: the deployment's name and the registered model's
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def api(stack: Stack, path: str, body: dict | None = None, *, method: str | None = None):
    """One call to the stack's Prefect REST API (what the UI calls); JSON in, JSON out."""
    data = None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}).encode()
    request = urllib.request.Request(f"{stack.prefect_url}/api{path}", data=data, method=method or "POST",
                                     headers={"Content-Type": "application/json", **stack.prefect_headers()})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def flow_run(stack: Stack, flow_run_id: str) -> dict:
    return api(stack, f"/flow_runs/{flow_run_id}", method="GET")


def wait_for_state(stack: Stack, flow_run_id: str, states: set[str], *, seconds: float, log: Path,
                   leaving: dict | None = None) -> dict:
    """Poll the flow run until its state type is one of ``states``; fail with the worker's log otherwise.
    ``leaving``: the run as it was before an action that changes its state (a Retry pressed in the browser, whose
    request reaches the server a moment after the click): its state counts neither as reached nor as final."""
    deadline = time.time() + seconds
    run = flow_run(stack, flow_run_id)
    while time.time() < deadline:
        run = flow_run(stack, flow_run_id)
        unchanged = leaving is not None and run["state"]["id"] == leaving["state"]["id"]
        if run["state_type"] in states and not unchanged:
            return run
        if run["state_type"] in TERMINAL and not unchanged:
            break
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} is {run['state_type']} ({run['state']['message']}), expected "
                         f"{sorted(states)}; worker log:\n{log.read_text()[-6000:]}")


def worker_run_args(stack: Stack, *extra: str) -> list[str]:
    """The tiny two-stage pipeline of the stack tests, under its own name, experiment and output directory (so it
    never mixes with `mclpipe run`'s pipeline on the same stack)."""
    return tiny_run_args(stack.root, f"name={PIPELINE}", "tracking.experiment=mclpipe-worker",
                         f"output_dir={stack.root / 'worker-runs'}", *extra)


@dataclass
class WorkerDeployment:
    stack: Stack
    deployment_id: str
    pool: str
    log: Path
    output_dir: Path

    def create_flow_run(self, parameters: dict | None = None) -> str:
        """What "Run > Quick run" does: a flow run of the deployment, scheduled now, for the pool's worker."""
        body = {"parameters": parameters} if parameters else {}
        return api(self.stack, f"/deployments/{self.deployment_id}/create_flow_run", body)["id"]

    def wait(self, flow_run_id: str, states: set[str], *, seconds: float = 900, leaving: dict | None = None) -> dict:
        return wait_for_state(self.stack, flow_run_id, states, seconds=seconds, log=self.log, leaving=leaving)


def prefect_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(BIN / "prefect"), *args], cwd=stack.root, env=stack.env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def end_process_tree(process: subprocess.Popen, *, kill: bool = False) -> list[int]:
    """SIGTERM the worker and every process it started (by their ids), SIGKILL what is left after 30 s; with
    ``kill``, SIGKILL them all at once, as a lost node does. Returns the ids."""
    try:
        tree = [process.pid, *(child.pid for child in psutil.Process(process.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        tree = []
    procs = []
    for pid in tree:
        try:
            proc = psutil.Process(pid)
            proc.kill() if kill else proc.terminate()
            procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=30)
    for proc in alive:
        proc.kill()
    process.wait(timeout=30)
    return tree


def wait_until_ready(stack: Stack, deployment_id: str, *, worker: subprocess.Popen, log: Path,
                     seconds: float = 180) -> None:
    """A deployment is Ready once a worker polls its work queue (the UI shows "Not Ready" before)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited ({worker.returncode}): {log.read_text()[-3000:]}")
        if api(stack, f"/deployments/{deployment_id}", method="GET")["status"] == "READY":
            return
        time.sleep(1)
    raise RuntimeError(f"no worker polled the deployment within {seconds:.0f} s: {log.read_text()[-3000:]}")


@contextmanager
def worker_deployment(stack: Stack, *extra: str):
    """A process work pool, the tiny pipeline deployed to it from this checkout (`mclpipe deploy --source`), and a
    real worker polling it every second; yields a WorkerDeployment."""
    prefect_cli(stack, "work-pool", "create", POOL, "--type", "process")
    result = stack.mclpipe("deploy", *worker_run_args(stack, *extra), "--work-pool", POOL, "--source", str(REPO),
                           timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    [deployment] = api(stack, "/deployments/filter", {"deployments": {"name": {"any_": [PIPELINE]}}})
    log_path = stack.root / "worker.log"
    log = open(log_path, "w")
    # the worker asks for scheduled runs every second (default 10 s), so a retried run starts at once
    env = {**stack.env(), "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--type", "process"],
                              cwd=stack.root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(stack, deployment["id"], worker=worker, log=log_path)
        yield WorkerDeployment(stack=stack, deployment_id=deployment["id"], pool=POOL, log=log_path,
                               output_dir=stack.root / "worker-runs")
    finally:
        end_process_tree(worker)
        log.close()
