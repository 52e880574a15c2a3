"""The temporary local Prefect server of a ``mclpipe`` command run without PREFECT_API_URL, tied to that command.

Prefect starts its own temporary server (``SubprocessASGIServer``) as a plain child in the CLI's process group.
Ctrl-C in a terminal reaches that child too, it shuts down at once, and the CLI can no longer record what happened
(it retried for minutes and left the flow run "Running"); and a CLI killed without cleanup (SIGKILL, or SIGTERM
outside a flow) leaves it running for ever. The server started here instead

* runs in its own session, so a terminal's Ctrl-C reaches the CLI only; the CLI records the interrupted state and
  then stops the server itself (at exit);
* goes when the CLI goes, whatever kills it: the server process asks the kernel for SIGTERM when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``) and a watchdog thread polls the parent pid as a second guard (and on systems
  without prctl); a server that has not stopped 5 s after that exits hard;
* starts under a file lock in PREFECT_HOME, so two pipelines started together do not create or migrate the same
  Prefect database at the same time;
* is started again when it dies under the run (the OOM killer, a stray ``kill -9``): on the same port and the same
  database in PREFECT_HOME, so the flow run's own client, which retries each call for about a minute
  (``PREFECT_CLIENT_MAX_RETRIES``), carries on where it was and the training never notices. One warning says so;
  after ``MAX_RESTARTS`` deaths the run is left to end in the one line of ``flows.faults`` (the command that
  continues);
* starts a fresh sqlite database from a copy of an empty, already migrated one when the install made it
  (``make install`` runs ``python -m flows.local_server --make-template``; one file per Prefect version under the
  venv's ``share/mclpipe``): Prefect's migrations of a new database take 6-7 s of a first run's start on 2 cores,
  the copy of 1 MB none; without the template, or with another Prefect, the server migrates as before;
* writes its output to ``PREFECT_HOME/temporary-server.log``, not the run's terminal: what it logs (a 500 with the
  database's traceback when the disk fills, the events a restart drops) is its business; the run reports the
  outcome in its own words, and a server that cannot start names that log.

It takes the place of Prefect's default instance (``SubprocessASGIServer._instances[None]``, as Prefect's own test
harness does), so every Prefect client in the process talks to it. Run as ``python -m flows.local_server PARENT_PID
UVICORN_ARGS...`` it is the server process itself.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from contrastive.engine.ports import free_port
from contrastive.engine.signals import set_parent_death_signal
from contrastive.errors import MclpipeError

WATCHDOG_SECONDS = 0.25
HARD_EXIT_SECONDS = 5.0
LOCK_NAME = ".mclpipe-server-start.lock"
SERVER_LOG = "temporary-server.log"
#: Deaths of the temporary server a run outlives; one more ends it (a server that keeps dying is not transient).
#: MCLPIPE_PREFECT_SERVER_RESTARTS overrides it (0: a death ends the run at once, with the command that continues).
MAX_RESTARTS = 3
RESTARTS_ENV = "MCLPIPE_PREFECT_SERVER_RESTARTS"
SUPERVISE_SECONDS = 0.5
RESTART_HEALTH_SECONDS = 120.0

log = logging.getLogger("mclpipe")


# ------------------------------------------------------------------------------------------------ in the CLI
def spawn_server_process(*, port: int, output) -> subprocess.Popen:
    """The server process on ``port`` (its output to the open file ``output``): Prefect's own command and
    environment for its temporary server (UI off, marked ephemeral), behind this module's watchdog. Needs no import
    of Prefect's server package (3 s on 2 cores), so the process starts before the CLI has paid for it."""
    import prefect
    from prefect.settings import get_current_settings

    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "flows.local_server", str(os.getpid()),
         "--app-dir", str(prefect.__module_path__.parent), "--factory",
         "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "error", "--lifespan", "on"],
        env=env, start_new_session=True, stdout=output, stderr=subprocess.STDOUT)


def _server_class():
    from prefect.server.api.server import SubprocessASGIServer

    class OwnedServer(SubprocessASGIServer):
        """Prefect's temporary server, started in its own session under ``python -m flows.local_server``."""

        def _run_uvicorn_command(self) -> subprocess.Popen:
            early, self.early_process = getattr(self, "early_process", None), None
            if early is not None and early.poll() is None:
                return early  # spawned ahead by starting_local_server
            return self.spawn()

        def spawn(self) -> subprocess.Popen:
            return spawn_server_process(port=self.port, output=getattr(self, "output", None))

        def start(self, timeout: int | None = None) -> None:
            super().start(timeout)
            if self.running and getattr(self, "_supervisor", None) is None:
                self._stopping, self.restarts = False, 0
                self._supervisor = threading.Thread(target=supervise, args=(self,), name="prefect-server-supervisor",
                                                    daemon=True)
                self._supervisor.start()

        def stop(self) -> None:
            self._stopping = True  # an exit from here on is ours, not a death to recover from
            super().stop()

    return OwnedServer


