"""What every pipeline flow (MCL, CLIP, text) does around its steps: open the parent MLflow run of the config, build
the flow's step runner, and mark every run it opened finished or failed however the flow ends."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run

from flows.runner import StepRunner
from tasks import steps as t

Runner = TypeVar("Runner", bound=StepRunner)
# How a stop from outside reaches a flow: StageInterrupted (a KeyboardInterrupt: Ctrl-C, SIGTERM, Slurm's
# pre-emption signal) or Prefect's TerminationSignal (the flow run cancelled).
STOPPED = (KeyboardInterrupt, TerminationSignal)


def pipeline_dir(config) -> Path:
    """Where a pipeline's summary and tables go: output_dir/pipelines/<config_hash>."""
    return Path(config.output_dir).resolve() / "pipelines" / config.config_hash()


@contextmanager
def closing_runs(close: Callable[[str], None]) -> Iterator[None]:
    """Call ``close(status)`` however the block ends: FINISHED when it completes (a ``return`` inside it included),
    KILLED when a person or a scheduler stopped it (``STOPPED``), FAILED when it raises anything else."""
    status = "FAILED"
    try:
        yield
        status = "FINISHED"
    except STOPPED:
        status = "KILLED"
        raise
    finally:
        close(status)


@contextmanager
def opened_pipeline(runner_type: type[Runner], *, config, data: dict, **runner_kwargs) -> Iterator[Runner]:
    """The runner of this flow's steps, under the parent MLflow run of ``config`` (keyed by its config_hash).

    Every run the runner opened is closed FINISHED when the block completes (a ``return`` inside it included) and
    FAILED when it raises, KILLED when a person or a scheduler stopped it (Ctrl-C, SIGTERM, a cancellation from the
    Prefect UI), so a failed flow never leaves runs marked running and an interrupted one does not read as broken."""
    pipeline_id = config.config_hash()
    parent = t.open_pipeline_run(config=config, pipeline_id=pipeline_id, flow_run_id=flow_run.id,
                                 pipeline_dir=str(pipeline_dir(config)))
    runner = runner_type(config=config, data=data, parent_run_id=parent, pipeline_id=pipeline_id, **runner_kwargs)
    with closing_runs(lambda status: runner.close(status=status)):
        yield runner
