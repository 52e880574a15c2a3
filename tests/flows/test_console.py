"""What `mclpipe run` prints (flows.console): tables with data only, none wider than 80 columns, one line reading
them, and Prefect's and MLflow's INFO lines in the log file rather than on the console."""
import io
import logging
import math
from pathlib import Path

import pytest
from rich.console import Console

from contrastive.modalities.base import ResultsTable
from flows import console as run_console

PROBE = {"stage 0": {"probe/color": 1.0, "probe/shape": 0.252, "probe/texture": 0.977},
         "stage 1": {"probe/color": 0.972, "probe/shape": 0.569, "probe/texture": 0.682},
         "MCL concat": {"probe/color": 1.0, "probe/shape": 0.593, "probe/texture": 0.984},
         "control concat": {"probe/color": 1.0, "probe/shape": 0.311, "probe/texture": 0.987}}
RETRIEVAL_COLUMNS = [f"{side}_r@{k}" for side in ("i2t", "t2i", "mean") for k in (1, 5, 10)]
CLIP_ROWS = {name: {f"retrieval/{c}": 12.5 + i for i, c in enumerate(RETRIEVAL_COLUMNS)}
             for name in ("stage 0", "stage 1", "MCL concat (stages 0-1)", "model soup", "control concat")}


def rendered(tables) -> list[str]:
    out = Console(width=80, record=True, force_terminal=False, file=io.StringIO())
    for table in tables:
        out.print(table, width=80)
    return out.export_text().splitlines()


def test_a_table_without_values_is_not_printed():
    empty_mmvp = ResultsTable(title="MMVP-VLM pair accuracy (%)", rows={n: {"retrieval/i2t_r@1": 3.0}
                                                                         for n in CLIP_ROWS}, metric="mmvp")
    all_nan = ResultsTable(title="MMVP", rows={"stage 0": {"mmvp/orientation": math.nan}}, metric="mmvp")
    retrieval = ResultsTable(title="zero-shot retrieval recall (%)", rows=CLIP_ROWS, metric="retrieval", percent=True)
    assert run_console.printable_tables([empty_mmvp, all_nan, retrieval]) == [retrieval]


def test_a_wide_table_is_split_to_fit_80_columns_with_its_names_whole():
    retrieval = ResultsTable(title="zero-shot retrieval recall (%)", rows=CLIP_ROWS, metric="retrieval", percent=True)
    parts = run_console.fitting_tables(retrieval, width=80)
    lines = rendered(parts)
    assert len(parts) >= 2 and max(len(line) for line in lines) <= 80
    assert "…" not in "\n".join(lines) and "..." not in "\n".join(lines)
    for part in parts:  # every part names every representation in full
        assert list(part.columns[0].cells) == list(CLIP_ROWS)
    assert [c.header for part in parts for c in part.columns[1:]] == sorted(RETRIEVAL_COLUMNS)
    assert [p.title for p in parts][-1].endswith(f"({len(parts)}/{len(parts)})")


def test_the_trifeature_table_is_one_table_within_80_columns():
    table = ResultsTable(title="trifeature_quick: linear-probe accuracy (held-out split)", rows=PROBE, metric="probe")
    parts = run_console.fitting_tables(table, width=80)
    lines = rendered(parts)
    assert len(parts) == 1 and max(len(line) for line in lines) <= 80
    assert any(line.split()[:2] == ["MCL", "concat"] and line.split()[3] == "0.593" for line in lines)


def test_the_reading_line_comes_from_the_table():
    table = ResultsTable(title="probe", rows=PROBE, metric="probe")
    assert run_console.reading_line([table]) == ("MCL concat learns shape: 0.59 vs 0.31 for the control concat "
                                                 "(stage 0: 0.25)")
    same = {name: {**row, "probe/shape": 0.3} for name, row in PROBE.items()}
    line = run_console.reading_line([ResultsTable(title="probe", rows=same, metric="probe")])
    assert line.startswith("MCL concat and control concat are within 0.05")
    no_control = {k: v for k, v in PROBE.items() if k != "control concat"}
    assert run_console.reading_line([ResultsTable(title="probe", rows=no_control, metric="probe")]) is None


