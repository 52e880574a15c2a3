"""Which earlier attempts of a pipeline died without closing their MLflow runs (SIGKILL, a lost node, the OOM
killer): nothing of a killed process runs after the signal, so its parent and stage runs stay RUNNING unless a later
attempt ends them or carries them on.

Every attempt holds an advisory lock (``flock``) on ``pipelines/<config hash>/attempts/<parent run id>.lock`` for as
long as it runs. The kernel releases it when the process exits, however it exits, and an attempt that ends removes
its file after it closed its runs. So a lock file that nobody holds is an attempt that died: its parent run is
taken over by the next attempt of the same pipeline (:func:`claim_dead_attempts`), and a lock somebody holds is a
pipeline running now (two runs of one config at once), whose runs are never touched.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ATTEMPTS_DIR = "attempts"
log = logging.getLogger(__name__)


@dataclass
class AttemptLock:
    """The held lock of one attempt (its parent run id): :meth:`release` as the kernel does at exit, :meth:`end` when
    the attempt closed its runs."""
    path: Path
    fd: int | None = None

    @property
    def parent_run_id(self) -> str:
        return self.path.stem

    @classmethod
    def take(cls, path: Path) -> "AttemptLock | None":
        """The lock at ``path`` if nobody holds it (created when absent), else None."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return cls(path=path, fd=fd)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def end(self) -> None:
        """The attempt closed its runs: nothing is left for a later one to take over."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.release()
        with contextlib.suppress(OSError):  # the folder goes with its last attempt
            self.path.parent.rmdir()


@dataclass
class DeadAttempts:
    """The locks of the dead attempts of a pipeline, held by this attempt while it takes their runs over (newest
    first: the attempt that got furthest)."""
    locks: list[AttemptLock] = field(default_factory=list)

    @property
    def parent_run_ids(self) -> list[str]:
        return [lock.parent_run_id for lock in self.locks]


def attempts_dir(pipeline_dir: Path) -> Path:
    return Path(pipeline_dir) / ATTEMPTS_DIR


def claim_dead_attempts(pipeline_dir: Path) -> DeadAttempts:
    """Take the lock of every attempt of the pipeline in ``pipeline_dir`` whose process is gone, newest first."""
    folder = attempts_dir(pipeline_dir)
    if not folder.is_dir():
        return DeadAttempts()
    paths = sorted(folder.glob("*.lock"), key=_started_ns, reverse=True)
    return DeadAttempts(locks=[lock for path in paths if (lock := AttemptLock.take(path)) is not None])


def _started_ns(path: Path) -> int:
    """When the attempt of lock ``path`` began (0 for one removed meanwhile: it ended)."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def attempt(pipeline_dir: Path, parent_run_id: str, dead: DeadAttempts) -> Iterator[AttemptLock]:
    """Hold this attempt's lock while the block runs (the dead attempt's lock when it took that parent run over);
    the other dead attempts' files go (their runs were ended). The file is removed when the block ends, however it
    ends (the runs were closed on the way out); only a killed process leaves it, for the next attempt."""
    own = next((lock for lock in dead.locks if lock.parent_run_id == parent_run_id), None)
    for lock in dead.locks:
        if lock is not own:
            lock.end()
    if own is None:
        try:
            own = AttemptLock.take(attempts_dir(pipeline_dir) / f"{parent_run_id}.lock")
        except OSError as exc:  # a full disk, a read-only one: the run goes on; a kill would leave its runs open
            log.warning("could not write the lock that lets a later attempt close this one's MLflow runs if it is "
                        "killed: %s", exc)
    try:
        yield own
    finally:
        if own is not None:
            own.end()
