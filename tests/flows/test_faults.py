"""flows/faults.py: the one line for a failure around a run (a full store, a Prefect server that went away)."""
import sqlite3
from collections import namedtuple

import httpx
import pytest

from flows import faults
from pipeline_config.loader import load_config


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    return load_config("trifeature_tiny", [f"output_dir={tmp_path / 'runs'}",
                                           f"tracking.uri=sqlite:///{tmp_path / 'store' / 'mlflow.db'}"])


def _raised_from(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as exc:
            raise outer from exc
    except Exception as exc:
        return exc


def test_sqlite_full_from_a_store_is_a_full_disk_in_one_line(config):
    error = _raised_from(RuntimeError("(sqlalchemy) commit failed"),
                         sqlite3.OperationalError("database or disk is full"))
    line = faults.explain_failure(error, config)
    assert line.startswith("disk full: no space left in ") and "finished steps and the last checkpoint" in line
    assert "rerun the same command" in line and "\n" not in line


def test_a_nearly_full_store_directory_is_named(config, tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    store = (tmp_path / "store").resolve()
    monkeypatch.setattr(faults.shutil, "disk_usage", lambda path: Usage(1, 1, 10 if str(path).startswith(
        str(store)) else 1 << 30))
    (tmp_path / "store").mkdir()
    line = faults.explain_failure(RuntimeError("HTTP 500 from the API"), config)
    assert line.startswith(f"disk full: no space left in {store} ") and "while writing the MLflow store" in line


def test_a_prefect_server_that_went_away_names_the_resume_command(config):
    error = _raised_from(RuntimeError("flow run failed"), httpx.ConnectError("All connection attempts failed"))
    line = faults.explain_failure(error, config)
    assert line.startswith("the Prefect server (") and "stopped answering mid-run" in line
    assert "Continue with: mclpipe" in line


def test_anything_else_keeps_its_traceback(config):
    assert faults.explain_failure(ValueError("a bug"), config) is None


def test_a_tracking_failure_names_the_command_that_continues(config):
    from contrastive.errors import ConfigError
    from tasks.tracking import TrackingError
    line = faults.with_continue_command(TrackingError("MLflow tracking at http://x has not answered"), config)
    assert line.startswith("MLflow tracking at http://x") and "Continue with: " in line and "\n" not in line
    assert faults.with_continue_command(ConfigError("bad key"), config) == "bad key"


def test_a_run_whose_prefect_server_went_away_exits_after_its_line_without_waiting_for_prefects_queue(
        config, monkeypatch):
    """Prefect's queued events wait seconds each for a server that is gone (minutes in all, after the line was
    printed): the CLI exits through shutdown.exit_now (a bounded drain), not by returning to the interpreter's exit.
    Any other failure with a line returns through typer.Exit as before."""
    from flows import cli, shutdown

    exits = []

    def exit_now(code):
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(shutdown, "exit_now", exit_now)
    monkeypatch.setattr(shutdown, "record_stop", lambda *args: None)
    gone = _raised_from(RuntimeError("flow run failed"), httpx.ConnectError("All connection attempts failed"))
    monkeypatch.setattr(cli, "run_pipeline", lambda *args, **kwargs: (_ for _ in ()).throw(gone))
    with pytest.raises(SystemExit):
        cli.run_and_report(lambda: config, rerun_from=None)
    assert exits == [2]

    full = _raised_from(RuntimeError("(sqlalchemy) commit failed"),
                        sqlite3.OperationalError("database or disk is full"))
    monkeypatch.setattr(cli, "run_pipeline", lambda *args, **kwargs: (_ for _ in ()).throw(full))
    with pytest.raises(cli.typer.Exit):
        cli.run_and_report(lambda: config, rerun_from=None)
    assert exits == [2]
