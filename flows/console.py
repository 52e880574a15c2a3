"""What a run prints on the terminal, and what goes to its log file instead.

A first run should explain itself in a screenful: its progress, its tables, one line reading them and the links.
Prefect and MLflow log every state change and monitor start at INFO ("Finished in state Completed()", "Started
monitoring system metrics", database creation): hundreds of lines a run. :func:`quiet_console` keeps only warnings
and errors on the console (``--verbose`` or ``--log-level`` brings the rest back) and writes everything at INFO and
above to a log file, which the run names in its last lines. Prefect's API handler is left alone, so the Prefect
UI still shows every line of the flow run. Off a terminal, the training progress lines (``StageProgress``, one
every 30 s: there they stand for the progress bar) stay on the console.

Tables: :func:`printable_tables` drops a table without a single value (``clip_tiny`` has no MMVP data),
:func:`fitting_tables` splits one wider than the console into tables of fewer columns instead of cutting the
representation names, and :func:`reading_line` says in one line what the table shows.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from contrastive.modalities.base import ResultsTable, format_value, table_columns

#: the console's level unless --verbose / --log-level / MCLPIPE_LOG_LEVEL say otherwise
QUIET_LEVEL = logging.WARNING
LOG_LEVEL_ENV = "MCLPIPE_LOG_LEVEL"
#: loggers whose console handlers are filtered and that the log file receives (the ones that do not propagate to
#: the root logger carry handlers of their own)
NAMESPACES = ("prefect", "mlflow")
#: mclpipe's own loggers: at INFO (or the console's level when lower), so that their INFO lines (where a stage
#: trained, a fallback taken, the tracking server back) reach the log file; Prefect's logging configuration leaves
#: the root logger at WARNING, which they would inherit and drop them at.
OWN_NAMESPACES = ("contrastive", "tasks", "flows", "pipeline_config", "planning")
WIDTH = 80


def console_level() -> int:
    """The level the console shows: ``MCLPIPE_LOG_LEVEL`` (set by ``--verbose`` / ``--log-level``), else WARNING."""
    name = os.environ.get(LOG_LEVEL_ENV, "").strip().upper()
    level = logging.getLevelName(name) if name else QUIET_LEVEL
    return level if isinstance(level, int) else QUIET_LEVEL


class _ConsoleFilter(logging.Filter):
    """Passes a console record at or above ``level``, and the training progress lines (the progress bar off a
    terminal), which the engine's ``StageProgress`` says at INFO through the run logger."""

    def __init__(self, level: int):
        super().__init__("mclpipe-console")
        self.level = level
        from contrastive.engine import callbacks
        self.progress_file = os.path.realpath(callbacks.__file__)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:
            return True
        return os.path.realpath(record.pathname) == self.progress_file


def _loggers() -> list[logging.Logger]:
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in NAMESPACES]
    return [logging.getLogger(), *(logging.getLogger(n) for n in sorted(names))]


def _is_console(handler: logging.Handler) -> bool:
    """A handler printing to the terminal: Prefect's console handler, MLflow's (which writes through a stream
    object of its own that forwards to stderr), a plain StreamHandler; not a file, not Prefect's API handler."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


class _LogFileHandler(logging.FileHandler):
    """The run's log file. A write that fails (the output disk is full, the directory was removed) stops the file
    with one warning line on stderr instead of a "--- Logging error ---" traceback for every later record: the
    run's own error (a DiskFullError naming the fix) is what the user must read, and the console keeps showing
    warnings and errors."""

    def __init__(self, path: Path):
        super().__init__(path, encoding="utf-8")
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):  # a record that cannot be formatted: logging's own report, the file goes on
            super().handleError(record)
            return
        if self.failed:
            return
        self.failed = True
        try:
            self.close()
        except OSError:
            pass  # closing flushes, and the flush is what failed
        print(f"warning: the log file {self.baseFilename} is no longer written ({error}); the console keeps "
              "showing warnings and errors", file=sys.stderr)


def quiet_console(log_file: Path | None) -> Path | None:
    """Filter the console handlers of the root, Prefect and MLflow loggers to :func:`console_level` and send their
    records at INFO and above to ``log_file`` (created with its directory). Call it once Prefect and MLflow are
    imported (their imports configure logging); calling it again (the next seed of ``reproduce``) changes nothing
    but the file. Returns the log file."""
    level = console_level()
    file_handler = None
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = _LogFileHandler(log_file)
        file_handler.setLevel(logging.INFO)
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        file_handler.set_name("mclpipe-log-file")
    for logger in _loggers():
        for handler in list(logger.handlers):
            if handler.get_name() == "mclpipe-log-file":
                logger.removeHandler(handler)
                handler.close()
            elif _is_console(handler) and not any(isinstance(f, _ConsoleFilter) for f in handler.filters):
                handler.addFilter(_ConsoleFilter(level))
        # the root logger, and the loggers that keep their records to themselves, each write to the file once
        if file_handler is not None and (logger is logging.getLogger() or not logger.propagate):
            logger.addHandler(file_handler)
    for name in OWN_NAMESPACES:
        own = logging.getLogger(name)
        if own.getEffectiveLevel() > min(logging.INFO, level):
            own.setLevel(min(logging.INFO, level))
    global _LOG_FILE
    _LOG_FILE = log_file
    return log_file


_LOG_FILE: Path | None = None


def current_log_file() -> Path | None:
    """The file :func:`quiet_console` last sent the log to (None before it ran)."""
    return _LOG_FILE


def log_file_for(output_dir: Path | str, name: str) -> Path:
    """Where one command's full log goes: ``<output_dir>/logs/<config name>-<UTC time>-<pid>.log``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(output_dir).resolve() / "logs" / f"{name}-{stamp}-{os.getpid()}.log"


