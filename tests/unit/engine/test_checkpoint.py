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


# ------------------------------------------------------------------------- the digest, rotation, messages (mutants)
def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((2,), float(step))}


def test_an_earlier_format_checkpoint_verifies_by_the_sha256_file_beside_it(tmp_path):
    import hashlib

    from contrastive.engine.checkpoint import verified_checkpoint
    path = tmp_path / "last.pt"
    torch.save(_state(1), path)  # torch's archive without the digest inside
    assert verified_checkpoint(path) is None and verified_checkpoint(tmp_path / "missing.pt") is None
    (tmp_path / "last.pt.sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest() + "\n")
    assert verified_checkpoint(path) == path
    one = tmp_path / "one.pt"  # the digest is of every byte, the last one too
    one.write_bytes(b"x")
    (tmp_path / "one.pt.sha256").write_text(hashlib.sha256(b"x").hexdigest())
    assert verified_checkpoint(one) == one


def test_the_embedded_digest_is_read_only_from_a_well_formed_comment(tmp_path):
    """An empty archive (just the end record) is the smallest stamped file; a comment that is not the digest falls
    back to the .sha256 beside; a digest with non-ASCII bytes or a changed comment length does not verify."""
    import hashlib

    from contrastive.engine import checkpoint as ckpt
    empty = tmp_path / "empty.pt"
    empty.write_bytes(ckpt._stamped(b"PK\x05\x06" + bytes(18))[0])
    assert ckpt.verified_checkpoint(empty) == empty
    other = tmp_path / "other.pt"  # an end record whose comment has the digest's length but another text
    other.write_bytes(b"PK\x05\x06" + bytes(16) + ckpt._COMMENT_LENGTH.to_bytes(2, "little")
                      + b"x" * ckpt._COMMENT_LENGTH)
    (tmp_path / "other.pt.sha256").write_text(hashlib.sha256(other.read_bytes()).hexdigest())
    assert ckpt.verified_checkpoint(other) == other
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1), path)
    good = path.read_bytes()
    path.write_bytes(good[:-64] + b"\xff" * 64)
    assert ckpt.verified_checkpoint(path) is None
    length = len(good) - ckpt._COMMENT_LENGTH - 2  # the end record's comment length: a corrupt archive
    path.write_bytes(good[:length] + b"\x00\x01" + good[length + 2:])
    assert ckpt.verified_checkpoint(path) is None


def test_stamping_needs_an_archive_that_ends_without_a_comment():
    from contrastive.engine.checkpoint import _stamped
    for payload in (b"PK\x05\x06" + bytes(16) + b"\x01\x00", b"not an archive" * 3):  # a comment length
        with pytest.raises(ValueError) as refused:
            _stamped(payload)
        assert str(refused.value) == ("torch.save wrote no zip archive ending without a comment: cannot embed the "
                                      "digest")


def test_rotation_copies_where_the_filesystem_has_no_hard_links(tmp_path, monkeypatch):
    from contrastive.engine import checkpoint as ckpt

    def no_links(source, target):
        raise OSError("no hard links here")
    monkeypatch.setattr(ckpt.os, "link", no_links)
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1), path)
    save_checkpoint(_state(2), path)
    assert ckpt.verified_checkpoint(tmp_path / "last.pt.prev") is not None
    assert load_checkpoint(tmp_path / "last.pt.prev")["step"] == 1 and load_checkpoint(path)["step"] == 2


def test_a_missing_newest_checkpoint_falls_back_to_prev_and_a_save_keeps_prev(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1), path)
    save_checkpoint(_state(2), path)
    path.unlink()  # deleted since this process wrote it
    assert load_checkpoint(path)["step"] == 1
    save_checkpoint(_state(3), path)  # the good .prev (step 1) is what a crash now would fall back to
    assert load_checkpoint(tmp_path / "last.pt.prev")["step"] == 1 and load_checkpoint(path)["step"] == 3


def test_a_rotated_checkpoint_is_trusted_without_a_read_and_one_of_an_earlier_process_is_read(tmp_path,
                                                                                                 monkeypatch):
    """The in-process record of a file written moves with it to .prev (no re-hash at the next save); a checkpoint
    no record describes (an earlier process wrote it) is verified."""
    import hashlib

    from contrastive.engine import checkpoint as ckpt
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1), path)
    monkeypatch.setattr(ckpt, "_WRITTEN", {})  # as a new process sees it
    save_checkpoint(_state(2), path)  # step 1 verified by a read, then rotated
    save_checkpoint(_state(3), path)  # step 2, written by this process, becomes .prev with its record
    path.write_bytes(path.read_bytes()[:10])  # the newest corrupted since: .prev (step 2) is the good one
    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(ckpt.hashlib, "sha256", lambda data=b"": hashed.append(len(data)) or real(data))
    save_checkpoint(_state(4), path)
    assert len(hashed) == 1  # the new payload only: .prev was trusted by its record
    assert load_checkpoint(tmp_path / "last.pt.prev")["step"] == 2


