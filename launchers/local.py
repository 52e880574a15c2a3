"""A stage under torchrun on this machine, behind the same launcher interface as the cluster launchers."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

from contrastive.engine.launch import torchrun_command
from launchers.base import JobHandle, JobSpec, JobState, JobStatus, LogTail


@dataclass(frozen=True)
class LocalTorchrunLauncher:
    """``torchrun --standalone`` (or ``--nnodes`` + ``rdzv_endpoint`` for a hand-made multi-node run) in its own
    process group; the job id is the agent's pid."""

    rdzv_endpoint: str | None = None
    kill_grace_seconds: float = 10.0
    kind: str = "torchrun"

    def submit(self, job: JobSpec) -> JobHandle:
        command = torchrun_command(args_path=job.args_path, nproc_per_node=job.nproc_per_node, nnodes=job.nnodes,
                                   rdzv_endpoint=self.rdzv_endpoint)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        tail = LogTail(job.log_path)
        with open(job.log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=job.workdir,
                                       env={**os.environ, **dict(job.env)}, start_new_session=True)
        return JobHandle(kind=self.kind, job_id=str(process.pid), log=tail, extra={"process": process})

    def poll(self, handle: JobHandle) -> JobStatus:
        code = handle.extra["process"].poll()
        if code is None:
            return JobStatus(JobState.RUNNING)
        if code == 0:
            return JobStatus(JobState.SUCCEEDED)
        if code < 0:
            return JobStatus(JobState.CANCELLED if -code in (signal.SIGTERM, signal.SIGKILL) else JobState.FAILED,
                             f"signal {signal.Signals(-code).name}")
        return JobStatus(JobState.FAILED, f"exit code {code}")

    def new_lines(self, handle: JobHandle) -> list[str]:
        return handle.log.new_lines()

    def last_lines(self, handle: JobHandle, n: int = 20) -> list[str]:
        return handle.log.last_lines(n)

    def cancel(self, handle: JobHandle) -> None:
        """SIGTERM to the agent's process group (torchrun forwards it to the ranks), SIGKILL after the grace."""
        process = handle.extra["process"]
        if process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, self.kill_grace_seconds), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