# ------------------------------------------------------------------------------------------------------ tables
def _has_values(table: ResultsTable) -> bool:
    prefix = table.metric + "/"
    return any(k.startswith(prefix) and isinstance(v, (int, float)) and not math.isnan(v)
               for m in table.rows.values() for k, v in m.items())


def printable_tables(tables: list[ResultsTable]) -> list[ResultsTable]:
    """The tables with at least one value: a table whose every cell would be "nan" says nothing."""
    return [t for t in tables if table_columns(t) and _has_values(t)]


def rich_table(table: ResultsTable, columns: list[str] | None = None, title: str | None = None) -> Table:
    """``table`` (all its columns, or ``columns``) as a rich table for the terminal."""
    columns = table_columns(table) if columns is None else columns
    title = table.title if title is None else title
    # compact (no blank edge lines) and at least as wide as its title, which then stays on one line
    out = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                title_justify="left", min_width=min(len(title), WIDTH))
    out.add_column("representation", no_wrap=True)
    for column in columns:
        out.add_column(column, justify="right", no_wrap=True)
    for name, metrics in table.rows.items():
        out.add_row(name, *(format_value(metrics.get(f"{table.metric}/{c}", float("nan")), percent=table.percent)
                            for c in columns))
    return out


def _width(table: Table) -> int:
    return Console(width=10_000).measure(table).maximum


def fitting_tables(table: ResultsTable, width: int = WIDTH) -> list[Table]:
    """``table`` as rich tables no wider than ``width``: all its columns in one when they fit, else the columns
    split over several tables (each with the representation names, titled "(1/2)", "(2/2)"), never cut."""
    columns = table_columns(table)
    groups: list[list[str]] = []
    for column in columns:
        if groups and _width(rich_table(table, [*groups[-1], column])) <= width:
            groups[-1].append(column)
        else:
            groups.append([column])
    if len(groups) <= 1:
        return [rich_table(table)]
    return [rich_table(table, group, title=f"{table.title} ({i}/{len(groups)})") for i, group in enumerate(groups, 1)]


# ------------------------------------------------------------------------------------------------------ reading
def reading_line(tables: list[ResultsTable], margin: float = 0.05) -> str | None:
    """One line that reads the first table with an MCL concat and a control concat row: the attribute where MCL
    concat gains most over the control ("MCL concat learns shape: 0.55 vs 0.31 for the control concat (stage 0:
    0.25)"), or that the two are within ``margin`` everywhere. None when no table has both rows."""
    for table in tables:
        mcl = next((r for r in table.rows if r.startswith("MCL concat") and "0-" not in r), None)
        control = next((r for r in table.rows if r.startswith("control")), None)
        if mcl is None or control is None:
            continue
        scale = 100.0 if table.percent else 1.0
        gains = {}
        for column in table_columns(table):
            key = f"{table.metric}/{column}"
            a, b = table.rows[mcl].get(key), table.rows[control].get(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not (math.isnan(a) or math.isnan(b)):
                gains[column] = (a - b, a, b)
        if not gains:
            continue
        column, (gain, a, b) = max(gains.items(), key=lambda item: item[1][0])
        digits = 1 if table.percent else 2
        if gain < margin * scale:
            return f"{mcl} and {control} are within {margin * scale:.{digits}f} on every attribute"
        stage0 = table.rows.get("stage 0", {}).get(f"{table.metric}/{column}")
        after = f" (stage 0: {stage0:.{digits}f})" if isinstance(stage0, (int, float)) else ""
        return f"{mcl} learns {column}: {a:.{digits}f} vs {b:.{digits}f} for the {control}{after}"
    return None
