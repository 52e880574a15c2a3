"""How ``mclpipe`` stops: Ctrl-C, SIGTERM, a full disk. What the CLI says, and how it exits.

* ``install()`` (first thing the CLI does): SIGINT and SIGTERM raise ``StageInterrupted`` (``contrastive.engine.
  signals``); during training the engine defers them to the end of the step in progress and writes a checkpoint.
* ``interrupted_message``: the one line printed for a ``StageInterrupted``: what was stopped, which checkpoint is
  kept, the exact command that resumes.
* ``quiet_user_tracebacks``: Prefect logs a failed task with its traceback; for a mistake the user can fix
  (``MclpipeError``: a full disk, bad data), an interrupt, or a full disk met elsewhere, the terminal shows the
  log line without it (the Prefect UI keeps it), so the CLI's one line is not buried in pages of frames.
* ``exit_now``: once the CLI has said what happened it flushes Prefect's logs, stops the temporary Prefect
  server and ends the process, skipping the interpreter's teardown (garbage collection of a pipeline's objects
  took 10 s here); a further Ctrl-C meanwhile ends it at once instead of printing a traceback.
"""
from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from contrastive.engine.signals import STOP_SIGNALS, install_stop_handlers
from contrastive.errors import MclpipeError, StageInterrupted


def install() -> None:
    install_stop_handlers()
    keep_exit_codes_on_closed_pipes()


def keep_exit_codes_on_closed_pipes() -> None:
    """rich (the CLI's and Prefect's consoles) ends the process with exit 1 when its stream's reader has gone
    (``Console.on_broken_pipe``): after `mclpipe run | tee log` and Ctrl-C, the first log line would end the run
    silently with 1 instead of its checkpoint, its one line and 130. Point the streams at /dev/null instead and
    let the run end as it would have; its final line also goes to last-stop.txt (:func:`record_stop`)."""
    from rich.console import Console

    Console.on_broken_pipe = lambda self: silence_closed_streams()


def _explained(exc: BaseException | None) -> bool:
    """An exception whose message says everything: what the CLI prints as its one line."""
    from contrastive.engine.files import is_disk_full
    return isinstance(exc, (MclpipeError, KeyboardInterrupt)) or (exc is not None and (
        is_disk_full(exc) or prefect_unreachable(exc)))


def prefect_unreachable(exc: BaseException | None) -> bool:
    """``exc`` (or what it was raised from) is a connection to the Prefect API that failed."""
    import httpx
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError, ConnectionRefusedError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _WithoutExplainedTracebacks(logging.Formatter):
    """Wraps a console handler's formatter: records of explained exceptions are formatted without their traceback
    (the record is restored after, so the API log handler still sends it)."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if not (record.exc_info and _explained(record.exc_info[1])):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text = saved


def quiet_user_tracebacks() -> None:
    """Install ``_WithoutExplainedTracebacks`` on Prefect's console handlers (module docstring); call it once
    Prefect is imported (its import configures logging)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    names = [name for name in list(logging.root.manager.loggerDict) if name.startswith(("prefect", "mlflow"))]
    for logger in [logging.getLogger(), *map(logging.getLogger, names)]:
        for handler in logger.handlers:
            # MLflow's own stream handler logs a full store's SQLAlchemy error with its traceback too.
            console = isinstance(handler, PrefectConsoleHandler) or (
                logger.name.startswith("mlflow") and isinstance(handler, logging.StreamHandler))
            if console and not isinstance(handler.formatter, _WithoutExplainedTracebacks):
                handler.setFormatter(_WithoutExplainedTracebacks(handler.formatter))


def resume_command(config, *, rerun_from: int | None = None) -> str:
    """The command that continues this pipeline: ``mclpipe resume <id>`` once its config is saved (the flow saves
    it before the first step), else the command line that was run. ``--rerun-from`` is repeated: steps it forces
    that had finished are computed again, and a stage whose recompute was interrupted continues from its
    checkpoint."""
    pipeline_id = config.config_hash()
    output_dir = Path(config.output_dir).resolve()
    if (output_dir / "pipelines" / pipeline_id / "config.yaml").exists():
        parts = ["mclpipe", "resume", pipeline_id[:12], "--output-dir", str(output_dir)]
        if rerun_from is not None:
            parts += ["--rerun-from", str(rerun_from)]
        return shlex.join(parts)
    return command_line()


def interrupted_message(exc: StageInterrupted, config=None, *, rerun_from: int | None = None,
                        command: str | None = None) -> str:
    """One line: what was interrupted, which checkpoint is kept, the exact resume command (``command``: the one
    to repeat instead of ``resume_command``, for commands that run several pipelines)."""
    if config is None:
        return f"{exc}; nothing was computed yet"
    steps = Path(config.output_dir).resolve() / "steps"
    kept = "" if exc.checkpoint else "; no training was in progress"
    return (f"{exc}{kept}; finished steps are kept in {steps}. Resume with: "
            f"{command or resume_command(config, rerun_from=rerun_from)}")


LAST_STOP = "last-stop.txt"


def record_stop(output_dir: Path | str | None, line: str) -> Path | None:
    """Keep the run's final line in ``<output_dir>/last-stop.txt`` (with the time), where ``mclpipe status`` reads
    it: a terminal or pipe that closed with the run (``mclpipe run ... | tee log`` and Ctrl-C) cannot lose it."""
    if output_dir is None:
        return None
    import datetime
    path = Path(output_dir).resolve() / LAST_STOP
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')} {line}\n")
        tmp.replace(path)
    except OSError:  # a full or read-only output disk: the line still goes to the terminal
        return None
    return path


def say(console, text: str, **kwargs) -> None:
    """Print on ``console``; when its stream was closed (the reader of a pipe ended, the terminal went away) the
    streams are pointed at /dev/null, so the exit code stays the one the CLI chose (not 1 from a broken pipe)."""
    try:
        console.print(text, **kwargs)
        console.file.flush()
    except OSError:  # BrokenPipeError, or EIO from a terminal that closed
        silence_closed_streams()


def silence_closed_streams() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        try:
            os.dup2(devnull, fd)
        except OSError:
            pass


def command_line() -> str:
    """The command that was run, to repeat it."""
    return shlex.join(["mclpipe", *sys.argv[1:]])


DRAIN_SECONDS = 3.0
SERVER_STOP_SECONDS = 2.0


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` after the run's state is recorded (module docstring)."""
    for signum in STOP_SIGNALS:  # asked again while shutting down: go at once
        signal.signal(signum, lambda *_: os._exit(code))
    try:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for worker in (APILogWorker, EventsWorker):
            worker.drain_all(timeout=DRAIN_SECONDS)
    except Exception:  # noqa: BLE001 - best effort: the states that matter were recorded synchronously
        pass
    stop_local_server(timeout=SERVER_STOP_SECONDS)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError):  # the reader of a pipe is gone: the code below still says what happened
            pass
    os._exit(code)


def stop_local_server(*, timeout: float) -> None:
    """SIGTERM to the temporary Prefect server, waiting up to ``timeout`` (its watchdog finishes the job)."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer._instances.get(None)
    process = getattr(server, "server_process", None)
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
