"""One lock per step directory, so two pipelines that share a step (same content key) never compute it at the same
time: the second waits, then finds the first one's finished result and reuses it.

The lock is an advisory file lock (``flock``) in ``<steps>/.locks/<step dir name>.lock``: the kernel releases it
when its holder exits, however it exits (SIGKILL included), so a killed run never leaves a step locked. It lives
beside the step directory, not in it, because ``--rerun-from`` renames a finished step directory aside.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

LOCKS_DIR = ".locks"
log = logging.getLogger(__name__)


def lock_path(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    return out_dir.parent / LOCKS_DIR / f"{out_dir.name}.lock"


@contextlib.contextmanager
def step_lock(out_dir: Path, *, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock of step directory ``out_dir``; if another process holds it, say so (``on_wait``) and wait."""
    path = lock_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        (on_wait or log.warning)(f"waiting for another mclpipe run that is computing {Path(out_dir).name}; its "
                                 f"result is reused when it finishes (lock {path})")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
