"""The team stack of docker-compose.yml on this machine, for the slow tests: PostgreSQL (.ci/setup-postgres.sh), an
MLflow server (its basic-auth app) and a Prefect server (basic authentication) on fresh databases of it (dropped
afterwards), and `mclpipe run` against them as a user runs it. The servers are started with the same commands as
`make stack` (.ci/stack.sh), with random secrets in the stack's own .env written by `.ci/stack.sh secrets`."""
from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
import json
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from contrastive.engine.ports import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_PORT = int(os.environ.get("MCLPIPE_PG_PORT", "55432"))
PG_DIR = os.environ.get("MCLPIPE_PG_DIR", "/tmp/mclpipe-postgres")  # .ci/setup-postgres.sh's cluster


# what a client of the stack takes from .env (docker-compose.yml's worker, `mclpipe`, the tests)
CLIENT_SECRETS = ("PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def read_dotenv(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@dataclass
class Stack:
    mlflow_url: str
    prefect_url: str  # the UI; the API is prefect_url + "/api"
    root: Path
    secrets: dict[str, str]  # the stack's .env
    databases: dict[str, str]  # role ("mlflow", "mlflow_auth", "prefect") -> its PostgreSQL database

    def client_secrets(self) -> dict[str, str]:
        return {key: self.secrets[key] for key in CLIENT_SECRETS}

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PREFECT_API_URL": f"{self.prefect_url}/api", "MLFLOW_TRACKING_URI": self.mlflow_url,
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(self.root / "prefect-client"),
               "COLUMNS": "200", **self.client_secrets()}
        env.pop("PREFECT_UI_URL", None)
        return env

    def prefect_headers(self) -> dict[str, str]:
        """What Prefect's client sends with every API call (PREFECT_API_AUTH_STRING)."""
        token = base64.b64encode(self.secrets["PREFECT_API_AUTH_STRING"].encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def credentials(self) -> list[str]:
        """Every secret of .env, and each way a client sends one (base64 in an Authorization header): none of them
        may appear in a database, a log or an artifact."""
        user, password = self.secrets["MLFLOW_TRACKING_USERNAME"], self.secrets["MLFLOW_TRACKING_PASSWORD"]
        prefect = self.secrets["PREFECT_API_AUTH_STRING"]
        found = [password, prefect.split(":", 1)[1], self.secrets["MLFLOW_FLASK_SERVER_SECRET_KEY"]]
        return found + [base64.b64encode(text.encode()).decode() for text in (f"{user}:{password}", prefect)]

    def mclpipe(self, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "mclpipe"), *args], cwd=self.root, env=self.env(), capture_output=True,
                              text=True, timeout=timeout)


def psql(sql: str, database: str = "postgres") -> str:
    """As the cluster's superuser (trust authentication on 127.0.0.1, see .ci/setup-postgres.sh)."""
    command = ["psql", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres", "-d", database, "-tAq", "-c", sql]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def wait_for(url: str, process: subprocess.Popen, log: Path, seconds: float = 240) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited ({process.returncode}): {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s: {log.read_text()[-3000:]}")


