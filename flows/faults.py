"""The one line for a failure around a run rather than in it: a store's disk that filled up (SQLite says "database or
disk is full" without an OSError; Prefect's server only answers 500), or the Prefect server that went away (killed,
out of memory). Each says what failed, what is kept and the command that continues; the CLI prints it instead of
the traceback (``--debug``-free by design: the traceback stays in the Prefect UI / logs).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

#: Below this many free bytes a store's filesystem counts as full (SQLite fails with a few pages still free).
NEARLY_FULL_BYTES = 1 << 20


def store_directories(config) -> dict[str, Path]:
    """Where a run writes besides its steps: {what: directory} (output_dir, the local MLflow store, Prefect's home)."""
    from tasks.tracking import default_tracking_uri
    places = {"the pipeline's outputs": Path(config.output_dir)}
    uri = config.tracking.uri or default_tracking_uri()
    if uri.startswith("sqlite:///"):
        places["the MLflow store"] = Path(uri.removeprefix("sqlite:///")).parent
    if os.environ.get("PREFECT_HOME") and not os.environ.get("PREFECT_API_URL"):
        places["the temporary Prefect server's database"] = Path(os.environ["PREFECT_HOME"])
    return places


def full_store(config) -> tuple[str, Path] | None:
    """The first store directory whose filesystem is (nearly) full, or None."""
    for what, directory in store_directories(config).items():
        existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
        if existing is not None and shutil.disk_usage(existing).free < NEARLY_FULL_BYTES:
            return what, directory.resolve()
    return None


def explain_failure(exc: BaseException, config) -> str | None:
    """The one line for ``exc`` when it is a failure around the run (module docstring), else None."""
    from contrastive.engine.files import disk_full_error, is_disk_full
    from flows.shutdown import prefect_unreachable, resume_command
    if config is None:
        return None
    full = full_store(config)
    if full is not None or is_disk_full(exc):
        what, directory = full or ("the pipeline's records", Path(config.output_dir).resolve())
        return str(disk_full_error(directory=directory, what=what,
                                   kept="finished steps and the last checkpoint of a stage in progress are kept"))
    if prefect_unreachable(exc):
        from prefect.settings import PREFECT_API_URL
        url = PREFECT_API_URL.value() or "the temporary local server"
        steps = Path(config.output_dir).resolve() / "steps"
        return (f"the Prefect server ({url}) stopped answering mid-run (stopped, or killed: out of memory?); "
                f"finished steps and the last checkpoint of a stage in progress are kept in {steps}. Continue with: "
                f"{resume_command(config)}")
    return None


def with_continue_command(exc: BaseException, config, *, rerun_from: int | None = None) -> str:
    """``exc``'s line, and for a tracking server that could not be reached (or stayed away past its grace) the exact
    command that continues the pipeline (the tracker does not know it)."""
    from flows.shutdown import resume_command
    from tasks.tracking import TrackingError
    if config is None or not isinstance(exc, TrackingError):
        return str(exc)
    return f"{exc}. Continue with: {resume_command(config, rerun_from=rerun_from)}"
