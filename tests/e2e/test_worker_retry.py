"""Retry from the Prefect UI through a real worker (issue 16): a tiny pipeline deployed to a process work pool of
the team stack (Prefect server + MLflow server on PostgreSQL), its flow run executed by `prefect worker start
--type process`, the flow run's process killed with SIGKILL in the middle of stage 1 (what the OOM killer or a
lost node does), then "Retry" pressed as the UI presses it: the worker runs the flow run again, stage 0 is not
retrained, stage 1 continues from its checkpoint, and the MLflow run tree and the registered model are whole.
"""
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.stack import BIN, REPO
from tests.e2e.worker import PIPELINE, api, flow_run

# a flow run through the worker may wait 900 s on a loaded machine (tests/e2e/worker.py), plus the stack's start
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# What the UI's Retry button sends. Prefect 3.8.8 serves two UIs: V1 (prefect/server/ui) at the paths mclpipe's
# links open (/runs/flow-run/<id>), and V2 (prefect/server/ui_v2_build, under /v2) where a browser without a saved
# preference lands from the root (server.ui.v2_enabled=True). V1's FlowRunRetryButton/FlowRunRetryModal
# (assets/index-*.js) calls retryFlowRun(id) = setFlowRunState(id, {state: {type: `scheduled`, name: `AwaitingRetry`,
# message: `Retry from the UI`}}, force=false), i.e. POST /flow_runs/{id}/set_state with that state (type mapped
# to SCHEDULED); V2's "Retry Flow Run" dialog (assets/flow-run._id-*.js) posts the same state with force: true.
# Both show the button only for a flow run of a deployment in a terminal state; unforced, the server's
# orchestration (orchestration/core_policy.py HandleFlowTerminalStateTransitions) lets such a run go back to
# SCHEDULED, and a worker of its pool runs it again under the same flow run id.
RETRY_FROM_THE_UI = {"state": {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"},
                     "force": False}


@pytest.fixture
def alerts(worker_deployment):
    """A webhook on loopback (standing in for Slack) and the failure alert of docs/ui.md pointing at it, created
    the way the docs say (`python -m flows.alerts` with the stack's PREFECT_API_URL); yields the POSTed bodies."""
    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack = worker_deployment.stack
    result = subprocess.run([str(BIN / "python"), "-m", "flows.alerts", "--webhook-url",
                             f"http://127.0.0.1:{server.server_port}/hook"], cwd=REPO, env=stack.env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    automation_id = result.stdout.split("automation ", 1)[1].split()[0]
    stored = api(stack, f"/automations/{automation_id}", method="GET")
    assert stored["enabled"] and stored["trigger"]["posture"] == "Reactive"
    assert set(stored["trigger"]["expect"]) == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}
    assert "mcl-pipeline" in stored["trigger"]["match_related"]["prefect.resource.name"]
    assert stored["actions"][0]["type"] == "send-notification"
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        api(stack, f"/automations/{automation_id}", method="DELETE")


def wait_for_notification(received: list[dict], text: str, *, seconds: float = 90) -> dict:
    deadline = time.time() + seconds
    while time.time() < deadline:
        for body in received:
            if text in body.get("text", ""):
                return body
        time.sleep(0.5)
    raise AssertionError(f"no notification with {text!r} within {seconds} s; received: {received}")


def press_retry(stack, flow_run_id: str) -> dict:
    return api(stack, f"/flow_runs/{flow_run_id}/set_state", RETRY_FROM_THE_UI)


def flow_run_process(deployment, flow_run_id: str) -> psutil.Process:
    """The process the worker started for this flow run (``infrastructure_pid`` = "<host>:<pid>")."""
    deadline = time.time() + 60
    while time.time() < deadline:
        pid = flow_run(deployment.stack, flow_run_id).get("infrastructure_pid")
        if pid:
            return psutil.Process(int(str(pid).rsplit(":", 1)[-1]))
        time.sleep(0.5)
    raise AssertionError("the worker never recorded the flow run's process id")


def wait_for_resumable(stage_dir: Path, *, seconds: float, deployment) -> Path:
    """What a resume of the stage needs: a checkpoint whose digest verifies, the one ``load_checkpoint`` would
    load (issue 37: a checkpoint once appeared before its digest, and a kill in between lost it)."""
    from contrastive.engine.checkpoint import verified_checkpoint
    checkpoint = stage_dir / "checkpoints" / "last.pt"
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = verified_checkpoint(checkpoint)
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint under {stage_dir} that verifies within {seconds} s; worker log:\n"
                         f"{deployment.log.read_text()[-6000:]}")