def _died(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def supervise(server) -> None:
    """Start ``server`` (an OwnedServer) again, on its port and database, whenever its process dies while the run
    still needs it; give up after MAX_RESTARTS deaths (module docstring)."""
    max_restarts = int(os.environ.get(RESTARTS_ENV, MAX_RESTARTS))
    while not server._stopping:
        process = server.server_process
        code = process.poll() if process is not None else None
        if code is None:
            time.sleep(SUPERVISE_SECONDS)
            continue
        if server._stopping:
            return
        if server.restarts >= max_restarts:
            log.error("the temporary Prefect server died (%s) after %d restart(s): not starting it again (%s=%d)",
                      _died(code), server.restarts, RESTARTS_ENV, max_restarts)
            return
        server.restarts += 1
        home = get_prefect_home()
        log.warning("the temporary Prefect server died (%s: out of memory?); starting it again on %s with the same "
                    "database, the run goes on (restart %d of at most %d; its log: %s)", _died(code), server.address,
                    server.restarts, max_restarts, home / SERVER_LOG)
        restart(server, home=home)


def get_prefect_home() -> Path:
    from prefect.settings import get_current_settings
    return Path(get_current_settings().home)


def restart(server, *, home: Path) -> None:
    """A new server process on ``server``'s port, under the start-up lock of ``home`` (PREFECT_HOME); returns once it
    answers /health, dies at start-up (the supervisor sees that and counts it) or RESTART_HEALTH_SECONDS pass. Its
    output goes to ``home / SERVER_LOG``, not the terminal: a server restarted under a live flow run logs what it makes of the
    events and states the client retried through the gap (e.g. its event persister dropping a batch, with a
    traceback), which is its business, not the run's."""
    import httpx

    if getattr(server, "output", None) is None:
        server.output = open_server_log(home)
    with _startup_lock(home):
        server.server_process = server._run_uvicorn_command()
    deadline = time.monotonic() + RESTART_HEALTH_SECONDS
    with httpx.Client() as client:
        while time.monotonic() < deadline and not server._stopping:
            if server.server_process.poll() is not None:
                return
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.api_url}/health", timeout=2).status_code == 200:
                    log.info("the temporary Prefect server answers again on %s", server.address)
                    return
            time.sleep(0.2)


def needs_local_server() -> bool:
    """True when Prefect would start a temporary server: no PREFECT_API_URL, and no server of a test harness."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return False
    # A harness's server is registered in Prefect's server module; not imported yet, there is none (and the check
    # does not pay the module's 3 s import before the spawn).
    server_module = sys.modules.get("prefect.server.api.server")
    existing = server_module.SubprocessASGIServer._instances.get(None) if server_module is not None else None
    return existing is None or not existing.running


@contextlib.contextmanager
def _startup_lock(home: Path):
    """Serialise server start-ups (and so database creation and migration) of one PREFECT_HOME."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / LOCK_NAME, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_server_log(home: Path):
    """``home / SERVER_LOG`` opened for appending: the server process writes to it for the rest of the run."""
    home.mkdir(parents=True, exist_ok=True)
    return open(home / SERVER_LOG, "ab")  # noqa: SIM115 - handed to the server process, closed with the CLI


