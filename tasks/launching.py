"""The Prefect side of the launchers: run a stage's processes where ``config.launcher`` says, stream the job's log
into the task's log, and hold a slot of the Prefect global concurrency limit for the whole of a GPU stage.

``mclpipe run`` on a login node works as today: the flow (and the cheap steps: data preparation, k-means,
probes) runs there; the training and export stages run as cluster jobs. Cancelling the flow run raises in the task
(Prefect turns the runner's SIGTERM into an exception in the flow's main thread); ``run_job``'s ``finally`` then
scancels the Slurm job / deletes the Kubernetes Job. A failed job fails the task with its id and last log lines.
A rerun of the flow resumes the stage from ``checkpoints/last.pt`` in its step directory (shared storage).
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from pathlib import Path

from prefect import get_run_logger

from contrastive.engine.launch import SUMMARY, run_under_torchrun
from contrastive.errors import ConfigError
from launchers.stage import launch_stage, stage_job
from pipeline_config.launcher import build_launcher, node_python


def uses_processes(config) -> bool:
    """Whether a stage runs as separate processes (torchrun here or on a cluster) rather than in this one."""
    return config.launcher.kind != "local" or config.distributed.world_size() > 1


def job_name(*, config, stage_dir: str | Path, what: str) -> str:
    """A short name Slurm and Kubernetes accept (DNS-1123: lowercase, digits, '-', <= 63 characters)."""
    key = Path(stage_dir).name[:10].lower()
    name = f"mclpipe-{config.pipeline}-{what}-{key}".lower()
    return "".join(c if c.isalnum() or c == "-" else "-" for c in name)[:63].strip("-")


@contextmanager
def gpu_slot(config):
    """Hold one slot of ``launcher.concurrency_limit`` (a Prefect global concurrency limit) while the body runs,
    so pipelines sharing a GPU pool do not oversubscribe it. No limit configured: nothing is taken."""
    name = config.launcher.concurrency_limit
    if not name:
        yield
        return
    from prefect.concurrency.sync import concurrency

    logger = get_run_logger()
    logger.info("waiting for a slot of the global concurrency limit %r", name)
    with ExitStack() as stack:
        try:
            stack.enter_context(concurrency(name, occupy=1, strict=True,
                                            timeout_seconds=config.launcher.concurrency_timeout_seconds,
                                            lease_duration=config.launcher.concurrency_lease_seconds))
        except TimeoutError:
            raise ConfigError(f"no slot of the concurrency limit {name!r} within launcher."
                              f"concurrency_timeout_seconds={config.launcher.concurrency_timeout_seconds}: raise "
                              f"the limit (prefect gcl update {name} --limit N) or the timeout") from None
        except Exception as exc:  # strict: a limit that does not exist fails instead of running unlimited
            if "must be created" not in str(exc):
                raise
            raise ConfigError(f"launcher.concurrency_limit={name!r} does not exist on the Prefect server: create "
                              f"it (prefect gcl create {name} --limit <GPUs in the pool>) or set "
                              "launcher.concurrency_limit=null") from None
        logger.info("holding a slot of %r", name)
        yield


def run_stage_processes(*, config, what: str, entry: str, kwargs: dict, stage_dir: str | Path,
                        result_file: str = SUMMARY, log_path: Path | None = None, launcher=None,
                        single_process: bool = False) -> dict:
    """Run ``entry(**kwargs)`` on ``distributed.nproc_per_node`` x ``nnodes`` processes (``single_process``: one)
    where ``config.launcher`` says, and return what rank 0 wrote to ``stage_dir/result_file``. ``launcher``: a
    library launcher to use instead of the configured one (tests)."""
    d = config.distributed
    if single_process:
        d = d.model_copy(update={"nproc_per_node": 1, "nnodes": 1})
    stage_dir = Path(stage_dir)
    configured, poll_seconds = build_launcher(config.launcher, rdzv_endpoint=d.rdzv_endpoint,
                                              output_dir=str(Path(config.output_dir).resolve()))
    launcher = launcher or configured
    if launcher is None:  # launcher.kind=local with several processes: today's local torchrun
        return run_under_torchrun(entry=entry, kwargs=kwargs, stage_dir=stage_dir, nproc_per_node=d.nproc_per_node,
                                  backend=d.backend, log_path=log_path or stage_dir / "torchrun.log",
                                  nnodes=d.nnodes, rdzv_endpoint=d.rdzv_endpoint, result_file=result_file)
    logger = get_run_logger()
    job = stage_job(name=job_name(config=config, stage_dir=stage_dir, what=what), entry=entry, kwargs=kwargs,
                    backend=d.backend, stage_dir=stage_dir, nproc_per_node=d.nproc_per_node, nnodes=d.nnodes,
                    result_file=result_file, python=node_python(config.launcher))

    def submitted(handle) -> None:
        logger.info("%s: %s job %s submitted (%d x %d processes); its log: %s", what, handle.kind, handle.job_id,
                    job.nnodes, job.nproc_per_node, job.log_path)

    return launch_stage(launcher, job, on_line=lambda line: logger.info("[%s] %s", what, line),
                        poll_seconds=poll_seconds or 1.0, on_submit=submitted, result_file=result_file)