def wait_for_event(stack, name: str, flow_run_id: str, *, log, seconds: float = 90) -> dict:
    """The first event ``name`` related to the flow run (the Events API the UI's event feed reads)."""
    body = {"filter": {"event": {"name": [name]}, "any_resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}},
            "limit": 10}
    deadline = time.time() + seconds
    while time.time() < deadline:
        events = api(stack, "/events/filter", body)["events"]
        if events:
            return events[0]
        time.sleep(0.5)
    raise AssertionError(f"no {name} event for flow run {flow_run_id}; worker log:\n{log.read_text()[-4000:]}")


def wait_for_new_dir(pattern: str, root, earlier: set, *, seconds: float, deployment):
    deadline = time.time() + seconds
    while time.time() < deadline:
        new = set(root.glob(pattern)) - earlier
        if new:
            return new.pop()
        time.sleep(0.05)
    raise AssertionError(f"no new {pattern} under {root} within {seconds} s; worker log:\n"
                         f"{deployment.log.read_text()[-6000:]}")


def task_runs(stack, flow_run_id: str) -> list[dict]:
    return api(stack, "/task_runs/filter", {"task_runs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200})


@dataclass
class Crash:
    flow_run_id: str
    crashed: dict  # the flow run, Crashed
    stage0: Path  # the step directories of this run's stage 0 training (finished) and stage 1 (killed)
    stage1: Path


def crash_in_stage1(deployment, parameters: dict | None = None) -> Crash:
    """A flow run of the deployment, run by the worker until stage 1 has written its first checkpoint, then its
    process killed with SIGKILL (what the OOM killer or a lost node does); returns once the worker is done with it."""
    stack, steps = deployment.stack, deployment.output_dir / "steps"
    earlier = set(steps.glob("*"))  # other pipelines' steps of the shared worker (the browser's custom run)
    flow_run_id = deployment.create_flow_run(parameters)
    deployment.wait(flow_run_id, {"RUNNING"}, seconds=180)
    process = flow_run_process(deployment, flow_run_id)
    stage1 = wait_for_new_dir("train1-*", steps, earlier, seconds=300, deployment=deployment)
    wait_for_resumable(stage1, seconds=300, deployment=deployment)
    os.kill(process.pid, signal.SIGKILL)
    crashed = deployment.wait(flow_run_id, {"CRASHED"}, seconds=120)
    # The worker reports the crash twice: its flow-run executor at once, then (about 10 s later, when its run()
    # returns) the worker itself; a Retry pressed in between is crashed by that late second report (prefect 3.8.8,
    # workers/base.py _submit_run_and_capture_errors -> _propose_crashed_state). The worker's event
    # "prefect.worker.executed-flow-run" follows that report: wait for it (docs/ui.md tells users the same).
    wait_for_event(stack, "prefect.worker.executed-flow-run", flow_run_id, log=deployment.log)
    assert not (stage1 / "record.json").exists(), "stage 1 finished before it was killed: make it longer"
    [stage0] = set(steps.glob("train0-*")) - earlier
    return Crash(flow_run_id=flow_run_id, crashed=crashed, stage0=stage0, stage1=stage1)


def test_retry_of_a_killed_flow_run_skips_finished_stages(worker_deployment, alerts):
    deployment = worker_deployment
    stack = deployment.stack

    # 1. the worker runs it; stage 0 finishes; stage 1 writes its first checkpoint; then the process is killed
    crash = crash_in_stage1(deployment)
    flow_run_id, crashed, stage0 = crash.flow_run_id, crash.crashed, crash.stage0
    # the team hears of it: the failure alert's notification names the run, its state and its page
    note = wait_for_notification(alerts, f"{crashed['name']} Crashed")
    assert f"{stack.prefect_url}/runs/flow-run/{flow_run_id}" in note["text"] and "SIGKILL" in note["text"]
    stage0_files = {p: p.stat().st_mtime_ns for p in stage0.rglob("*") if p.is_file()}
    assert stage0_files and (stage0 / "record.json") in stage0_files

    # 2. "Retry", as the UI's button does it; the worker runs the same flow run again
    result = press_retry(stack, flow_run_id)
    assert result["status"] == "ACCEPT", result
    done = deployment.wait(flow_run_id, {"COMPLETED"}, seconds=900)
    assert done["run_count"] == 2 and done["id"] == flow_run_id and crashed["state_type"] == "CRASHED"

    # stage 0 was skipped: its files untouched, its cached steps' task runs "Cached" in the retried run
    assert {p: p.stat().st_mtime_ns for p in stage0.rglob("*") if p.is_file()} == stage0_files
    retried = [t for t in task_runs(stack, flow_run_id) if t["flow_run_run_count"] == 2]
    states = {(t["name"], t["state_name"]) for t in retried}
    assert ("train stage 0", "Cached") in states and ("train stage 1 (MCL)", "Completed") in states, states

    # MLflow: one pipeline parent (reopened, not duplicated) with its two stage runs, all finished; stage 1
    # continued from its checkpoint in the run it began in
    client = MlflowClient(tracking_uri=stack.mlflow_url)
    experiment = client.get_experiment_by_name("mclpipe-worker")
    runs = client.search_runs([experiment.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
    parents = [r for r in runs if r.data.tags.get("kind") == "pipeline"]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    parent = parents[0]
    children = {r.data.tags["stage"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == ["0", "1"] and len(runs) == 3
    assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    assert parent.data.tags["prefect.flow_run_id"] == flow_run_id
    assert int(children["1"].data.tags["resumed_from_step"]) > 0
    assert "reused.train" not in children["0"].data.tags  # its own run, trained once
    assert len(client.get_metric_history(children["0"].info.run_id, "train/final_loss")) == 1
    assert {"eval/mcl_concat/probe/shape", "eval/stage0/probe/shape"} <= set(parent.data.metrics)

    assert len(alerts) == 1  # the retry that completed sent nothing

    # the registered model's alias points at this pipeline's model
    version = client.get_model_version_by_alias(PIPELINE, "current")
    assert version.run_id == parent.info.run_id