def _log_tail(path: Path, *, lines: int = 3) -> str:
    try:
        return " | ".join(line.strip() for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ------------------------------------------------------------------------------------- the database template
SQLITE_PREFIX = "sqlite+aiosqlite:///"


def database_template() -> Path:
    """Where this install keeps its empty, migrated Prefect database (one per Prefect version)."""
    import prefect
    return Path(sys.prefix) / "share" / "mclpipe" / f"prefect-{prefect.__version__}.db"


def _sqlite_database() -> Path | None:
    """The file of the server's database when it is sqlite (the default, in PREFECT_HOME); None otherwise."""
    from prefect.settings import get_current_settings
    url = get_current_settings().server.database.connection_url
    url = url.get_secret_value() if url is not None else ""
    if not url.startswith(SQLITE_PREFIX) or ":memory:" in url:
        return None
    return Path(url[len(SQLITE_PREFIX):].split("?", 1)[0])


def seed_database() -> bool:
    """Copy the template into place when the server's sqlite database does not exist yet; True when it did. Call
    under the start-up lock (no other server of this home is creating the database)."""
    database, template = _sqlite_database(), database_template()
    if database is None or database.exists() or not template.is_file():
        return False
    import shutil
    database.parent.mkdir(parents=True, exist_ok=True)
    partial = database.with_name(f".{database.name}.{os.getpid()}.tmp")
    shutil.copyfile(template, partial)
    partial.replace(database)  # whole or absent: a copy cut short never passes for a database
    return True


# Prefect's migrations and its block registration (54 block types and 64 schemas, what every server writes at its
# first start: 4 MB of write-ahead log on a new database, before a run's first step), then the log folded into the
# file and switched off: the template is one self-contained file (a copy of the main file alone would lose what the
# log still held); Prefect's server turns WAL on again when it opens the copy.
MAKE_TEMPLATE = """
import asyncio, sqlite3, sys
from prefect.server.database import provide_database_interface
from prefect.server.models.block_registration import run_block_auto_registration

async def create():
    database = provide_database_interface()
    await database.create_db()
    session = await database.session()
    async with session:  # as Prefect's server does: the registration begins and commits its own transactions
        await run_block_auto_registration(session=session)
        await session.commit()

asyncio.run(create())
with sqlite3.connect(sys.argv[1]) as connection:
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.execute("PRAGMA journal_mode=DELETE")
connection.close()
"""


def make_database_template() -> Path:
    """Create :func:`database_template`: Prefect's own migrations on a new sqlite file, in a process of its own
    (Prefect reads its database URL once, at import); replaced atomically, so a run never copies half of it."""
    import tempfile
    target = database_template()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        database = Path(scratch) / "prefect.db"
        env = {**os.environ, "PREFECT_HOME": scratch, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_API_DATABASE_CONNECTION_URL": f"{SQLITE_PREFIX}{database}"}
        done = subprocess.run([sys.executable, "-c", MAKE_TEMPLATE, str(database)], env=env, capture_output=True,
                              text=True)
        if done.returncode != 0 or not database.is_file():
            raise MclpipeError(f"could not create the Prefect database template ({done.stderr.strip()[-500:]}); "
                               "runs still work, migrating each new database as they start")
        database.replace(target)
    return target


class StartingServer:
    """What :func:`starting_local_server` yields: ``server``, the OwnedServer, once the body has run."""
    server = None


@contextlib.contextmanager
def starting_local_server():
    """Start the temporary server described above (when Prefect would start one: no PREFECT_API_URL, no running
    server) while the body runs, and make it Prefect's default: its process is spawned on entry and waited for on
    exit, so its start-up (imports and database migrations, about 10 s on 2 cores) overlaps the body's work (the
    CLI's checks, MLflow's start). A body that raises stops it. A server that does not start raises MclpipeError
    with the end of its log, the log's path and the way round it (a server of one's own). PREFECT_HOME's start-up
    lock is held from the spawn until it answers."""
    if not needs_local_server():
        yield None
        return
    home = get_prefect_home()
    output = open_server_log(home)
    with _startup_lock(home):
        seed_database()
        port = free_port()
        early_process = spawn_server_process(port=port, output=output)
        started = StartingServer()
        try:
            yield started
        except BaseException:
            early_process.kill()
            early_process.wait()
            raise
        from prefect.server.api.server import SubprocessASGIServer

        SubprocessASGIServer._instances.pop(None, None)
        server = started.server = _server_class()()  # registers itself as the default instance (key None)
        server.output, server.port, server.early_process = output, port, early_process
        try:
            server.start()  # takes the early process (OwnedServer._run_uvicorn_command) and waits for /health
        except RuntimeError as error:
            raise MclpipeError(
                f"the temporary Prefect server did not start ({error}); its log {home / SERVER_LOG} ends with: "
                f"{_log_tail(home / SERVER_LOG)}. Fix what it names (a full disk, a broken database in {home}), "
                "or start a server of your own (`prefect server start`) and set PREFECT_API_URL to it") from error


# ------------------------------------------------------------------------------------------------ in the server
def _stop_self() -> None:
    """SIGTERM to this process (uvicorn shuts down gracefully), then a hard exit if it has not gone."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(HARD_EXIT_SECONDS)
    os._exit(1)


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCHDOG_SECONDS)
    _stop_self()


def die_with_parent(parent_pid: int) -> None:
    """Stop this process when ``parent_pid`` is no longer its parent (it died; we were re-parented)."""
    set_parent_death_signal(signal.SIGTERM)
    # The parent may have died before prctl took effect: the watchdog sees that at its first look.
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watchdog", daemon=True).start()


def main(argv: list[str]) -> None:
    if argv == ["--make-template"]:
        print(f"Prefect database template: {make_database_template()}")
        return
    die_with_parent(int(argv[0]))
    from uvicorn.main import main as uvicorn_main

    uvicorn_main.main(args=argv[1:], prog_name="uvicorn")


if __name__ == "__main__":
    main(sys.argv[1:])
