"""Atomic, digest-checked checkpoints."""
import pytest

from contrastive.engine.checkpoint import load_checkpoint, save_checkpoint


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)
    save_checkpoint({"step": 2}, path)
    assert load_checkpoint(path)["step"] == 2
    path.write_bytes(path.read_bytes()[:10])  # truncated, as by a crash mid-copy
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert load_checkpoint(path)["step"] == 1