def _disk_full(monkeypatch):
    import errno

    from contrastive.engine import files

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", full)


def test_a_full_disk_names_what_was_written_and_what_is_kept(tmp_path, monkeypatch):
    from contrastive.engine.checkpoint import save_torch
    from contrastive.errors import DiskFullError
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1), path)
    _disk_full(monkeypatch)
    expected = [(lambda: save_checkpoint(_state(2), tmp_path / "first.pt"),
                 "while writing a training checkpoint (first.pt); no earlier checkpoint of this stage exists. "),
                (lambda: save_checkpoint(_state(2), path),
                 f"while writing a training checkpoint (last.pt); the previous checkpoint {path} is kept. "),
                (lambda: save_torch(_state(2), tmp_path / "model.pt", what="a stage model"),
                 "while writing a stage model (model.pt); everything written before is kept. ")]
    for write, says in expected:
        with pytest.raises(DiskFullError) as full:
            write()
        assert str(full.value).startswith(f"disk full: no space left in {tmp_path} (") and says in str(full.value)
    assert load_checkpoint(path)["step"] == 1


def test_what_a_writer_cannot_store_is_named_with_the_file_s_role(tmp_path):
    import numpy as np

    from contrastive.engine.checkpoint import save_torch
    with pytest.raises(TypeError, match=r"^a training checkpoint\['rng'\] is a numpy.ndarray: "):
        save_checkpoint({"rng": np.zeros(2)}, tmp_path / "last.pt")
    with pytest.raises(TypeError, match=r"^a stage model\['w'\] is a numpy.ndarray: "):
        save_torch({"w": np.zeros(2)}, tmp_path / "model.pt", what="a stage model")


def test_load_checkpoint_honours_map_location_and_names_a_planted_checkpoint_s_role(tmp_path):
    import io

    from contrastive.engine.checkpoint import _stamped
    from contrastive.engine.safe_load import UnsafeFileError
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1), path)
    assert load_checkpoint(path, map_location="meta")["w"].device.type == "meta"
    buffer = io.BytesIO()
    torch.save({"step": 1, "model": os.getcwd}, buffer)  # a function: pickled by its name, refused unloaded
    path.write_bytes(_stamped(buffer.getvalue())[0])
    with pytest.raises(UnsafeFileError, match=rf"^training checkpoint {path} holds a pickled"):
        load_checkpoint(path)


def test_the_converter_s_messages(tmp_path, monkeypatch):
    """Not a file; a file torch cannot read (the error's type and first line, at most 200 characters); a data type
    no mclpipe stored (where it is); a global no mclpipe stored; a full disk while rewriting."""
    import numpy as np

    from contrastive.engine.checkpoint import _unreadable, convert_to_safe_format
    from contrastive.errors import DataError, DiskFullError
    tail = "), so nothing of it was loaded or converted: delete it and rerun the step that writes it"
    with pytest.raises(DataError) as refused:
        convert_to_safe_format(tmp_path / "none.pt")
    assert str(refused.value) == (f"{tmp_path / 'none.pt'} is not a file: pass the path of a checkpoint "
                                  "(checkpoints/last.pt) or a model file (model/model.pt)")
    head = "x.pt is not a checkpoint or model file an earlier mclpipe wrote (torch cannot read it: "
    assert str(_unreadable(tmp_path.parent / "x.pt", EOFError())) == f"{tmp_path.parent / head}EOFError{tail}"
    assert str(_unreadable("x.pt", RuntimeError(" one\ntwo"))) == f"{head}RuntimeError: one{tail}"
    assert str(_unreadable("x.pt", ValueError("y" * 300))) == f"{head}ValueError: {'y' * 200}{tail}"
    raw = tmp_path / "raw.pt"  # a plain pickle stream naming a global: torch's zip reader cannot read it
    raw.write_bytes(b"\x80\x02cos\ngetcwd\nq\x00.")
    with pytest.raises(DataError, match=r"\(torch cannot read it: ValueError: "):
        convert_to_safe_format(raw)
    odd = tmp_path / "odd.pt"
    torch.save({"dtype": np.dtype("float64"), "rng": np.zeros(1)}, odd)
    with pytest.raises(DataError, match=rf"^{odd}\['dtype'\] is a numpy.dtypes.Float64DType, which mclpipe never"):
        convert_to_safe_format(odd)
    planted = tmp_path / "planted.pt"
    torch.save({"f": os.getcwd}, planted)
    with pytest.raises(DataError, match=rf"^file {planted} holds a pickled posix.getcwd, which mclpipe never"):
        convert_to_safe_format(planted)
    old = tmp_path / "old.pt"
    torch.save({"rng": np.zeros(1)}, old)
    _disk_full(monkeypatch)
    with pytest.raises(DiskFullError, match=r"while writing a converted file \(old.pt\); everything"):
        convert_to_safe_format(old)
