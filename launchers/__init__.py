"""Where a stage's processes run: a local torchrun, a Slurm job or a Kubernetes Job, behind one interface
(:class:`~launchers.base.Launcher`) driven by :func:`~launchers.base.run_job`."""
from launchers.base import (JobFailed, JobHandle, JobSpec, JobState, JobStatus, Launcher, LogTail,
                                        run_job)

__all__ = ["JobFailed", "JobHandle", "JobSpec", "JobState", "JobStatus", "Launcher", "LogTail", "run_job"]
