"""What every pipeline flow (MCL, CLIP, text) does around its steps: open the parent MLflow run of the config, build
the flow's step runner, and mark every run it opened finished or failed however the flow ends."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from prefect.exceptions import TerminationSignal
from prefect import get_run_logger
from prefect.runtime import flow_run

from flows.attempts import attempt, claim_dead_attempts
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
    Prefect UI), so a failed flow never leaves runs marked running and an interrupted one does not read as broken.
    A killed process closes nothing: the next attempt of the pipeline carries its parent run on (``flows.attempts``),
    reopening its stage runs, and ends what it does not reuse."""
    pipeline_id = config.config_hash()
    directory = pipeline_dir(config)
    dead = claim_dead_attempts(directory)
    adopted, inherited = take_over(config, pipeline_id=pipeline_id, parents=dead.parent_run_ids)
    parent = t.open_pipeline_run(config=config, pipeline_id=pipeline_id, flow_run_id=flow_run.id,
                                 pipeline_dir=str(directory), adopt=adopted)
    runner = runner_type(config=config, data=data, parent_run_id=parent, pipeline_id=pipeline_id, **runner_kwargs)
    runner.inherited_runs = inherited
    with attempt(directory, parent, dead), closing_runs(lambda status: runner.close(status=status)):
        yield runner


def take_over(config, *, pipeline_id: str, parents: list[str]) -> tuple[str | None, set[str]]:
    """:func:`tasks.steps.take_over_dead_attempts`, or nothing taken over when the tracking store cannot say (the
    killed attempt's runs stay as they are; this attempt opens its own)."""
    if not parents:
        return None, set()
    try:
        return t.take_over_dead_attempts(config=config, pipeline_id=pipeline_id, parents=parents)
    except Exception as exc:  # noqa: BLE001 - an outage here must not stop the pipeline
        get_run_logger().warning("could not take over the MLflow runs of a killed attempt: %s", exc)
        return None, set()
