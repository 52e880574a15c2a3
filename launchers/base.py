"""What every launcher shares: the job to run, its state, the log tail, and the one loop that drives a job.

A launcher (local torchrun, Slurm, Kubernetes) implements five calls; :func:`run_job` is the only caller:

    handle = launcher.submit(job)        # job id + where its log is
    launcher.poll(handle)   -> JobStatus # PENDING / RUNNING / SUCCEEDED / FAILED / CANCELLED (+ detail)
    launcher.new_lines(handle) -> [str]  # log lines written since the last call
    launcher.cancel(handle)              # scancel / delete the Job / kill the process group
    launcher.last_lines(handle, n)       # the log's last n lines (for the error of a failed job)

Every process of a job runs ``python -m torch.distributed.run ... -m contrastive.engine.launch <args.json>``:
the args file lies in the step directory, which is on storage every node sees, and so do the checkpoints a
rerun resumes from.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from contrastive.errors import MclpipeError


class JobState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    detail: str = ""  # the scheduler's own words: "TIMEOUT", "exit code 1", "BackoffLimitExceeded", ...


@dataclass(frozen=True)
class JobSpec:
    """One stage's processes: ``nnodes`` x ``nproc_per_node`` ranks running ``contrastive.engine.launch args_path``.

    ``workdir``: the directory the job starts in (relative paths in the args resolve there); ``env``: variables
    every process gets; ``python``: the interpreter on the nodes (a shared virtualenv, or the image's python)."""

    name: str
    stage_dir: Path
    args_path: Path
    nproc_per_node: int
    nnodes: int = 1
    python: str = "python"
    workdir: Path | None = None
    env: tuple[tuple[str, str], ...] = ()
    log_name: str = "job.log"

    def __post_init__(self):
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise MclpipeError(f"job {self.name}: nproc_per_node and nnodes must be >= 1 (got "
                               f"{self.nproc_per_node}, {self.nnodes})")

    @property
    def log_path(self) -> Path:
        return Path(self.stage_dir) / self.log_name

    def launch_module_args(self) -> list[str]:
        return ["-m", "contrastive.engine.launch", str(self.args_path)]


class LogTail:
    """New whole lines of a growing text file, from the size it had when the job was submitted (so a rerun that
    appends to the same log shows only its own lines)."""

    def __init__(self, path: Path, *, offset: int | None = None):
        self.path = Path(path)
        self.offset = (self.path.stat().st_size if self.path.exists() else 0) if offset is None else offset
        self.start = self.offset
        self._partial = b""

    def new_lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        self.offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        return [line.decode(errors="replace").rstrip("\r") for line in lines]

    def last_lines(self, n: int) -> list[str]:
        """The last ``n`` lines this job wrote (not those of an earlier job in the same file)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.start)
            text = handle.read().decode(errors="replace")
        return text.splitlines()[-n:]


@dataclass
class JobHandle:
    kind: str
    job_id: str
    log: LogTail | None = None
    extra: dict = field(default_factory=dict)  # launcher-specific: a Popen, a namespace, ...


class Launcher(Protocol):
    kind: str

    def submit(self, job: JobSpec) -> JobHandle: ...

    def poll(self, handle: JobHandle) -> JobStatus: ...

    def new_lines(self, handle: JobHandle) -> list[str]: ...

    def cancel(self, handle: JobHandle) -> None: ...

    def last_lines(self, handle: JobHandle, n: int = 20) -> list[str]: ...


class JobFailed(MclpipeError):
    """A stage's job ended without success; the message holds its id, state and last log lines."""

    def __init__(self, message: str, *, job_id: str, state: JobState, last_lines: list[str]):
        super().__init__(message)
        self.job_id, self.state, self.last_lines = job_id, state, last_lines


def failure_message(*, job: JobSpec, handle: JobHandle, status: JobStatus, last_lines: list[str]) -> str:
    detail = f" ({status.detail})" if status.detail else ""
    tail = "\n  ".join(last_lines) if last_lines else "(the job wrote no log lines)"
    # the first line alone says what happened and what to do: the job, how it ended (a lost node, from the
    # launcher), and the command that resumes it
    return (f"{handle.kind} job {handle.job_id} of {job.name} ended {status.state.value}{detail}; to resume the "
            f"stage from {Path(job.stage_dir) / 'checkpoints' / 'last.pt'}, run the same `mclpipe run` command "
            f"again (at most one checkpoint interval is lost). Its last lines:\n  {tail}\nFull log: {job.log_path}")


def run_job(launcher: Launcher, job: JobSpec, *, on_line: Callable[[str], None], poll_seconds: float,
            on_submit: Callable[[JobHandle], None] = lambda handle: None, sleep: Callable[[float], None] = time.sleep,
            tail_lines: int = 20) -> JobStatus:
    """Submit ``job``, pass every new log line to ``on_line`` while polling, and return its final status.

    Anything that stops this call before the job ended (a Prefect cancellation raised into the task, Ctrl-C, an
    error while polling) cancels the job on the way out, so no cluster job outlives the flow that wanted it. A job
    that ends without success raises :class:`JobFailed` with its id and last lines."""
    handle = launcher.submit(job)
    on_submit(handle)
    ended = False
    try:
        while True:
            status = launcher.poll(handle)
            for line in launcher.new_lines(handle):  # after the poll, so a finished job's last lines are shown
                on_line(line)
            if status.state.terminal:
                ended = True
                break
            sleep(poll_seconds)
    finally:
        if not ended:
            launcher.cancel(handle)
    if status.state is not JobState.SUCCEEDED:
        last = launcher.last_lines(handle, tail_lines)
        raise JobFailed(failure_message(job=job, handle=handle, status=status, last_lines=last),
                        job_id=handle.job_id, state=status.state, last_lines=last)
    return status
