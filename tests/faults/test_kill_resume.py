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