@pytest.fixture
def chatty_loggers():
    """A Prefect-like logger printing through a console handler on the root and an MLflow-like logger with a
    stream handler of its own (as their imports configure them); restored after the test."""
    root, mlflow_logger = logging.getLogger(), logging.getLogger("mlflow")
    stream = io.StringIO()
    saved = (list(root.handlers), root.level, list(mlflow_logger.handlers), mlflow_logger.propagate,
             mlflow_logger.level)
    console_handler = logging.StreamHandler(stream)
    console_handler.stream = stream
    root.handlers, root.level = [console_handler], logging.WARNING
    mlflow_handler = logging.StreamHandler(stream)
    mlflow_logger.handlers, mlflow_logger.propagate, mlflow_logger.level = [mlflow_handler], False, logging.INFO
    logging.getLogger("prefect.task_runs").setLevel(logging.INFO)
    own_levels = {name: logging.getLogger(name).level for name in run_console.OWN_NAMESPACES}
    yield stream, console_handler, mlflow_handler
    for name, level in own_levels.items():
        logging.getLogger(name).setLevel(level)
    for handler in root.handlers + mlflow_logger.handlers:
        if handler not in (console_handler, mlflow_handler):
            handler.close()
    root.handlers, root.level = saved[0], saved[1]
    mlflow_logger.handlers, mlflow_logger.propagate, mlflow_logger.level = saved[2], saved[3], saved[4]
    logging.getLogger("prefect.task_runs").setLevel(logging.NOTSET)


def test_info_chatter_goes_to_the_log_file_not_the_console(chatty_loggers, tmp_path, monkeypatch):
    stream, console_handler, mlflow_handler = chatty_loggers
    monkeypatch.setattr(run_console, "_is_console", lambda handler: handler in (console_handler, mlflow_handler))
    monkeypatch.delenv(run_console.LOG_LEVEL_ENV, raising=False)
    log_file = run_console.quiet_console(tmp_path / "logs" / "run.log")
    run_console.quiet_console(log_file)  # the next seed of `reproduce`: still one filter, one file handler
    logging.getLogger("prefect.task_runs").info("Finished in state Completed()")
    logging.getLogger("mlflow").info("Started monitoring system metrics.")
    logging.getLogger("prefect.task_runs").warning("a stage had to wait")
    logging.getLogger("contrastive.engine.loop").info("training on cpu")  # mclpipe's own INFO: the file only
    from contrastive.engine.callbacks import StageProgress
    progress = StageProgress(total_steps=4, description="stage 0", say=logging.getLogger("prefect.task_runs").info,
                             stream=io.StringIO(), every_seconds=0.0)
    progress.on_step(step=4, epoch=0, metrics={"train/loss": 1.0})
    progress.close(steps=4)
    for handler in logging.getLogger().handlers + logging.getLogger("mlflow").handlers:
        handler.flush()
    console_text, file_text = stream.getvalue(), log_file.read_text()
    assert "Completed()" not in console_text and "monitoring" not in console_text
    # warnings, and the progress lines (the progress bar off a terminal)
    assert "a stage had to wait" in console_text and "stage 0: trained 4 steps" in console_text
    assert file_text.count("Completed()") == 1 and file_text.count("monitoring") == 1
    assert "a stage had to wait" in file_text and run_console.current_log_file() == log_file
    assert "training on cpu" in file_text and "training on cpu" not in console_text


def test_verbose_brings_the_info_lines_back(chatty_loggers, tmp_path, monkeypatch):
    stream, console_handler, mlflow_handler = chatty_loggers
    monkeypatch.setattr(run_console, "_is_console", lambda handler: handler in (console_handler, mlflow_handler))
    monkeypatch.setenv(run_console.LOG_LEVEL_ENV, "INFO")
    run_console.quiet_console(tmp_path / "run.log")
    logging.getLogger("mlflow").info("Started monitoring system metrics.")
    assert "monitoring" in stream.getvalue()


def test_a_log_file_on_a_full_disk_stops_with_one_warning_line(chatty_loggers, monkeypatch, capsys):
    # /dev/full fails every write with ENOSPC, as the output disk does once it is full
    stream, console_handler, mlflow_handler = chatty_loggers
    monkeypatch.setattr(run_console, "_is_console", lambda handler: handler in (console_handler, mlflow_handler))
    monkeypatch.delenv(run_console.LOG_LEVEL_ENV, raising=False)
    monkeypatch.setattr(logging, "raiseExceptions", True)  # logging's default: a failed emit prints a traceback
    run_console.quiet_console(Path("/dev/full"))
    for n in range(3):
        logging.getLogger("prefect.task_runs").warning(f"a stage had to wait {n}")
        logging.getLogger("mlflow").info("Started monitoring system metrics.")
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and "Logging error" not in stderr
    assert stderr.count("warning: the log file /dev/full is no longer written") == 1
    assert "No space left on device" in stderr
    # the console goes on showing warnings
    assert "a stage had to wait 2" in stream.getvalue()
