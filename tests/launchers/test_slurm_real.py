"""The slurm launcher on a REAL single-node Slurm cluster (.ci/setup-slurm.sh: slurmctld + slurmd on this host,
partition `debug`, CPUs=2): a 2-rank gloo stage (torchrun --nproc-per-node 2 under srun, c10d rendezvous on the
first node)
equals the same launch under a local torchrun; a job scancelled mid-stage is resumed from its checkpoint by the rerun; a
job told its time limit is near (USR1) requeues itself and resumes."""
import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

from launchers.base import JobFailed, JobState
from launchers.slurm import SlurmLauncher, SlurmSpec
from launchers.stage import launch_stage, stage_job
from launchers.local import LocalTorchrunLauncher
from tests.faults.train_tiny_stage import tiny_spec
from tests.faults.tiny_data import assert_same_weights, stage_weights, tiny_trifeature

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return tiny_trifeature(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def reference(dataset_dir, tmp_path_factory):
    """The same 2-rank stage under a local torchrun (the launcher kind `torchrun`): what every Slurm run equals."""
    stage_dir = tmp_path_factory.mktemp("reference") / "stage"
    summary = launch_stage(LocalTorchrunLauncher(), tiny_job(dataset_dir, stage_dir, slow=False),
                           on_line=lambda line: None, poll_seconds=0.2)
    assert summary["steps"] == 24
    return stage_weights(stage_dir)


def tiny_job(dataset_dir, stage_dir, *, slow: bool):
    # slow: a quarter of a second a step, so a cancel or a USR1 sent after step 5 lands seconds before the stage's end
    entry = ("tests.launchers.slow_stage:train_slower_from_json" if slow
             else "contrastive.modalities.image.steps:train_stage_from_json")
    return stage_job(name=f"tiny-{stage_dir.name}", entry=entry,
                     kwargs={"spec": tiny_spec(dataset_dir, stage_dir).to_json()}, backend="gloo",
                     stage_dir=stage_dir, nproc_per_node=2, env={"OMP_NUM_THREADS": "1"})


def launcher(**changes) -> SlurmLauncher:
    return SlurmLauncher(spec=SlurmSpec(partition="debug", cpus_per_task=2, time_limit="10:00", **changes))


def step_of(checkpoint: Path) -> int:
    try:
        return torch.load(checkpoint, weights_only=True)["step"]
    except Exception:  # being written (atomic rename) or not there yet
        return -1


def wait_for_step(checkpoint: Path, step: int, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and step_of(checkpoint) < step:
        time.sleep(0.2)
    assert step_of(checkpoint) >= step, f"no checkpoint at step {step} after {timeout} s"


def wait_for_state(slurm: SlurmLauncher, handle, state: JobState, timeout: float = 120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = slurm.poll(handle)
        if status.state is state:
            return status
        time.sleep(0.5)
    raise AssertionError(f"job {handle.job_id} not {state} after {timeout} s: {slurm.poll(handle)}")


def test_two_rank_stage_on_slurm_equals_the_local_run(slurm_cluster, dataset_dir, reference, tmp_path):
    stage_dir = tmp_path / "stage"
    lines, jobs = [], []
    summary = launch_stage(launcher(), tiny_job(dataset_dir, stage_dir, slow=False), on_line=lines.append,
                           poll_seconds=0.5, on_submit=jobs.append)
    assert summary["steps"] == 24 and summary["resumed_from_step"] is None
    assert any(f"mclpipe: job {jobs[0].job_id} (restart 0)" in line and "rendezvous" in line for line in lines)
    assert "mclpipe: stage exited with 0" in lines
    assert_same_weights(stage_dir, reference)


def test_scancel_mid_stage_then_the_rerun_resumes_from_the_checkpoint(slurm_cluster, dataset_dir, reference,
                                                                      tmp_path):
    stage_dir, slurm = tmp_path / "stage", launcher()
    job = tiny_job(dataset_dir, stage_dir, slow=True)
    handle = slurm.submit(job)
    checkpoint = stage_dir / "checkpoints" / "last.pt"
    wait_for_step(checkpoint, 5)
    slurm.cancel(handle)
    wait_for_state(slurm, handle, JobState.CANCELLED)
    killed_at = step_of(checkpoint)
    assert 5 <= killed_at < 24 and not (stage_dir / "model" / "model.pt").exists()

    summary = launch_stage(slurm, tiny_job(dataset_dir, stage_dir, slow=False), on_line=lambda line: None,
                           poll_seconds=0.5)
    assert summary["resumed_from_step"] >= killed_at and summary["steps"] == 24
    assert_same_weights(stage_dir, reference)


def test_time_limit_signal_requeues_the_job_which_resumes(slurm_cluster, dataset_dir, reference, tmp_path):
    stage_dir, slurm = tmp_path / "stage", launcher(signal_lead_seconds=60)
    handle = slurm.submit(tiny_job(dataset_dir, stage_dir, slow=True))
    wait_for_step(stage_dir / "checkpoints" / "last.pt", 5)
    # what Slurm does signal_lead_seconds before the time limit: USR1 to the batch shell
    subprocess.run(["scancel", "--signal=USR1", "--batch", handle.job_id], check=True)
    # Slurm holds a requeued job back for about two minutes; as an admin may, let it start now
    wait_for_state(slurm, handle, JobState.PENDING)
    subprocess.run(["scontrol", "update", f"JobId={handle.job_id}", "StartTime=now"], check=True)
    deadline = time.time() + 300
    while time.time() < deadline and not slurm.poll(handle).state.terminal:
        time.sleep(1)
    assert slurm.poll(handle).state is JobState.SUCCEEDED
    log = handle.log.path.read_text()
    assert "requeueing job" in log and f"job {handle.job_id} (restart 1)" in log
    summary = json.loads((stage_dir / "train_summary.json").read_text())
    assert summary["resumed_from_step"] >= 5 and summary["steps"] == 24
    assert_same_weights(stage_dir, reference)


def test_a_failing_stage_fails_with_the_job_id_and_its_last_lines(slurm_cluster, tmp_path):
    job = stage_job(name="broken", entry="contrastive.modalities.image.steps:train_stage_from_json",
                    kwargs={"spec": {"no": "such spec"}}, backend="gloo", stage_dir=tmp_path / "stage",
                    nproc_per_node=1)
    with pytest.raises(JobFailed) as raised:
        launch_stage(launcher(), job, on_line=lambda line: None, poll_seconds=0.5)
    assert raised.value.state is JobState.FAILED and raised.value.job_id.isdigit()
    assert f"slurm job {raised.value.job_id} of broken ended failed" in str(raised.value)
    assert any("Error" in line for line in raised.value.last_lines)
