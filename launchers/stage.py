"""A training (or export) stage as a launcher job: its args file, its JobSpec, and its result once it ended."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import contrastive
from contrastive.engine.launch import SUMMARY, write_launch_args
from contrastive.errors import MclpipeError
from launchers.base import JobHandle, JobSpec, Launcher, run_job

# The checkout (or site-packages) that holds `contrastive`: on PYTHONPATH of every rank, so the nodes import the
# same code as the flow (a shared filesystem), installed or not.
CODE_ROOT = Path(contrastive.__file__).resolve().parents[1]


def stage_job(*, name: str, entry: str, kwargs: dict, backend: str, stage_dir: Path, nproc_per_node: int,
              nnodes: int = 1, result_file: str = SUMMARY, python: str | None = None,
              workdir: Path | None = None, env: dict[str, str] | None = None) -> JobSpec:
    """Write the launch args beside the stage's outputs and describe its processes. Relative paths in ``kwargs``
    resolve against ``workdir`` (default: this process's directory, as for a local run)."""
    args_path = write_launch_args(entry=entry, kwargs=kwargs, backend=backend, stage_dir=Path(stage_dir),
                                  result_file=result_file)
    pythonpath = os.pathsep.join(p for p in (str(CODE_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    variables = {"PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1", **(env or {})}
    return JobSpec(name=name, stage_dir=Path(stage_dir).absolute(), args_path=args_path.absolute(),
                   nproc_per_node=nproc_per_node, nnodes=nnodes, python=python or sys.executable,
                   workdir=(workdir or Path.cwd()).absolute(), env=tuple(sorted(variables.items())),
                   log_name=f"{Path(result_file).stem}_job.log")


def launch_stage(launcher: Launcher, job: JobSpec, *, on_line: Callable[[str], None], poll_seconds: float,
                 on_submit: Callable[[JobHandle], None] = lambda handle: None, result_file: str = SUMMARY,
                 sleep=None) -> dict:
    """Run the stage's job to its end (see :func:`run_job`) and return what rank 0 wrote to ``result_file``."""
    extra = {} if sleep is None else {"sleep": sleep}
    run_job(launcher, job, on_line=on_line, poll_seconds=poll_seconds, on_submit=on_submit, **extra)
    result = Path(job.stage_dir) / result_file
    if not result.exists():
        raise MclpipeError(f"{job.name} ended successfully but {result} is missing: is {job.stage_dir} on storage "
                           "that the job's nodes and this machine share? (see docs/launchers.md)")
    return json.loads(result.read_text())