@contextmanager
def team_stack(root: Path):
    """PostgreSQL + MLflow server + Prefect server, on databases made for this stack and dropped after it."""
    subprocess.run(["bash", str(REPO / ".ci" / "setup-postgres.sh")], check=True, capture_output=True, text=True)
    suffix = uuid.uuid4().hex[:8]
    databases = {"mlflow": f"mlflow_test_{suffix}", "mlflow_auth": f"mlflow_auth_test_{suffix}",
                 "prefect": f"prefect_test_{suffix}"}
    for name in databases.values():
        psql(f"CREATE DATABASE {name} OWNER mclpipe")
    pg = f"mclpipe:mclpipe@127.0.0.1:{PG_PORT}"
    secrets = stack_secrets(root)
    stack_sh("auth-config", str(root / "basic_auth.ini"), f"postgresql+psycopg2://{pg}/{databases['mlflow_auth']}")
    mlflow_port, prefect_port = free_port(), free_port()
    logs = {name: open(root / f"{name}.log", "w") for name in ("mlflow", "prefect")}
    mlflow_env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
                  "MLFLOW_AUTH_ADMIN_USERNAME": secrets["MLFLOW_TRACKING_USERNAME"],
                  "MLFLOW_AUTH_ADMIN_PASSWORD": secrets["MLFLOW_TRACKING_PASSWORD"],
                  "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets["MLFLOW_FLASK_SERVER_SECRET_KEY"]}
    mlflow = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(mlflow_port),
         "--workers", "1", "--backend-store-uri", f"postgresql+psycopg2://{pg}/{databases['mlflow']}",
         "--artifacts-destination", str(root / "mlartifacts")], env=mlflow_env, stdout=logs["mlflow"],
        stderr=subprocess.STDOUT)
    prefect_env = {**os.environ, "PREFECT_HOME": str(root / "prefect-server"),
                   "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "PREFECT_SERVER_API_AUTH_STRING": secrets["PREFECT_API_AUTH_STRING"],
                   "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://{pg}/{databases['prefect']}",
                   # the UI asks this address for its data (default 127.0.0.1:4200, not this server's port)
                   "PREFECT_UI_API_URL": f"http://127.0.0.1:{prefect_port}/api",
                   # the links in automations' notifications ({{ flow_run|ui_url }}, docs/ui.md)
                   "PREFECT_UI_URL": f"http://127.0.0.1:{prefect_port}"}
    prefect_env.pop("PREFECT_API_URL", None)
    prefect = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                                str(prefect_port)], env=prefect_env, stdout=logs["prefect"], stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{mlflow_port}/health", mlflow, root / "mlflow.log")
        wait_for(f"http://127.0.0.1:{prefect_port}/api/health", prefect, root / "prefect.log")
        stack = Stack(mlflow_url=f"http://127.0.0.1:{mlflow_port}", prefect_url=f"http://127.0.0.1:{prefect_port}",
                      root=root, secrets=secrets, databases=databases)
        # this process's MLflow clients (the tests read runs back) sign in as the worker and the CLI do
        saved = {key: os.environ.get(key) for key in CLIENT_SECRETS}
        os.environ.update(stack.client_secrets())
        try:
            yield stack
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    finally:
        for process in (mlflow, prefect):
            process.terminate()
        for process in (mlflow, prefect):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs.values():
            log.close()
        for name in databases.values():
            psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def stack_sh(*args: str) -> None:
    """`.ci/stack.sh` with this interpreter's venv, as `make stack` runs it."""
    subprocess.run(["bash", str(REPO / ".ci" / "stack.sh"), *args], check=True, capture_output=True, text=True,
                   env={**os.environ, "VENV": str(BIN.parent)}, cwd=REPO)


def stack_secrets(root: Path) -> dict[str, str]:
    """Random secrets in ``root/.env``, written as `make stack` writes the team's."""
    stack_sh("secrets", str(root / ".env"))
    return read_dotenv(root / ".env")


def pg_dump(database: str) -> str:
    """The whole database as SQL (schema and rows), as the cluster's superuser."""
    command = ["pg_dump", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres", "-d", database]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def credentials_found(stack: Stack) -> list[str]:
    """Where a secret of the stack's .env appears: in the MLflow and Prefect databases (params, tags, runs, flow
    run parameters, logs, events, artifacts' metadata) and in every file under the stack's root (the artifact
    store, the run directories, the servers' and the worker's logs) except .env itself; [] when nowhere."""
    secrets = stack.credentials()
    hits = []
    for database in stack.databases.values():
        dump = pg_dump(database)
        hits += [f"database {database}" for secret in secrets if secret in dump]
    for path in stack.root.rglob("*"):
        if path.is_file() and path.name != ".env":
            data = path.read_bytes()
            hits += [str(path) for secret in secrets if secret.encode() in data]
    return sorted(set(hits))


def tiny_run_args(root: Path, *extra: str) -> list[str]:
    """The tiny preset shrunk further: two stages, no control, small data (a minute or two on 2 cores)."""
    sets = [f"output_dir={root / 'runs'}", f"data.cache_dir={root / 'data'}", "mcl.num_stages=2", "mcl.control=false",
            "data.trifeature.num_train=128", "data.trifeature.num_test=64", "train.batch_size=16",
            "tracking.system_metrics_seconds=0.5", *extra]
    return ["trifeature_tiny", *[arg for s in sets for arg in ("--set", s)]]


def status_of(url: str, *, auth: str | None = None, body: dict | None = None, timeout: float = 120) -> int:
    """The HTTP status of one request (GET, or POST of ``body`` as JSON), with ``auth`` ("user:password") as basic
    authentication when given; 0 when nothing answers (the port closed: what an unpublished address gives)."""
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                    timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0
