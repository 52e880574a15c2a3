"""Entry points for tests of ``python -m contrastive.engine.launch`` (imported by the launched process)."""
import atexit
import os
from pathlib import Path


def finish_then_abort_at_exit(*, out: str, info) -> None:
    """Writes its file, then leaves an exit handler that aborts the process, as a process group destroyed during
    the interpreter's finalization can (contrastive/engine/launch.py ``exit_after_success``)."""
    Path(out).write_text(f"rank {info.rank} of {info.world_size}")
    atexit.register(os.abort)
