"""Atomic, digest-checked checkpoints.

``save_checkpoint`` writes ``<name>.tmp``, fsyncs, renames over ``<name>`` (after moving the previous good file to
``<name>.prev``) and records a SHA-256 beside it. ``load_checkpoint`` verifies the digest and falls back to the
previous good checkpoint, with a warning, when the newest one is truncated or corrupt.

A full disk (ENOSPC, or EDQUOT over quota) while writing raises :class:`~contrastive.errors.DiskFullError` naming
the directory that filled up and what was being written; the partial temporary file is removed and nothing
written before is touched (a new checkpoint is written in full before the previous ones are rotated).
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from contrastive.errors import DiskFullError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _previous_path(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


#: SQLite's SQLITE_FULL, as MLflow's and Prefect's stores raise it (through SQLAlchemy): no OSError, only this text.
SQLITE_FULL = "database or disk is full"


def is_disk_full(exc: BaseException | None) -> bool:
    """``exc`` (or an exception it was raised from) says its filesystem is full: ENOSPC / EDQUOT, or SQLite's
    SQLITE_FULL from a tracking or orchestration store."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        if SQLITE_FULL in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(*, directory: Path, what: str, kept: str | None = None) -> DiskFullError:
    """The one-line message for a write that found its filesystem full: where, what, what is kept, the fix."""
    directory = Path(directory)
    existing = next((p for p in (directory, *directory.parents) if p.exists()), directory)
    try:
        free = f"{shutil.disk_usage(existing).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    kept = f"; {kept}" if kept else "; everything written before is kept"
    return DiskFullError(f"disk full: no space left in {directory} ({free}) while writing {what}{kept}. Free space "
                         f"there (or point output_dir at a larger disk) and rerun the same command: finished steps "
                         f"are reused and a stage in progress resumes from its last checkpoint")


STEP_KEPT = "finished steps and the last checkpoint of a stage in progress are kept"


def step_disk_full_error(exc: OSError, *, out_dir: Path) -> DiskFullError:
    """The one line for a pipeline step whose write (``exc``) found the disk full: the directory of the file, else the
    step's own ``out_dir``."""
    where = Path(exc.filename).parent if getattr(exc, "filename", None) else Path(out_dir)
    return disk_full_error(directory=where, what=f"the outputs of step {Path(out_dir).name}", kept=STEP_KEPT)


def _write_temporary(path: Path, payload: bytes, *, what: str) -> Path:
    """``payload`` fsynced into a temporary file beside ``path``; on a full disk the partial file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a partial file would only hold on to the space that ran out
        if is_disk_full(exc):
            raise disk_full_error(directory=path.parent, what=f"{what} ({path.name})") from exc
        raise
    return tmp


def atomic_write_bytes(path: Path, payload: bytes, *, what: str = "a file") -> None:
    """Write then rename, so a reader never sees a half-written file."""
    path = Path(path)
    os.replace(_write_temporary(path, payload, what=what), path)


def write_json(path: Path, value: dict) -> None:
    """A JSON record written atomically (write, then rename)."""
    atomic_write_bytes(Path(path), json.dumps(value, indent=2, default=str).encode(), what="a JSON record")


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
