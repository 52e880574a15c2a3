"""Faults a user will meet: a training process killed with SIGKILL mid-stage, a corrupt checkpoint."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from contrastive.engine.checkpoint import load_checkpoint
from tests.faults.tiny_data import assert_same_weights, stage_weights, tiny_trifeature

SCRIPT = Path(__file__).with_name("train_tiny_stage.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return tiny_trifeature(tmp_path_factory.mktemp("data"))


def start(dataset_dir: Path, stage_dir: Path, *, nproc: int = 1) -> subprocess.Popen:
    """The tiny stage in a new process group (one process, or torchrun with ``nproc`` gloo ranks)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.Popen([sys.executable, *launcher, str(SCRIPT), str(dataset_dir), str(stage_dir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_sigkill_mid_stage_then_resume_equals_uninterrupted(dataset_dir, tmp_path, nproc):
    reference = start(dataset_dir, tmp_path / "reference", nproc=nproc)
    assert reference.wait(timeout=300) == 0, reference.stderr.read().decode()[-2000:]

    victim_dir = tmp_path / "victim"
    victim = start(dataset_dir, victim_dir, nproc=nproc)
    checkpoint = victim_dir / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline:
        if checkpoint.exists() and torch.load(checkpoint, weights_only=True)["step"] >= 5:
            break
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # every rank and the torchrun agent at once, as a lost node
    victim.wait(timeout=30)
    killed_at = load_checkpoint(checkpoint)["step"]  # what a resume reads (last.pt, or .prev if it was mid-save)
    assert 5 <= killed_at < 24  # 3 epochs x 8 batches: it really died mid-stage
    assert not (victim_dir / "model" / "model.pt").exists()

    resumed = start(dataset_dir, victim_dir, nproc=nproc)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()[-2000:]
    import json
    summary = json.loads((victim_dir / "train_summary.json").read_text())
    assert summary["resumed_from_step"] >= killed_at and summary["steps"] == 24
    assert_same_weights(victim_dir, stage_weights(tmp_path / "reference"))


def test_corrupt_last_checkpoint_resumes_from_previous(dataset_dir, tmp_path):
    from tests.faults.train_tiny_stage import train
    stage_dir = tmp_path / "stage"
    train(dataset_dir, stage_dir, stop_after_steps=10)  # "crashed" after step 10, checkpoints at 9 and 10
    checkpoint = stage_dir / "checkpoints" / "last.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])  # truncated by a crash or a full disk
    with pytest.warns(RuntimeWarning, match="corrupt"):
        summary = train(dataset_dir, stage_dir)
    assert summary["resumed_from_step"] == 9 and summary["steps"] == 24


@pytest.mark.slow  # two runs of the real CLI, each with its own temporary Prefect server (minutes)
@pytest.mark.timeout(1800)
def test_sigkill_of_the_cli_mid_stage_then_a_rerun_leaves_mlflow_whole(tmp_path):
    """`mclpipe run` killed with SIGKILL in the middle of stage 1 (its whole process group: CLI, Prefect server):
    nothing of it closes a run. The same command again resumes the stage from its checkpoint and leaves no run of
    the pipeline RUNNING, one parent run, one run per stage, the stage's loss curve in one run from before the kill
    to its end, and the pipeline's links on finished runs."""
    import json

    from mlflow.tracking import MlflowClient

    from tests.faults.cli_process import MCLPIPE, MID_STAGE_EPOCHS, checkpoint_of, cli_env, start, tiny_run_args
    from tests.flows.mlflow_runs import run_tree

    args = tiny_run_args(tmp_path, MID_STAGE_EPOCHS, "mcl.control=false", "mcl.num_stages=2")
    cli = start(tmp_path, args)
    cli.wait_for(lambda: (found := checkpoint_of(tmp_path, "train1")) is not None
                 and torch.load(found, weights_only=True)["step"] >= 8, timeout=900, what="stage 1 at step 8")
    os.killpg(cli.process.pid, signal.SIGKILL)  # the CLI, its server and any worker at once
    cli.wait(timeout=30)
    killed_at = load_checkpoint(checkpoint_of(tmp_path, "train1"))["step"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parents, _ = run_tree(uri)
    assert [p.info.status for p in parents] == ["RUNNING"]  # what a kill leaves

    again = subprocess.run([MCLPIPE, *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True,
                           timeout=1200)
    assert again.returncode == 0, again.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    parents, children = run_tree(uri)
    every = client.search_runs([parents[0].info.experiment_id], max_results=500)
    assert [(r.info.run_name, r.info.status) for r in every if r.info.status != "FINISHED"] == []
    assert len(parents) == 1
    assert sorted((c.data.tags["kind"], c.data.tags["stage"]) for c in children) == [("mcl", "0"), ("mcl", "1")]
    stage1 = next(c for c in children if c.data.tags["stage"] == "1")
    steps = [m.step for m in client.get_metric_history(stage1.info.run_id, "train/loss")]
    assert len(steps) == len(set(steps)) and min(steps) <= killed_at < max(steps), (killed_at, steps)
    assert stage1.data.tags["resumed_from_step"] == str(killed_at)
    summary = json.loads(next((tmp_path / "runs" / "pipelines").glob("*/summary.json")).read_text())
    assert {run["run_id"] for run in summary["stage_runs"].values()} == {c.info.run_id for c in children}
