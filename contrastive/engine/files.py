"""Files written whole or not at all, and the one message for a disk that filled up while writing them.

``atomic_write_bytes`` writes ``<name>.tmp<pid>``, fsyncs it and renames it over ``<name>``, so a reader (or a
rerun after a kill) never sees a half-written file; ``write_json`` is that for a JSON record. A full disk (ENOSPC,
or EDQUOT over quota; SQLite's SQLITE_FULL from a tracking store) raises :class:`~contrastive.errors.DiskFullError`
naming the directory that filled up, what was being written and the fix; the partial temporary file is removed.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from contrastive.errors import DiskFullError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


#: SQLite's SQLITE_FULL, as MLflow's and Prefect's stores raise it (through SQLAlchemy): no OSError, only this text.
SQLITE_FULL = "database or disk is full"


def disk_full_cause(exc: BaseException | None) -> BaseException | None:
    """The exception in ``exc``'s chain (itself, or one it was raised from) that says its filesystem is full:
    an OSError with ENOSPC / EDQUOT, or SQLite's SQLITE_FULL from a tracking or orchestration store; else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        if SQLITE_FULL in str(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def is_disk_full(exc: BaseException | None) -> bool:
    """``exc`` (or an exception it was raised from) says its filesystem is full (:func:`disk_full_cause`)."""
    return disk_full_cause(exc) is not None


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


def _write_temporary(path: Path, payload: bytes | Callable[[BinaryIO], None], *, what: str) -> Path:
    """``payload`` (bytes, or a function that writes them to the open file: a file larger than one buffer) fsynced
    into a temporary file beside ``path``; on a full disk the partial file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            if callable(payload):
                payload(handle)
            else:
                handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a partial file would only hold on to the space that ran out
        if is_disk_full(exc):
            raise disk_full_error(directory=path.parent, what=f"{what} ({path.name})") from exc
        raise
    return tmp


def atomic_write_bytes(path: Path, payload: bytes | Callable[[BinaryIO], None], *, what: str = "a file") -> None:
    """Write then rename, so a reader never sees a half-written file. ``payload``: the bytes, or a function that
    writes them to the open file."""
    path = Path(path)
    os.replace(_write_temporary(path, payload, what=what), path)


def write_json(path: Path, value: dict) -> None:
    """A JSON record written atomically (write, then rename)."""
    atomic_write_bytes(Path(path), json.dumps(value, indent=2, default=str).encode(), what="a JSON record")


def write_stage_summary(path: Path, summary: dict) -> None:
    """A step's summary (``train_summary.json``) written atomically, every path it names inside its own directory
    relative to that directory (``model/model.pt``): a run directory moves (DESIGN.md section 3), and what reads the
    summary resolves them where the directory is then. The caller keeps its absolute paths."""
    directory = Path(path).parent.resolve()

    def relative(value):
        if isinstance(value, str) and Path(value).is_absolute():
            try:
                return str(Path(value).resolve().relative_to(directory))
            except ValueError:  # outside the step's directory (a data set): as it is
                return value
        return value
    write_json(path, {key: relative(value) for key, value in summary.items()})
