"""User-facing errors. Every message says what went wrong and how to fix it; the CLI prints it on one line."""
import signal


class MclpipeError(Exception):
    """Base class for mistakes a user can make (bad config, missing data, corrupt files)."""


class ConfigError(MclpipeError, ValueError):
    """The pipeline configuration is invalid. A ValueError too, so the config schema reports one raised while it
    validates a library spec (whose checks live in the spec's ``__post_init__``) as a validation error."""


class DataError(MclpipeError):
    """Input data is missing, corrupt, or inconsistent with what was computed earlier."""


class DataReadError(DataError):
    """A file of the data could not be read, twice (an I/O error: a failing disk, a network filesystem, a data
    directory moved or made unreadable while a run read it). Not a broken sample, which is skipped and counted: it
    ends the step, naming the file."""


class DiskFullError(MclpipeError):
    """A write failed because its filesystem is full (ENOSPC) or over quota (EDQUOT). The message names the
    directory that filled up and what was being written; everything written before it is intact."""


class StageInterrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM (Slurm, Kubernetes, systemd) stopped the pipeline.

    A KeyboardInterrupt, not an Exception: no ``except Exception`` (task retries, tracking fallbacks) swallows it,
    and Prefect records the task and flow runs Crashed ("aborted by an interrupt signal") instead of Failed.
    ``checkpoint`` is the checkpoint written at the end of the step in progress (None when the signal arrived
    outside training); ``step`` the optimizer steps it holds; ``what`` names the step that was running.
    """

    def __init__(self, *, signum: int, what: str | None = None, checkpoint: str | None = None,
                 step: int | None = None):
        super().__init__(signum)
        self.signum, self.what, self.checkpoint, self.step = signum, what, checkpoint, step

    def __reduce__(self):
        return _rebuild_interrupted, (self.signum, self.what, self.checkpoint, self.step)

    def __str__(self) -> str:
        return self.describe()

    @property
    def signal_name(self) -> str:
        return "Ctrl-C (SIGINT)" if self.signum == signal.SIGINT else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number (130 SIGINT, 143 SIGTERM)."""
        return 128 + int(self.signum)

    def describe(self) -> str:
        where = f" during {self.what}" if self.what else ""
        if self.checkpoint:
            return f"stopped by {self.signal_name}{where} after step {self.step}; checkpoint kept at {self.checkpoint}"
        return f"stopped by {self.signal_name}{where}"


def _rebuild_interrupted(signum, what, checkpoint, step) -> StageInterrupted:
    return StageInterrupted(signum=signum, what=what, checkpoint=checkpoint, step=step)
