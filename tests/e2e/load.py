"""Many pipelines at once on the team stack (issue 38, "Load"): eight tiny pipelines, two of each modality, deployed
to one process work pool and submitted together, their stages sharing a Prefect global concurrency limit of 2
(``launcher.concurrency_limit``), run by one real ``prefect worker``; and what the load tests read back afterwards
(the stages' training intervals, the MLflow records of every pipeline and step).

Everything goes through the stack's own environment and API helpers (``Stack.env()``, ``tests.e2e.worker.api``),
so the stack's credentials apply here as in the other stack tests. The worker and the processes it started are
ended by their ids.
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tests.e2e.small_runs import SMALLER
from tests.e2e.stack import BIN, REPO, Stack
from tests.e2e.worker import TERMINAL, api, end_process_tree, flow_run, prefect_cli, wait_until_ready

SLOTS = 2  # the size of the global concurrency limit: "two GPUs"
# A killed holder's slot frees itself this long after its last renewal (launcher.concurrency_lease_seconds; a live
# holder renews at 3/4 of it, so 90 s leaves 22 s of slack on a loaded machine); the kill test's rerun waits for it.
LEASE_SECONDS = 90
STAGES = 2  # every pipeline below has two MCL stages (and no control run)

# (short name, preset, overrides): each modality's tiny preset made smaller (tests/e2e/small_runs.py), and a second
# variant of it. A different K leaves stage 0's content key alone, so those pairs share stage 0's training, export
# and evaluation; the embeddings pair differs by seed and shares nothing.
# The trifeature and embeddings pairs (the kill test's, tests/e2e/test_load.py KILLED) train longer: a stage of 8 steps
# checkpointed at step 4, or of two 8-step epochs checkpointed at each end, is under way past a checkpoint for well
# under a second, which the kill test's poll missed on a quiet machine (all four finished before the kill,
# 2026-11-29). Trifeature's stage 1 trains 6 epochs (embeddings has no per-stage settings: 5 epochs a stage).
_LONG_STAGE1 = ["stage_overrides.1.train.epochs=6"]
_LONG_EMBEDDINGS = ["train.epochs=5"]
PIPELINES = [
    ("tri_k4", "trifeature_tiny", [*SMALLER["trifeature_tiny"], *_LONG_STAGE1, "mcl.clusters=4"]),
    ("tri_k3", "trifeature_tiny", [*SMALLER["trifeature_tiny"], *_LONG_STAGE1, "mcl.clusters=3"]),
    ("clip_k4", "clip_tiny", [*SMALLER["clip_tiny"], "mcl.clusters=4"]),
    ("clip_k3", "clip_tiny", [*SMALLER["clip_tiny"], "mcl.clusters=3"]),
    ("text_k4", "text_tiny", [*SMALLER["text_tiny"], "mcl.clusters=4"]),
    ("text_k3", "text_tiny", [*SMALLER["text_tiny"], "mcl.clusters=3"]),
    ("emb_s0", "embeddings_tiny", [*SMALLER["embeddings_tiny"], *_LONG_EMBEDDINGS]),
    ("emb_s1", "embeddings_tiny", [*SMALLER["embeddings_tiny"], *_LONG_EMBEDDINGS, "seed=1"]),
]
# The pairs that share stage 0 (the same stage-0 content key), and the one pair that shares nothing.
SHARING = {"trifeature_tiny": True, "clip_tiny": True, "text_tiny": True, "embeddings_tiny": False}


def distinct_trainings(pipelines) -> int:
    """The stage trainings ``pipelines`` (PIPELINES entries) compute: two stages each, stage 0 once for a pair
    that shares it."""
    presets = {preset for _, preset, _ in pipelines}
    return sum(STAGES * 2 - (1 if SHARING[preset] else 0) for preset in presets)

DEPLOY = """
import json, sys
from flows.deployments import deploy_to_work_pool
for spec in json.loads(sys.argv[1]):
    print(deploy_to_work_pool(config_name=spec["preset"], work_pool=spec["pool"], overrides=spec["overrides"],
                              source=spec["source"]))
