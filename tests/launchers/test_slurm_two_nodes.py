"""The slurm launcher on a REAL two-node cluster (.ci/setup-slurm-2node.sh: slurmctld here, two slurmd each in its
own network namespace with its own host name and address, partition `pair`; the nodes share this file system):

- every modality's stage type (image, CLIP, text, embeddings) trains and exports split across the two
  nodes (one gloo process a node, the c10d rendezvous on node 1 reached by its name from node 2) and equals the
  same steps as two processes on one node: the same losses step for step, the same embeddings;
- a node lost mid-stage (every process of node 2 killed: slurmd, the job step, its rank) fails the job within the
  launcher's poll with one line naming the job, the node and the resume command; with the node back, the rerun
  resumes from the last checkpoint to the same model as an undisturbed run;
- the time-limit signal (USR1 before --time) requeues a two-node job, which resumes.

One job runs the four modalities' steps (tests/launchers/several_steps.py): one rendezvous and one interpreter start
instead of eight."""
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tasks.steps import modality_of
from launchers.base import JobFailed, JobState
from launchers.local import LocalTorchrunLauncher
from launchers.slurm import SlurmLauncher, SlurmSpec
from launchers.stage import launch_stage, stage_job
from pipeline_config.loader import load_config
from tests.faults.tiny_data import assert_same_weights, stage_weights, tiny_trifeature
from tests.faults.train_tiny_stage import tiny_spec
from tests.launchers.compare import assert_same_arrays, assert_same_losses
from tests.launchers.test_slurm_real import step_of, wait_for_state, wait_for_step
from tests.slurm import SETUP_TWO_NODES, require_two_nodes

pytestmark = pytest.mark.slow

# each modality's tiny preset (Modality.launch: a train and an export entry), its stage 0 a few steps long
PRESETS = {
    "image": ("trifeature_tiny", []),
    "clip": ("clip_tiny", ["device=cpu", "train.max_steps_per_epoch=4", "data.synthetic.num_train=288"]),
    "text": ("text_tiny", []),
    "embeddings": ("embeddings_tiny", ["train.epochs=1", "train.log_every_steps=1"]),
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """Each modality's config and data record (the data written once, on the shared file system)."""
    data_root = tmp_path_factory.mktemp("data")
    prepared = {}
    for name, (preset, overrides) in PRESETS.items():
        config = load_config(preset, [f"data.cache_dir={data_root / name}", "mcl.num_stages=1", *overrides])
        modality = modality_of(config)
        prepared[name] = (config, modality, modality.prepare_data(config, log=lambda line: None))
    return prepared


def four_modality_steps(prepared: dict, root: Path) -> list[dict]:
    """Stage 0's training then its export, of every modality, with their outputs under ``root``."""
    steps = []
    for name, (config, modality, data) in prepared.items():
        stage_dir = root / name / "train"
        spec = modality.train_spec(config, stage=0, seed=config.seed, out_dir=str(stage_dir), data=data,
                                   batches_path=None, init_model_path=None)
        export = modality.export_kwargs(config, model_path=str(stage_dir / "model" / "model.pt"), data=data,
                                        out_dir=str(root / name / "export" / "embeddings"))
        steps += [{"entry": modality.launch.train_entry, "kwargs": {"spec": spec.to_json()}},
                  {"entry": modality.launch.export_entry, "kwargs": {"export": export}}]
    return steps


def several_steps_job(steps: list[dict], stage_dir: Path, *, nproc_per_node: int, nnodes: int):
    return stage_job(name="four-modalities", entry="tests.launchers.several_steps:run_steps_from_json",
                     kwargs={"steps": steps}, backend="gloo", stage_dir=stage_dir, nproc_per_node=nproc_per_node,
                     nnodes=nnodes, result_file="none.json", env={"OMP_NUM_THREADS": "1"})


def two_nodes(**changes) -> SlurmLauncher:
    return SlurmLauncher(spec=SlurmSpec(nodes=2, partition="pair", cpus_per_task=1, time_limit="15:00",
                                        **changes))


def run_job_to_its_end(launcher, job) -> list[str]:
    from launchers.base import run_job
    lines = []
    run_job(launcher, job, on_line=lines.append, poll_seconds=0.5)
    return lines


def test_every_modality_trains_and_exports_across_two_nodes_as_on_one(prepared, tmp_path, monkeypatch):
    partition = require_two_nodes(monkeypatch)
    one, two = tmp_path / "one", tmp_path / "two"
    run_job_to_its_end(LocalTorchrunLauncher(), several_steps_job(four_modality_steps(prepared, one), one / "job",
                                                                  nproc_per_node=2, nnodes=1))
    lines = run_job_to_its_end(two_nodes(), several_steps_job(four_modality_steps(prepared, two), two / "job",
                                                              nproc_per_node=1, nnodes=2))
    assert any("on mcl-node[1-2], rendezvous mcl-node1:" in line for line in lines) and partition == "pair"
    assert "mclpipe: stage exited with 0" in lines

    for name in PRESETS:
        assert_same_losses(two / name / "train", one / name / "train")
        assert json.loads((two / name / "train" / "train_summary.json").read_text())["world_size"] == 2, name
        assert_same_arrays(two / name / "export", one / name / "export")


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    return tiny_trifeature(tmp_path_factory.mktemp("tiny"))


def tiny_stage(dataset_dir: Path, stage_dir: Path, *, nproc_per_node: int, nnodes: int, slow: bool):
    entry = ("tests.launchers.slow_stage:train_slower_from_json" if slow
             else "contrastive.modalities.image.steps:train_stage_from_json")
    return stage_job(name="tiny-two-nodes", entry=entry, kwargs={"spec": tiny_spec(dataset_dir, stage_dir).to_json()},
                     backend="gloo", stage_dir=stage_dir, nproc_per_node=nproc_per_node, nnodes=nnodes,
                     env={"OMP_NUM_THREADS": "1"})


def node_processes(node: str) -> list[int]:
    listed = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True, check=True).stdout
    return [int(pid) for pid in listed.split()]


