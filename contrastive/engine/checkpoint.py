"""Atomic, digest-checked checkpoints.

``save_checkpoint`` writes ``<name>.tmp``, fsyncs, renames over ``<name>`` (after moving the previous good file to
``<name>.prev``) and records a SHA-256 beside it. ``load_checkpoint`` verifies the digest and falls back to the
previous good checkpoint, with a warning, when the newest one is truncated or corrupt.

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
from contrastive.errors import DiskFullError


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _previous_path(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def save_torch(obj: Any, path: Path, *, what: str) -> None:
    """``torch.save`` written atomically, with the disk-full message (torch's own writer reports ENOSPC as a bare
    RuntimeError)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue(), what=what)


def save_checkpoint(state: dict[str, Any], path: Path) -> str:
    """Serialise ``state`` with torch.save; returns its SHA-256 hex digest.

    The new file is written in full before the newest good one becomes ``.prev``, so a full disk leaves both
    earlier checkpoints as they were.
    """
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest()  # of the bytes in memory: the file is never read back
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
    os.replace(tmp, path)
    # Without its digest (the disk filled up just now) the new file reads as corrupt and .prev is used instead.
    atomic_write_bytes(_digest_path(path), digest.encode(), what="a checkpoint digest")
    written = path.stat()
    _WRITTEN[str(path)] = (written.st_size, written.st_mtime_ns, digest)
    return digest


def _keep_as_previous(path: Path) -> None:
    """``path`` and its digest also become ``.prev`` while ``path`` stays where it is (a hard link, or a copy where
    the filesystem has none, renamed over ``.prev``). Renaming ``path`` away instead left an instant with no
    ``path`` at all before the new file was renamed in: a process killed there (the OOM killer mid-save) left only
    ``.prev``. Now at every instant ``path`` exists and either verifies or falls back to a ``.prev`` that does."""
    for source, target in ((path, _previous_path(path)), (_digest_path(path), _digest_path(_previous_path(path)))):
        if not source.exists():
            continue
        staged = target.with_name(f"{target.name}.tmp{os.getpid()}")
        staged.unlink(missing_ok=True)
        try:
            os.link(source, staged)
        except OSError:  # no hard links on this filesystem
            shutil.copy2(source, staged)
        os.replace(staged, target)


#: What this process wrote at each checkpoint path: (size, mtime_ns, SHA-256 of the payload). The next save must
#: know whether the newest file is good before it becomes ``.prev``; re-hashing the newest and the previous file
#: read twice a checkpoint from disk on rank 0 at every save (seconds for a ResNet-50 with Adam) while every other
#: rank waited. A file still as this process wrote it, with its digest file unchanged, is trusted without a read;
#: any other (written by an earlier process, touched since) is verified in full.
_WRITTEN: dict[str, tuple[int, int, str]] = {}


def _known_good(path: Path) -> bool:
    record = _WRITTEN.get(str(path))
    if record is not None:
        try:
            stat, recorded = path.stat(), _digest_path(path).read_text().strip()
        except OSError:
            return False
        if (stat.st_size, stat.st_mtime_ns, recorded) == record:
            return True
    return _verified(path)


def _verified(path: Path) -> bool:
    digest_file = _digest_path(path)
    if not path.exists() or not digest_file.exists():
        return False
    expected = digest_file.read_text().strip()
    return hashlib.sha256(path.read_bytes()).hexdigest() == expected


def load_checkpoint(path: Path, *, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The newest checkpoint whose digest verifies, or None when there is none (a fresh start)."""
    path = Path(path)
    for candidate in (path, _previous_path(path)):
        if not candidate.exists():
            continue
        if not _verified(candidate):
            warnings.warn(f"checkpoint {candidate} is truncated or corrupt (digest mismatch); "
                          f"falling back to the previous good checkpoint", RuntimeWarning, stacklevel=2)
            continue
        return torch.load(candidate, map_location=map_location, weights_only=False)
    return None
