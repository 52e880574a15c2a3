"""The temporary Prefect server's supervisor (flows.local_server.supervise): a server process that dies under the run
is started again on the same port, once per death, up to MAX_RESTARTS, and never after the run stopped it. A tiny
HTTP server that answers /api/health stands in for Prefect's (fast, no Prefect server started)."""
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

from contrastive.engine.ports import free_port
from contrastive.errors import MclpipeError
from flows import local_server

HEALTHY = textwrap.dedent("""
    import http.server, sys
    print("stand-in server listening", flush=True)
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/api/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
""")


class FakeServer:
    """What supervise reads of an OwnedServer: its process, port, address and the command that starts it."""

    def __init__(self):
        self.port = free_port()
        self.address = f"http://127.0.0.1:{self.port}"
        self.api_url = f"{self.address}/api"
        self._stopping, self.restarts, self.started = False, 0, 0
        self.server_process = self._run_uvicorn_command()

    def _run_uvicorn_command(self) -> subprocess.Popen:
        self.started += 1
        return subprocess.Popen([sys.executable, "-c", HEALTHY, str(self.port)],
                                stdout=getattr(self, "output", None), stderr=subprocess.STDOUT)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self._stopping = True
        self.server_process.kill()
        self.server_process.wait()


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def supervised(monkeypatch, tmp_path):
    monkeypatch.setattr(local_server, "get_prefect_home", lambda: tmp_path / "prefect-home")
    monkeypatch.setattr(local_server, "SUPERVISE_SECONDS", 0.05)
    server = FakeServer()
    _wait(server.healthy, "the first server")
    thread = threading.Thread(target=local_server.supervise, args=(server,), daemon=True)
    thread.start()
    yield server, thread
    server.stop()
    thread.join(timeout=5)


def _kill(server) -> int:
    pid = server.server_process.pid
    server.server_process.send_signal(signal.SIGKILL)
    return pid


def test_a_killed_server_is_started_again_on_its_port_with_one_warning(supervised, caplog, tmp_path):
    server, _ = supervised
    with caplog.at_level(logging.INFO, logger="mclpipe"):
        killed = _kill(server)
        _wait(lambda: server.server_process.pid != killed and server.healthy(), "the restarted server")
    assert server.restarts == 1 and server.started == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "killed by signal 9" in warnings[0] and server.address in warnings[0] and "the run goes on" in warnings[0]
    # The restarted server writes to a log in PREFECT_HOME that the warning names, not to the run's terminal.
    log_path = tmp_path / "prefect-home" / local_server.SERVER_LOG
    assert str(log_path) in warnings[0]
    _wait(lambda: log_path.exists() and "stand-in server listening" in log_path.read_text(), "the restart's log")


def test_it_gives_up_after_max_restarts(supervised, caplog):
    server, thread = supervised
    with caplog.at_level(logging.INFO, logger="mclpipe"):
        for restart in range(1, local_server.MAX_RESTARTS + 1):
            killed = _kill(server)
            _wait(lambda: server.server_process.pid != killed and server.healthy(), f"restart {restart}")
        _kill(server)
        thread.join(timeout=10)
    assert not thread.is_alive() and server.restarts == local_server.MAX_RESTARTS
    assert server.started == local_server.MAX_RESTARTS + 1  # no start after the last death
    assert "not starting it again" in [r for r in caplog.records if r.levelno == logging.ERROR][-1].getMessage()


def test_a_server_the_run_stopped_is_not_started_again(supervised):
    server, thread = supervised
    server.stop()
    thread.join(timeout=5)
    assert not thread.is_alive() and server.started == 1 and server.restarts == 0


FAILING = 'import sys; print("stand-in server: database or disk is full", flush=True); sys.exit(1)'


