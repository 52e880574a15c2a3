"""A full disk while a stage writes its checkpoints: one DiskFullError naming the directory and what was being
written, the earlier checkpoint intact, no partial file left, and a rerun after freeing space that resumes and ends
equal to an uninterrupted run. Simulated at the write boundary (ENOSPC from fsync), and for real on a small tmpfs
when the test may mount one (root)."""
import errno
import os
from pathlib import Path

import pytest

from contrastive.engine import checkpoint as checkpoint_module
from contrastive.engine.checkpoint import load_checkpoint
from contrastive.errors import DiskFullError
from tests.faults.train_tiny_stage import train
from tests.faults.tiny_data import assert_same_weights, stage_weights, tiny_trifeature


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return tiny_trifeature(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def reference(dataset_dir, tmp_path_factory):
    """An uninterrupted run of the tiny stage (3 epochs x 8 steps, a checkpoint after every step)."""
    stage_dir = tmp_path_factory.mktemp("reference") / "stage"
    train(dataset_dir, stage_dir)
    return stage_dir


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if ".tmp" in p.name]


def test_enospc_at_the_write_boundary_keeps_the_earlier_checkpoint_and_resumes(dataset_dir, reference, tmp_path,
                                                                              monkeypatch):
    real_fsync, calls = os.fsync, {"n": 0}

    def fsync_until_full(fd):
        calls["n"] += 1
        if calls["n"] > 5:  # 5 checkpoints (one file each, its digest inside) fit, the 6th does not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(checkpoint_module.os, "fsync", fsync_until_full)
    stage_dir = tmp_path / "stage"
    checkpoints = stage_dir / "checkpoints"
    with pytest.raises(DiskFullError) as full:
        train(dataset_dir, stage_dir)
    message = str(full.value)
    assert "\n" not in message
    assert f"no space left in {checkpoints} " in message and "a training checkpoint (last.pt)" in message
    assert f"the previous checkpoint {checkpoints / 'last.pt'} is kept" in message and "rerun" in message
    assert leftovers(checkpoints) == []  # the partial file was removed
    assert load_checkpoint(checkpoints / "last.pt")["step"] == 5
    assert load_checkpoint(checkpoints / "last.pt.prev")["step"] == 4  # both earlier checkpoints untouched

    monkeypatch.setattr(checkpoint_module.os, "fsync", real_fsync)  # space freed
    summary = train(dataset_dir, stage_dir)
    assert summary["resumed_from_step"] == 5 and summary["steps"] == 24
    assert_same_weights(stage_dir, stage_weights(reference))


def test_a_non_disk_error_is_not_reported_as_a_full_disk(tmp_path, monkeypatch):
    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(checkpoint_module.os, "fsync", broken)
    with pytest.raises(OSError) as failed:
        checkpoint_module.save_checkpoint({"step": 1}, tmp_path / "last.pt")
    assert not isinstance(failed.value, DiskFullError) and failed.value.errno == errno.EIO
    assert leftovers(tmp_path) == []


def test_a_really_full_tmpfs_fails_cleanly_then_resumes_after_space_is_freed(dataset_dir, reference, small_tmpfs):
    checkpoint_size = (reference / "checkpoints" / "last.pt").stat().st_size
    stage_dir = small_tmpfs / "stage"
    (stage_dir / "checkpoints").mkdir(parents=True)
    # Leave room for 2.5 checkpoints: saves 1 and 2 fit; save 3 needs a third copy beside last.pt and last.pt.prev.
    ballast = small_tmpfs / "ballast"
    free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
    ballast.write_bytes(b"\0" * (free - int(2.5 * checkpoint_size)))

    with pytest.raises(DiskFullError) as full:
        train(dataset_dir, stage_dir)
    message = str(full.value)
    assert f"no space left in {stage_dir / 'checkpoints'} " in message and "MiB free" in message
    assert "is kept" in message
    assert leftovers(stage_dir / "checkpoints") == []
    kept = load_checkpoint(stage_dir / "checkpoints" / "last.pt")
    assert kept is not None and kept["step"] == 2

    ballast.unlink()  # free the space, rerun: it resumes from the kept checkpoint
    summary = train(dataset_dir, stage_dir)
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 24
    assert_same_weights(stage_dir, stage_weights(reference))


def test_tracking_does_not_retry_a_full_disk(tmp_path):
    from tasks.tracking import Tracker
    tracker = Tracker(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="t", backoff_seconds=0.01)
    calls = []

    def copy_artifact():
        calls.append(1)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "mlartifacts" / "model.pt"))

    with pytest.raises(DiskFullError) as full:
        tracker._call("upload an artifact", copy_artifact)
    assert calls == [1]  # not retried: waiting does not free space
    assert f"no space left in {tmp_path / 'mlartifacts'} " in str(full.value)
    assert "MLflow's records (upload an artifact)" in str(full.value)
