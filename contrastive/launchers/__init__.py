"""Where a stage's processes run: a local torchrun, a Slurm job or a Kubernetes Job, behind one interface
(:class:`~contrastive.launchers.base.Launcher`) driven by :func:`~contrastive.launchers.base.run_job`."""
from contrastive.launchers.base import (JobFailed, JobHandle, JobSpec, JobState, JobStatus, Launcher, LogTail,
                                        run_job)

__all__ = ["JobFailed", "JobHandle", "JobSpec", "JobState", "JobStatus", "Launcher", "LogTail", "run_job"]