"""


@dataclass
class Pipeline:
    name: str  # the config's name: the deployment's and the registered model's
    preset: str
    deployment_id: str
    flow_run_id: str | None = None


@dataclass
class Load:
    """Eight deployments of one work pool, one concurrency limit, one output directory and MLflow experiment."""
    stack: Stack
    tag: str
    pool: str
    limit: str
    experiment: str
    output_dir: Path
    pipelines: list[Pipeline]
    log: Path
    slots: SlotWatch | None = None
    worker: subprocess.Popen | None = None
    submitted_at: float = 0.0
    logs: list = field(default_factory=list)

    @property
    def steps(self) -> Path:
        return self.output_dir / "steps"

    def start_worker(self) -> None:
        """`prefect worker start --pool <pool> --type process`, polling every second, one torch thread per flow run
        (eight flow runs share this machine's cores)."""
        log = open(self.log, "a")
        self.logs.append(log)
        env = {**self.stack.env(), "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
               "OMP_NUM_THREADS": "1"}
        self.worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", self.pool, "--type",
                                        "process"], cwd=self.stack.root, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
        wait_until_ready(self.stack, self.pipelines[0].deployment_id, worker=self.worker, log=self.log)

    def submit_all(self) -> None:
        """One flow run of every deployment, one right after the other ("Quick run" eight times)."""
        self.submitted_at = time.time()
        for pipeline in self.pipelines:
            pipeline.flow_run_id = api(self.stack, f"/deployments/{pipeline.deployment_id}/create_flow_run", {})["id"]

    def runs(self) -> dict[str, dict]:
        return {p.name: flow_run(self.stack, p.flow_run_id) for p in self.pipelines}

    def wait_all(self, *, seconds: float) -> dict[str, dict]:
        """Until every flow run is terminal; fails naming the ones that did not complete, with their error logs."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            runs = self.runs()
            if all(r["state_type"] in TERMINAL for r in runs.values()):
                break
            time.sleep(2)
        bad = {name: r for name, r in runs.items() if r["state_type"] != "COMPLETED"}
        if bad:
            details = "\n".join(f"{name}: {r['state_type']} ({r['state']['message']})\n"
                                f"{error_logs(self.stack, r['id'])}" for name, r in bad.items())
            raise AssertionError(f"{len(bad)} of {len(runs)} pipelines did not complete:\n{details}\nworker log:\n"
                                 f"{self.log.read_text()[-4000:]}")
        return runs

    def kill_worker(self) -> list[int]:
        """SIGKILL the worker and every process it started (the flow runs), as a lost node does; returns the pids."""
        tree = end_process_tree(self.worker, kill=True)
        self.worker = None
        return tree

    def close(self) -> None:
        if self.slots is not None:
            self.slots.stop()
        if self.worker is not None:
            end_process_tree(self.worker)
            self.worker = None
        for log in self.logs:
            log.close()


def error_logs(stack: Stack, flow_run_id: str, limit: int = 20) -> str:
    """The flow run's last ERROR/WARNING lines from the Prefect server (what the UI's log tab shows)."""
    logs = api(stack, "/logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run_id]}, "level": {"ge_": 30}},
                                       "sort": "TIMESTAMP_DESC", "limit": limit})
    return "\n".join(f"  {log['message'][:600]}" for log in reversed(logs))


def create_limit(stack: Stack, name: str, slots: int = SLOTS) -> None:
    """`prefect gcl create <name> --limit <slots>` (the REST call the CLI makes)."""
    api(stack, "/v2/concurrency_limits/", {"name": name, "limit": slots})


def read_limit(stack: Stack, name: str) -> dict:
    return api(stack, f"/v2/concurrency_limits/{name}", method="GET")


def delete_limit(stack: Stack, name: str) -> None:
    api(stack, f"/v2/concurrency_limits/{name}", method="DELETE")


def deploy_all(stack: Stack, *, tag: str, pool: str, limit: str, experiment: str, output_dir: Path,
               pipelines=PIPELINES) -> list[Pipeline]:
    """The ``pipelines`` (PIPELINES entries) deployed to ``pool`` from this checkout, each with
    ``launcher.concurrency_limit`` set, in one process (what `mclpipe deploy <preset> --work-pool <pool> --source
    <checkout> --set ...` calls, once a pipeline)."""
    common = [f"output_dir={output_dir}", f"data.cache_dir={stack.root / 'data'}", f"tracking.experiment={experiment}",
              f"launcher.concurrency_limit={limit}", f"launcher.concurrency_lease_seconds={LEASE_SECONDS}",
              "tracking.system_metrics_seconds=0", "device=cpu"]
    specs = [{"preset": preset, "pool": pool, "source": str(REPO),
              "overrides": [*overrides, *common, f"name=load_{tag}_{short}"]} for short, preset, overrides in pipelines]
    result = subprocess.run([str(BIN / "python"), "-c", DEPLOY, json.dumps(specs)], cwd=REPO, env=stack.env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    ids = result.stdout.split()[-len(specs):]
    return [Pipeline(name=f"load_{tag}_{short}", preset=preset, deployment_id=deployment_id)
            for (short, preset, _), deployment_id in zip(pipelines, ids)]


class SlotWatch:
    """The concurrency limit's holders over time, read from the Prefect server every ``every`` seconds while the
    load runs: every holder counts, whatever it does inside its slot (a training, an export, a k-means, an
    encoding, their model and data set-up and uploads) and however it ends (a flow run killed while it held one)."""

    def __init__(self, stack: Stack, limit: str, every: float = 0.2):
        self.stack, self.limit, self.every = stack, limit, every
        self.samples: list[tuple[float, int]] = []  # (time, active slots)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"slot-watch-{limit}", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), read_limit(self.stack, self.limit)["active_slots"]))
            except Exception as exc:  # a busy server: the next poll reads it; kept to say so if nothing was read
                self.errors.append(repr(exc))
            self._stop.wait(self.every)

    def most(self) -> int:
        return max((held for _, held in self.samples), default=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


#: The steps that hold a slot (tasks/steps.py: gpu_slot), by the first word of their task run's name
#: (flows/graph.py: step_title) and by their step directory's name (<prefix><kind><stage>-<key>).
SLOT_STEPS = {"train": "train", "export": "export", "k-means": "cluster", "encode": "encode"}
_STEP_DIR = re.compile(r"^(?:[a-z]+-)?(train|export|cluster|encode)\d*-[0-9a-f]+$")


def slot_holds(load: "Load") -> Counter:
    """How many times each kind of step took a slot of the load's limit, from the task runs' "holding a slot of"
    log lines on the Prefect server (tasks/launching.py: gpu_slot); a task run of any other kind is named as such."""
    flow_runs = [p.flow_run_id for p in load.pipelines]
    held, offset = Counter(), 0
    while True:
        logs = api(load.stack, "/logs/filter", {
            "logs": {"flow_run_id": {"any_": flow_runs}, "text": {"query": '"holding a slot of"'}},
            "sort": "TIMESTAMP_ASC", "limit": 200, "offset": offset})
        for log in logs:
            if f"holding a slot of {load.limit!r}" not in log["message"]:
                continue
            name = api(load.stack, f"/task_runs/{log['task_run_id']}", method="GET")["name"]
            held[SLOT_STEPS.get(name.split()[0], f"other: {name}")] += 1
        if len(logs) < 200:
            return held
        offset += len(logs)


def computed_slot_steps(steps: Path) -> Counter:
    """The finished step directories (record.json) of each kind that holds a slot: what was computed."""
    return Counter(found[1] for record in steps.glob("*/record.json")
                   if (found := _STEP_DIR.match(record.parent.name)))


@contextmanager
def load_stack(stack: Stack, tag: str, pipelines=PIPELINES):
    """A process work pool, a global concurrency limit of ``SLOTS``, the deployments of ``pipelines`` (PIPELINES
    entries) and a running worker; yields the Load. The worker and its flow runs are ended however the test ends."""
    pool, limit = f"load-pool-{tag}", f"load-gpus-{tag}"
    prefect_cli(stack, "work-pool", "create", pool, "--type", "process")
    create_limit(stack, limit)
    output_dir = stack.root / f"load-{tag}"
    experiment = f"mclpipe-load-{tag}"
    deployed = deploy_all(stack, tag=tag, pool=pool, limit=limit, experiment=experiment, output_dir=output_dir,
                          pipelines=pipelines)
    load = Load(stack=stack, tag=tag, pool=pool, limit=limit, experiment=experiment, output_dir=output_dir,
                pipelines=deployed, log=stack.root / f"load-{tag}-worker.log")
    try:
        load.slots = SlotWatch(stack, limit)
        load.start_worker()
        yield load
    finally:
        load.close()


# ---------------------------------------------------------------------------------------------------- read back
def parse_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True)
class Training:
    """One finished stage training: its step directory and when it trained. ``train_summary.json`` is written
    when the training loop ends, and holds the loop's duration (``seconds``); a resumed stage's is the part after
    the resume."""
    dir: Path
    start: float
    end: float


def trainings(steps: Path) -> list[Training]:
    out = []
    for summary in sorted(steps.glob("*train[0-9]*-*/train_summary.json")):
        end = summary.stat().st_mtime
        out.append(Training(dir=summary.parent, start=end - json.loads(summary.read_text())["seconds"], end=end))
    return out


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment (one that ends when another starts does not overlap it)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))
    most = current = 0
    for _, change in events:
        current += change
        most = max(most, current)
    return most


def step_files(steps: Path) -> dict[Path, int]:
    """mtime_ns of every file of every finished step (a directory with its record.json)."""
    return {path: path.stat().st_mtime_ns for record in steps.glob("*/record.json")
            for path in record.parent.rglob("*") if path.is_file()}


def report(load: Load, runs: dict[str, dict]) -> dict:
    """The wall time of the pipelines (first submission to the last flow run's end) against the sum of the flow runs'
    own times, and of their stages' training, each divided by the number of slots."""
    ends = [parse_time(r["end_time"]) for r in runs.values()]
    durations = [parse_time(r["end_time"]) - parse_time(r["start_time"]) for r in runs.values()]
    trained = sum(t.end - t.start for t in trainings(load.steps))
    return {"pipelines": len(runs), "slots": SLOTS, "wall_s": round(max(ends) - load.submitted_at, 1),
            "sum_of_flow_runs_s": round(sum(durations), 1),
            "sum_of_flow_runs_over_slots_s": round(sum(durations) / SLOTS, 1),
            "sum_of_training_s": round(trained, 1), "sum_of_training_over_slots_s": round(trained / SLOTS, 1),
            "total_run_time_s": round(sum(r["total_run_time"] for r in runs.values()), 1)}