def lose_node(node: str) -> None:
    """What a node's crash leaves: every process in its namespace (slurmd, the job step, its rank) killed at once,
    by their ids (the namespace holds only what .ci/setup-slurm-2node.sh and its jobs started)."""
    for pid in node_processes(node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_requeue_before_the_time_limit_then_a_lost_node_then_the_rerun_resumes(tiny_dataset, tmp_path,
                                                                               monkeypatch):
    """One two-node stage through both events a long job meets: the time-limit signal (USR1, what Slurm sends
    signal_lead_seconds before --time) requeues it and it resumes on both nodes; then node 2 dies mid-stage: the
    job fails within the launcher's poll with one line naming the job, the node and the resume command; with the
    node back, the rerun resumes from the last checkpoint and ends with the model of an undisturbed run."""
    partition = require_two_nodes(monkeypatch)
    reference_dir = tmp_path / "reference"
    launch_stage(LocalTorchrunLauncher(), tiny_stage(tiny_dataset, reference_dir, nproc_per_node=2, nnodes=1,
                                                     slow=False), on_line=lambda line: None, poll_seconds=0.2)
    reference = stage_weights(reference_dir)

    stage_dir, slurm = tmp_path / "stage", two_nodes(signal_lead_seconds=60)
    checkpoint = stage_dir / "checkpoints" / "last.pt"
    job = tiny_stage(tiny_dataset, stage_dir, nproc_per_node=1, nnodes=2, slow=True)
    handles, failures = [], []

    def drive() -> None:  # the flow's side: submit, poll every second, fail with the launcher's message
        try:
            launch_stage(slurm, job, on_line=lambda line: None, poll_seconds=1.0, on_submit=handles.append)
        except Exception as exc:  # noqa: BLE001 - whatever ended it, the assertions below name it
            failures.append((time.time(), exc))

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        requeue_then_lose_node_2(slurm, handles, checkpoint)
        lost_at = time.time()
        driver.join(timeout=120)
    finally:
        for handle in handles:  # nothing of this test stays in the queue, failed assertion or not
            slurm.cancel(handle)
    assert not driver.is_alive() and failures, "the job did not fail after its second node was lost"
    failed_at, failure = failures[0]
    assert isinstance(failure, JobFailed), failure
    assert failed_at - lost_at < 60  # Slurm declares the node down (SlurmdTimeout 10 s), then one poll
    first_line = str(failure).splitlines()[0]
    assert first_line.startswith(f"slurm job {handles[0].job_id} of tiny-two-nodes ended failed (NODE_FAIL")
    assert "node mcl-node2 (" in first_line and "run the same `mclpipe run` command again" in first_line
    killed_at = step_of(checkpoint)
    assert 4 < killed_at < 24 and not (stage_dir / "model" / "model.pt").exists()

    subprocess.run(["bash", str(SETUP_TWO_NODES)], check=True, timeout=180)  # the node is back
    summary = launch_stage(slurm, tiny_stage(tiny_dataset, stage_dir, nproc_per_node=1, nnodes=2, slow=False),
                           on_line=lambda line: None, poll_seconds=0.5)
    assert summary["resumed_from_step"] >= killed_at and summary["steps"] == 24 and partition == "pair"
    assert_same_weights(stage_dir, reference)


def requeue_then_lose_node_2(slurm: SlurmLauncher, handles: list, checkpoint: Path) -> None:
    """Once the job checkpointed: USR1 (its requeue), then, once the requeued job trained on, node 2's crash."""
    wait_for_step(checkpoint, 4)
    [handle] = handles
    subprocess.run(["scancel", "--signal=USR1", "--batch", handle.job_id], check=True)
    wait_for_state(slurm, handle, JobState.PENDING)
    # Slurm holds a requeued job back for about two minutes; as an admin may, let it start now
    subprocess.run(["scontrol", "update", f"JobId={handle.job_id}", "StartTime=now"], check=True)
    requeued_at = step_of(checkpoint)
    wait_for_step(checkpoint, requeued_at + 3)
    assert f"job {handle.job_id} (restart 1) on mcl-node[1-2]" in handle.log.path.read_text()
    lose_node("mcl-node2")
