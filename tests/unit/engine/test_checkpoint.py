"""Atomic, digest-checked checkpoints."""
import os

import pytest
import torch

from contrastive.engine.checkpoint import load_checkpoint, save_checkpoint


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)
    save_checkpoint({"step": 2}, path)
    assert load_checkpoint(path)["step"] == 2
    path.write_bytes(path.read_bytes()[:10])  # truncated, as by a crash mid-copy
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert load_checkpoint(path)["step"] == 1


def test_a_save_hashes_only_its_own_bytes(tmp_path, monkeypatch):
    """Rank 0 saves while the other ranks wait for it: a save hashes the payload in memory once and reads no
    checkpoint back from disk (the newest file, as this process wrote it, is trusted for rotation)."""
    import hashlib

    from contrastive.engine import checkpoint as checkpoint_module

    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(checkpoint_module.hashlib, "sha256", lambda data=b"": hashed.append(len(data)) or real(data))
    path = tmp_path / "last.pt"
    for step in range(4):
        save_checkpoint({"step": step, "weights": bytes(1000)}, path)
    # the digest is of torch.save's archive, which the file carries with that digest as its zip comment
    sizes = {len(p.read_bytes()) - checkpoint_module._COMMENT_LENGTH for p in (path, tmp_path / "last.pt.prev")}
    assert len(hashed) == 4 and set(hashed) == sizes
    assert load_checkpoint(path)["step"] == 3


def test_a_checkpoint_changed_behind_the_writers_back_is_verified_before_it_becomes_prev(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)
    save_checkpoint({"step": 2}, path)
    path.write_bytes(path.read_bytes()[:10])  # truncated since this process wrote it
    save_checkpoint({"step": 3}, path)  # the corrupt newest is dropped: the good step 1 stays .prev
    path.write_bytes(b"")
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert load_checkpoint(path)["step"] == 1


def test_no_rank_waits_at_a_barrier_for_rank_0s_write(tmp_path, monkeypatch):
    """The loop's periodic saves put no barrier after rank 0's write (the next step's collective is where the
    others meet it); a rollback, which reads the checkpoint on every rank, waits for it first."""
    import torch

    from bench.gpu_check import QuietTask, RegressionRows
    from contrastive.engine import loop as loop_module
    from contrastive.engine.task import LoopSpec, OptimSpec

    events = []
    real_save = loop_module.save_checkpoint
    monkeypatch.setattr(loop_module, "barrier", lambda: events.append("barrier"))
    monkeypatch.setattr(loop_module, "save_checkpoint", lambda state, path: events.append("save") or
                        real_save(state, path))
    loop_module.train(task=QuietTask(), source=RegressionRows(steps=6, device=torch.device("cpu")),
                      optim=OptimSpec(name="sgd", lr=0.01, schedule="constant"),
                      loop=LoopSpec(epochs=1, checkpoint_every_steps=2, log_every_steps=100),
                      device=torch.device("cpu"), checkpoint_path=tmp_path / "last.pt")
    assert events == ["save"] * 4  # steps 2, 4, 6 and the epoch's end; no barrier after any


def test_the_checkpoint_exists_at_every_instant_of_a_save(tmp_path, monkeypatch):
    """A process killed anywhere in a save (between any two renames) leaves last.pt in place: the old one or the new
    one, never only .prev."""
    from contrastive.engine import checkpoint as ckpt
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)
    seen = []
    real_replace = os.replace

    def watched_replace(src, dst):
        seen.append(path.exists())
        real_replace(src, dst)
        seen.append(path.exists())

    monkeypatch.setattr(ckpt.os, "replace", watched_replace)
    save_checkpoint({"step": 2}, path)
    assert len(seen) >= 4 and all(seen)  # .prev, then the new file: before and after each
    assert load_checkpoint(path)["step"] == 2
    assert torch.load(ckpt._previous_path(path), weights_only=True)["step"] == 1 and ckpt._verified(
        ckpt._previous_path(path))


class Killed(BaseException):
    """The process dies here (SIGKILL: nothing after this point runs)."""


@pytest.mark.parametrize("first", [True, False], ids=["first-checkpoint", "later-checkpoint"])
def test_a_kill_at_any_instant_of_a_save_leaves_a_checkpoint_that_verifies(tmp_path, monkeypatch, first):
    """Issue 37: the digest used to be written after the file was renamed in, so a kill in between left a last.pt
    that read as corrupt (the stage's first checkpoint lost: the retried stage started over). A checkpoint and its
    digest now appear in one rename: stopped before any rename, write or link of a save, the newest last.pt
    verifies, with no fallback and no warning, and holds the old step or the new one."""
    import warnings

    from contrastive.engine import checkpoint as ckpt
    operations = 0
    for kill_at in range(20):
        path = tmp_path / str(kill_at) / "last.pt"
        if not first:
            save_checkpoint({"step": 1}, path)
        calls = {"n": 0}

        def dies_at(real):
            def call(*args, **kwargs):
                if calls["n"] == kill_at:
                    raise Killed
                calls["n"] += 1
                return real(*args, **kwargs)
            return call

        with monkeypatch.context() as patch:
            for name in ("replace", "link", "unlink", "rename", "fsync"):
                patch.setattr(ckpt.os, name, dies_at(getattr(os, name)))
            try:
                save_checkpoint({"step": 2}, path)
                finished = True
            except Killed:
                finished = False
        ckpt._WRITTEN.clear()  # a new process resumes
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback to .prev would warn
            state = load_checkpoint(path)
        if first and state is None:
            assert not path.exists() and not finished  # killed before the first checkpoint was renamed in
        else:
            assert ckpt.verified_checkpoint(path) == path and state["step"] in ({2} if finished else {1, 2})
        if finished:
            operations = kill_at
            break
    assert operations >= 2  # the kill landed before each of the save's file operations
