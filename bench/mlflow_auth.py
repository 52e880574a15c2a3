"""MLflow's basic-auth password check, with and without its credential cache (``auth_cache_ttl_seconds`` of
deploy/mlflow-basic-auth.ini, the config the compose stack and ``.ci/stack.sh`` serve).

Two ``mlflow server --app-name basic-auth`` processes on SQLite: the project's auth config as it is (baseline: the
same file with the cache off, MLflow's default), the same authenticated requests sent to each in turn, in rounds
(A B B A ...): one ``runs/log-batch`` of a few metrics each, what a training run sends every few steps. Measured:
the server's CPU seconds per request (its whole process tree, from /proc through psutil) and the client's wall
time per request; the ratio is the uncached server's CPU per request over the cached one's.
"""
from __future__ import annotations

import base64
import configparser
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import Result, log, module_main, threads_note
from contrastive.engine.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
AUTH_INI = ROOT / "deploy" / "mlflow-basic-auth.ini"
START_TIMEOUT_S = 300


class AuthServer:
    """One basic-auth MLflow server in ``root`` with the project's auth config, its cache set to ``cache_ttl``."""

    def __init__(self, root: Path, *, cache_ttl: int, password: str) -> None:
        import psutil

        root.mkdir(parents=True)
        config = configparser.ConfigParser()
        config.read(AUTH_INI)
        config["mlflow"]["database_uri"] = f"sqlite:///{root / 'auth.db'}"
        config["mlflow"]["auth_cache_ttl_seconds"] = str(cache_ttl)
        with open(root / "auth.ini", "w") as f:
            config.write(f)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = base64.b64encode(f"{config['mlflow']['admin_username']}:{password}".encode()).decode()
        env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(root / "auth.ini"), "MLFLOW_AUTH_ADMIN_PASSWORD": password,
               "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
        self.log = root / "server.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).parent / "mlflow"), "server", "--app-name", "basic-auth", "--host",
                 "127.0.0.1", "--port", str(self.port), "--workers", "1", "--backend-store-uri",
                 f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
                env=env, stdout=out, stderr=subprocess.STDOUT)
        self.tree = psutil.Process(self.process.pid)

    def wait(self) -> None:
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the MLflow server exited: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=5)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the MLflow server did not answer in {START_TIMEOUT_S} s: {self.log.read_text()[-2000:]}")

    def call(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.url}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Basic {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read() or b"{}")

    def cpu_seconds(self) -> float:
        """CPU seconds of the server and every process under it (uvicorn's worker serves the requests)."""
        total = 0.0
        for process in [self.tree, *self.tree.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except Exception:  # noqa: BLE001 - a helper process that ended between listing and reading
                continue
            total += times.user + times.system
        return total

    def stop(self) -> None:
        for process in [*self.tree.children(recursive=True), self.tree]:
            try:
                process.terminate()
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.process.wait(timeout=60)


def log_batches(server: AuthServer, run_id: str, *, count: int, first_step: int) -> tuple[float, float]:
    """(wall seconds, server CPU seconds) of ``count`` log-batch requests."""
    cpu = server.cpu_seconds()
    start = time.perf_counter()
    for step in range(first_step, first_step + count):
        server.call("runs/log-batch", {"run_id": run_id, "metrics": [
            {"key": key, "value": float(step), "timestamp": int(time.time() * 1000), "step": step}
            for key in ("train/loss", "train/lr", "train/temperature")]})
    return time.perf_counter() - start, server.cpu_seconds() - cpu


def run(*, quick: bool) -> list[Result]:
    rounds, per_round = (3, 5) if quick else (6, 10)
    password = secrets.token_urlsafe(24)
    root = Path(tempfile.mkdtemp(prefix="bench-mlflow-auth-"))
    servers = {"cache off (MLflow's default)": AuthServer(root / "off", cache_ttl=0, password=password),
               "cache on (deploy/mlflow-basic-auth.ini)": AuthServer(root / "on", cache_ttl=int(project_cache_ttl()),
                                                                      password=password)}
    try:
        for server in servers.values():
            server.wait()
        runs = {}
        for name, server in servers.items():
            experiment = server.call("experiments/create", {"name": "bench"})["experiment_id"]
            runs[name] = server.call("runs/create", {"experiment_id": experiment})["run"]["info"]["run_id"]
            log_batches(server, runs[name], count=2, first_step=0)  # the first calls pay imports and table loads
        walls = {name: [] for name in servers}
        cpus = {name: [] for name in servers}
        order = list(servers)
        for index in range(rounds):
            for name in (order if index % 2 == 0 else order[::-1]):
                wall, cpu = log_batches(servers[name], runs[name], count=per_round, first_step=2 + index * per_round)
                walls[name].append(wall / per_round)
                cpus[name].append(cpu / per_round)
                log(f"{name}: {wall / per_round * 1000:.0f} ms a request, server CPU {cpu / per_round * 1000:.0f} ms")
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    off, on = order
    cpu_off, cpu_on = statistics.median(cpus[off]), statistics.median(cpus[on])
    wall_off, wall_on = statistics.median(walls[off]), statistics.median(walls[on])
    return [Result(
        name="MLflow basic-auth: server CPU per authenticated request",
        workload=f"{rounds} rounds of {per_round} runs/log-batch requests (3 metrics) to each of two basic-auth "
                 "servers on SQLite, one worker each, the rounds interleaved",
        baseline=off, baseline_s=cpu_off, ours_s=cpu_on, ratio=cpu_off / cpu_on if cpu_on > 0 else None,
        ratio_note="server CPU seconds per request, median of the rounds", goal="informational", passed=None,
        notes=[f"client wall time per request: {wall_off * 1000:.0f} ms cache off, {wall_on * 1000:.0f} ms cache on",
               threads_note()],
        details={"cpu_per_request_s": {name: cpus[name] for name in servers},
                 "wall_per_request_s": {name: walls[name] for name in servers}})]


def project_cache_ttl() -> str:
    """The cache's time to live that deploy/mlflow-basic-auth.ini sets."""
    config = configparser.ConfigParser()
    config.read(AUTH_INI)
    return config["mlflow"]["auth_cache_ttl_seconds"]


if __name__ == "__main__":
    module_main(run)
