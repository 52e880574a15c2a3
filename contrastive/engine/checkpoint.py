"""Atomic, digest-checked checkpoints, and the writer of every torch file mclpipe stores.

``save_checkpoint`` writes ``<name>.tmp``, fsyncs, hard-links the newest good file to ``<name>.prev`` and renames
the new one over ``<name>``. The file carries its own SHA-256 (in the zip comment of ``torch.save``'s archive, which
``torch.load`` ignores), so a checkpoint and its digest appear in one rename: a process killed at any instant
leaves a ``<name>`` that verifies (the new one or the one before), never one whose digest is still to come.
``load_checkpoint`` verifies the digest and falls back to the previous good checkpoint, with a warning, when the
newest one is truncated or corrupt; checkpoints of earlier versions carry their digest in ``<name>.sha256`` beside.
Every file is read with :func:`contrastive.engine.safe_load.load_torch_file` (nothing in it is run) and written
through :func:`check_plain` (only what reads back that way).

A full disk (ENOSPC, or EDQUOT over quota) while writing raises :class:`~contrastive.errors.DiskFullError` naming
the directory that filled up and what was being written; the partial temporary file is removed and nothing
written before is touched (a new checkpoint is written in full before the previous ones are rotated).
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from contrastive.engine.files import _write_temporary, atomic_write_bytes, disk_full_error
from contrastive.engine.safe_load import UnsafeFileError, check_plain, load_earlier_format, load_torch_file, plain_copy
from contrastive.errors import DataError, DiskFullError


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _previous_path(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


#: The zip comment that carries a file's SHA-256: this prefix and 64 hex digits.
DIGEST_PREFIX = b"mclpipe-sha256:"
_COMMENT_LENGTH = len(DIGEST_PREFIX) + 64
_END_OF_ARCHIVE = b"PK\x05\x06"  # the zip's end-of-central-directory record: 22 bytes, the comment's length last


def _stamped(payload: bytes) -> tuple[bytes, str]:
    """(``payload`` with its SHA-256 as the archive's zip comment, that digest). ``payload`` is ``torch.save``'s
    archive, which ends in an end record with no comment; the digest is of those bytes as torch wrote them."""
    if payload[-22:-18] != _END_OF_ARCHIVE or payload[-2:] != b"\0\0":
        raise ValueError("torch.save wrote no zip archive ending without a comment: cannot embed the digest")
    digest = hashlib.sha256(payload).hexdigest()
    comment = DIGEST_PREFIX + digest.encode()
    return payload[:-2] + len(comment).to_bytes(2, "little") + comment, digest


def _embedded_digest(path: Path) -> str | None:
    """The SHA-256 a file stamped by :func:`_stamped` carries, or None (an earlier format, or no such file)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() < 22 + _COMMENT_LENGTH:
                return None
            handle.seek(-(22 + _COMMENT_LENGTH), os.SEEK_END)
            tail = handle.read()
    except OSError:
        return None
    record, comment = tail[:-_COMMENT_LENGTH], tail[-_COMMENT_LENGTH:]
    if record[:4] != _END_OF_ARCHIVE or record[-2:] != _COMMENT_LENGTH.to_bytes(2, "little") \
            or not comment.startswith(DIGEST_PREFIX):
        return None
    return comment[len(DIGEST_PREFIX):].decode("ascii", errors="replace")


def _torch_payload(obj: Any, *, what: str) -> tuple[bytes, str]:
    """``obj`` as stamped ``torch.save`` bytes (and their digest); only plain data and tensors."""
    check_plain(obj, what=what)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return _stamped(buffer.getvalue())


def save_torch(obj: Any, path: Path, *, what: str) -> None:
    """``torch.save`` written atomically, with its digest inside and the disk-full message (torch's own writer
    reports ENOSPC as a bare RuntimeError). ``obj`` holds only tensors and plain data: it reads back with
    :func:`contrastive.engine.safe_load.load_torch_file`."""
    atomic_write_bytes(path, _torch_payload(obj, what=what)[0], what=what)


def save_checkpoint(state: dict[str, Any], path: Path) -> str:
    """Serialise ``state`` with torch.save, its SHA-256 inside; returns that hex digest.

    The new file is written in full before the newest good one becomes ``.prev``, so a full disk leaves both
    earlier checkpoints as they were.
    """
    path = Path(path)
    payload, digest = _torch_payload(state, what="a training checkpoint")  # hashed in memory: never read back
    kept = next((c for c in (path, _previous_path(path)) if _known_good(c)), None)
    try:
        tmp = _write_temporary(path, payload, what="a training checkpoint")
    except DiskFullError as exc:
        note = f"the previous checkpoint {kept} is kept" if kept else "no earlier checkpoint of this stage exists"
        raise disk_full_error(directory=path.parent, what=f"a training checkpoint ({path.name})", kept=note) \
            from exc.__cause__
    if kept == path:
        _keep_as_previous(path)
        if (record := _WRITTEN.pop(str(path), None)) is not None:
            _WRITTEN[str(_previous_path(path))] = record  # a hard link (or copy2) keeps size and mtime
    os.replace(tmp, path)  # the checkpoint and its digest, in one rename
    _digest_path(path).unlink(missing_ok=True)  # an earlier format's digest beside it, stale now
    written = path.stat()
    _WRITTEN[str(path)] = (written.st_size, written.st_mtime_ns)
    return digest


def _keep_as_previous(path: Path) -> None:
    """``path`` also becomes ``.prev`` while ``path`` stays where it is (a hard link, or a copy where the
    filesystem has none, renamed over ``.prev``). Renaming ``path`` away instead left an instant with no ``path``
    at all before the new file was renamed in: a process killed there (the OOM killer mid-save) left only
    ``.prev``. Now at every instant ``path`` exists and either verifies or falls back to a ``.prev`` that does.
    A ``path`` of an earlier format brings its digest file along."""
    for source, target in ((path, _previous_path(path)), (_digest_path(path), _digest_path(_previous_path(path)))):
        if not source.exists():
            target.unlink(missing_ok=True)  # a stale digest would not describe the new .prev
            continue
        staged = target.with_name(f"{target.name}.tmp{os.getpid()}")
        staged.unlink(missing_ok=True)
        try:
            os.link(source, staged)
        except OSError:  # no hard links on this filesystem
            shutil.copy2(source, staged)
        os.replace(staged, target)


#: What this process wrote at each checkpoint path: (size, mtime_ns). The next save must know whether the newest
#: file is good before it becomes ``.prev``; re-hashing the newest and the previous file read twice a checkpoint
#: from disk on rank 0 at every save (seconds for a ResNet-50 with Adam) while every other rank waited. A file
#: still as this process wrote it is trusted without a read; any other (written by an earlier process, touched
#: since) is verified in full.
_WRITTEN: dict[str, tuple[int, int]] = {}


def _known_good(path: Path) -> bool:
    record = _WRITTEN.get(str(path))
    if record is not None:
        try:
            stat = path.stat()
        except OSError:
            return False
        if (stat.st_size, stat.st_mtime_ns) == record:
            return True
    return _verified(path)


def _file_sha256(path: Path, *, drop_tail: int = 0) -> str:
    """SHA-256 of ``path`` read in chunks; with ``drop_tail`` the archive as torch wrote it (its last
    ``drop_tail`` bytes, the zip comment, dropped and the comment's length zeroed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        remaining = os.fstat(handle.fileno()).st_size - drop_tail - (2 if drop_tail else 0)
        while remaining > 0:
            chunk = handle.read(min(remaining, 1 << 24))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    if drop_tail:
        digest.update(b"\0\0")
    return digest.hexdigest()


def _verified(path: Path) -> bool:
    """``path`` exists and matches its digest: the one inside it, or (an earlier format) the ``.sha256`` beside."""
    if not path.exists():
        return False
    embedded = _embedded_digest(path)
    if embedded is not None:
        return _file_sha256(path, drop_tail=_COMMENT_LENGTH) == embedded
    digest_file = _digest_path(path)
    if not digest_file.exists():
        return False
    return _file_sha256(path) == digest_file.read_text().strip()


def verified_checkpoint(path: Path) -> Path | None:
    """The checkpoint a resume from ``path`` would load (``path``, else ``.prev``), or None: the newest whose
    digest verifies. What waits for a resumable stage (a test that kills a run) asks this."""
    path = Path(path)
    return next((c for c in (path, _previous_path(path)) if _verified(c)), None)


def load_checkpoint(path: Path, *, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The newest checkpoint whose digest verifies, or None when there is none (a fresh start).

    Read without running code (:func:`~contrastive.engine.safe_load.load_torch_file`); a verified checkpoint that
    holds anything but tensors and plain data (planted, or written by an earlier mclpipe) raises
    :class:`~contrastive.engine.safe_load.UnsafeFileError` rather than falling back: it names the file and how to
    convert one the user trusts."""
    path = Path(path)
    for candidate in (path, _previous_path(path)):
        if not candidate.exists():
            continue
        if not _verified(candidate):
            warnings.warn(f"checkpoint {candidate} is truncated or corrupt (digest mismatch); "
                          f"falling back to the previous good checkpoint", RuntimeWarning, stacklevel=2)
            continue
        return load_torch_file(candidate, what="training checkpoint", map_location=map_location)
    return None


def _unreadable(path: Path, exc: BaseException) -> DataError:
    """The one line for a file the converter cannot read as a torch file (torch's own error, first line only, says
    why): nothing of it was loaded or converted."""
    why = (str(exc).strip().splitlines() or [""])[0][:200]
    return DataError(f"{path} is not a checkpoint or model file an earlier mclpipe wrote (torch cannot read it: "
                     f"{type(exc).__name__}{': ' + why if why else ''}), so nothing of it was loaded or converted: "
                     "delete it and rerun the step that writes it")


def convert_to_safe_format(path: Path) -> str:
    """Rewrite a checkpoint or model file of an earlier mclpipe in the format that loads without running code: read
    with the few data types earlier versions stored allowed (numpy arrays, dtypes and scalars, paths:
    :func:`~contrastive.engine.safe_load.load_earlier_format`; still nothing in it is called, and a file naming any
    other global is refused), its arrays and scalars turned into tensors and numbers, then written atomically with
    its digest inside. Returns a one-line report."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} is not a file: pass the path of a checkpoint (checkpoints/last.pt) or a model file "
                        "(model/model.pt)")
    try:
        load_torch_file(path, what="file")
        return f"{path} already loads without running code; nothing to convert"
    except UnsafeFileError:
        pass
    except Exception as exc:  # torch's reader on a file that is no torch file: empty, text, a truncated archive
        raise _unreadable(path, exc) from None
    try:
        original = load_earlier_format(path, what="file")
    except DataError:
        raise
    except Exception as exc:  # e.g. a raw (non-zip) pickle: earlier mclpipe versions wrote only torch's archive
        raise _unreadable(path, exc) from None
    save_torch(plain_copy(original, what=str(path)), path, what="a converted file")
    _digest_path(path).unlink(missing_ok=True)  # the earlier format's digest, of bytes that are gone
    _WRITTEN.pop(str(path), None)
    return f"converted {path}: it now loads without running code"