@pytest.fixture
def owned_server(monkeypatch, tmp_path):
    """starting_local_server with Prefect's real start-up loop around a stand-in command (HEALTHY or FAILING);
    yields (PREFECT_HOME, with_command(script), the stand-in processes spawned)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    home = tmp_path / "prefect-home"
    monkeypatch.setattr(local_server, "get_prefect_home", lambda: home)
    monkeypatch.setattr(local_server, "needs_local_server", lambda: True)
    monkeypatch.setattr(local_server, "_sqlite_database", lambda: home / "prefect.db")
    earlier = SubprocessASGIServer._instances.get(None)
    spawned: list[subprocess.Popen] = []

    def with_command(script: str):
        def stand_in(*, port, output):
            spawned.append(subprocess.Popen([sys.executable, "-c", script, str(port)], stdout=output,
                                            stderr=subprocess.STDOUT))
            return spawned[-1]
        monkeypatch.setattr(local_server, "spawn_server_process", stand_in)

    with temporary_settings({PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 2}):
        yield home, with_command, spawned
    current = SubprocessASGIServer._instances.get(None)
    if current is not None and current is not earlier and getattr(current, "server_process", None) is not None:
        current.stop()
    SubprocessASGIServer._instances.pop(None, None)
    if earlier is not None:
        SubprocessASGIServer._instances[None] = earlier
    for process in spawned:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_server_starts_while_the_body_runs_and_writes_to_its_log(owned_server, capfd):
    home, with_command, spawned = owned_server
    with_command(HEALTHY)
    with local_server.starting_local_server() as started:
        # spawned on entry: its start-up overlaps the body's work
        _wait(lambda: (home / local_server.SERVER_LOG).exists()
              and "stand-in server listening" in (home / local_server.SERVER_LOG).read_text(), "the server's log")
    server = started.server
    try:
        assert server.running
        assert httpx.get(f"{server.api_url}/health", timeout=5).status_code == 200
        assert len(spawned) == 1  # the process spawned ahead is the one Prefect's start-up waited for
    finally:
        server.stop()
    assert "stand-in server listening" not in capfd.readouterr().out


def test_a_body_that_fails_stops_the_server_and_frees_the_start_up_lock(owned_server):
    home, with_command, spawned = owned_server
    with_command(HEALTHY)
    with pytest.raises(ValueError, match="a bad config"):
        with local_server.starting_local_server():
            raise ValueError("a bad config")
    assert len(spawned) == 1 and spawned[0].poll() is not None
    import fcntl
    with open(home / local_server.LOCK_NAME, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while the lock is held


def test_a_server_that_does_not_start_names_its_log(owned_server):
    home, with_command, _ = owned_server
    with_command(FAILING)
    with pytest.raises(MclpipeError) as raised:
        with local_server.starting_local_server():
            pass
    message = str(raised.value)
    assert str(home / local_server.SERVER_LOG) in message and "database or disk is full" in message


# ------------------------------------------------------------------------------------------ the database template
def test_a_new_sqlite_database_starts_as_a_copy_of_the_template_and_nothing_else_is_touched(monkeypatch, tmp_path):
    template, database = tmp_path / "share" / "prefect-x.db", tmp_path / "home" / "prefect.db"
    monkeypatch.setattr(local_server, "database_template", lambda: template)
    monkeypatch.setattr(local_server, "_sqlite_database", lambda: database)
    assert not local_server.seed_database() and not database.exists()  # no template: Prefect migrates as before
    template.parent.mkdir()
    template.write_bytes(b"migrated")
    assert local_server.seed_database() and database.read_bytes() == b"migrated"
    template.write_bytes(b"another install")
    assert not local_server.seed_database() and database.read_bytes() == b"migrated"  # an existing one stays
    assert [p.name for p in database.parent.iterdir()] == ["prefect.db"]  # no partial copy left behind
    monkeypatch.setattr(local_server, "_sqlite_database", lambda: None)  # PostgreSQL: nothing to copy
    assert not local_server.seed_database()


def test_the_database_url_names_the_file_to_seed():
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: "sqlite+aiosqlite:////data/p/prefect.db"}):
        assert str(local_server._sqlite_database()) == "/data/p/prefect.db"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: "postgresql+asyncpg://u@db:5432/prefect"}):
        assert local_server._sqlite_database() is None


def test_the_template_is_a_database_prefects_migrations_made(monkeypatch, tmp_path):
    """Prefect's own create_db and block registration in a process of its own: the tables, the migration head and
    the block types a server expects, so a server started on a copy finds nothing to migrate and no block type to
    add (4 MB of writes on a new database: on a small disk, before the run's first step)."""
    import sqlite3
    template = tmp_path / "share" / "prefect-x.db"
    monkeypatch.setattr(local_server, "database_template", lambda: template)
    assert local_server.make_database_template() == template
    with sqlite3.connect(template) as db:
        tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
        head = db.execute("select version_num from alembic_version").fetchall()
        block_types = {row[0] for row in db.execute("select slug from block_type")}
        schemas = db.execute("select count(*) from block_schema").fetchone()[0]
    assert {"flow_run", "task_run", "deployment", "work_pool"} <= tables and len(head) == 1
    assert {"local-file-system", "secret", "webhook"} <= block_types and schemas >= len(block_types)
    assert [p.name for p in template.parent.iterdir()] == [template.name]  # the scratch directory is gone


def test_the_server_process_is_spawned_before_prefects_server_package_is_imported(tmp_path):
    """The CLI's first Prefect step is the spawn: the server package (3 s of imports on 2 cores) is imported while
    the server process starts, not before it."""
    import os
    script = textwrap.dedent("""
        import sys
        from flows import local_server

        class Spawned(Exception):
            pass

        def spawn(*, port, output):
            raise Spawned("prefect.server.api.server" in sys.modules)

        local_server.spawn_server_process = spawn
        try:
            with local_server.starting_local_server():
                pass
        except Spawned as seen:
            sys.exit(3 if seen.args[0] else 0)
        sys.exit(4)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")} | {
        "PREFECT_HOME": str(tmp_path / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
