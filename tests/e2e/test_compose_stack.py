"""The team stack of docker-compose.yml started for real (issue 53), with docker-compose.local.yml for the images that
cannot be pulled here (PostgreSQL from Debian's package; the Prefect and MLflow servers and the worker from the
project's image): a deployment's run triggered through the Prefect API is picked up by the worker container, trains
and logs to MLflow with the credentials of the .env; both servers refuse a request without them; only loopback
is published; `docker-compose down` then `up` keeps the flow runs, the metrics and the models (named volumes).
Slow, in the "docker" group (tests/conftest.py) with test_container.py, whose image it uses."""
import base64
import ipaddress
import json
import secrets
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.container import REPO, built_image, docker
from tests.e2e.stack import Stack, status_of, tiny_run_args
from tests.e2e.worker import api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
FILES = ["-f", "docker-compose.yml", "-f", "docker-compose.local.yml"]
# a loopback address of its own: Prefect's and MLflow's fixed ports (4200, 5000) never meet another test's server
BIND = "127.0.0.53"
EXPERIMENT = "compose-stack"
# the team stack tests' shrunk tiny pipeline (two stages, no control), writing where the flow run's process (the
# worker's, working in the installed package) can: absolute paths on the worker's runs volume
RUN_SETS = tiny_run_args(Path("/home/mcl/app"), f"tracking.experiment={EXPERIMENT}")[1:]


class Compose:
    """`docker-compose` of this repository's files under a project name of its own, secrets in an env file."""

    def __init__(self, root: Path):
        self.root, self.project = root, f"mclpipe-test-{secrets.token_hex(4)}"
        self.secrets = {"POSTGRES_PASSWORD": secrets.token_urlsafe(16), "MINIO_ROOT_USER": "mclpipe",
                        "MINIO_ROOT_PASSWORD": secrets.token_urlsafe(16),
                        "PREFECT_API_AUTH_STRING": f"mclpipe:{secrets.token_urlsafe(16)}",
                        "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": secrets.token_urlsafe(16),
                        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(24)}
        base = "local/debian:bookworm" if docker("image", "inspect", "local/debian:bookworm",
                                                 check=False).returncode == 0 else "debian:bookworm-slim"
        settings = {**self.secrets, "MCLPIPE_BIND_ADDRESS": BIND, "MCLPIPE_MLFLOW_HOST": f"{BIND}:5000",
                    "MCLPIPE_PREFECT_URL": f"http://{BIND}:4200", "MCLPIPE_IMAGE": built_image(),
                    "MCLPIPE_BASE": base}
        self.env_file = root / "stack.env"
        self.env_file.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        self.stack = Stack(mlflow_url=f"http://{BIND}:5000", prefect_url=f"http://{BIND}:4200", root=root,
                           secrets=self.secrets, databases={})

    def __call__(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(["docker-compose", "--env-file", str(self.env_file), "-p", self.project, *FILES, *args],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"docker-compose {' '.join(args)}: {(done.stdout + done.stderr)[-4000:]}"
        return done

    def up(self) -> None:
        self("up", "-d")
        for url in (f"{self.stack.prefect_url}/api/health", f"{self.stack.mlflow_url}/health"):
            deadline = time.monotonic() + 300
            while status_of(url, timeout=10) != 200:
                assert time.monotonic() < deadline, f"{url} did not answer: {self('logs', '--tail', '60').stdout}"
                time.sleep(2)

    def logs(self) -> str:
        return self("logs", "--tail", "80", check=False).stdout[-8000:]



def mlflow_get(compose: Compose, path: str, body: dict | None = None) -> dict:
    """One call to MLflow's REST API with the admin's credentials: GET, or POST ``body`` (runs/search)."""
    user, password = compose.secrets["MLFLOW_TRACKING_USERNAME"], compose.secrets["MLFLOW_TRACKING_PASSWORD"]
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{compose.stack.mlflow_url}{path}", data=data, headers={
        "Content-Type": "application/json",
        "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def tracked(compose: Compose) -> dict:
    """What MLflow holds of the test's experiment: {run name: metrics} and the registered models' versions."""
    experiment = mlflow_get(compose, f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={EXPERIMENT}")
    runs = mlflow_get(compose, "/api/2.0/mlflow/runs/search", {
        "experiment_ids": [experiment["experiment"]["experiment_id"]], "max_results": 500})["runs"]
    models = mlflow_get(compose, "/api/2.0/mlflow/registered-models/search?max_results=100").get(
        "registered_models", [])
    return {"runs": {run["info"]["run_name"]: {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
                     for run in runs},
            "models": {model["name"]: [v["version"] for v in model.get("latest_versions", [])] for model in models}}


@pytest.fixture(scope="module")
def compose(tmp_path_factory):
    stack = Compose(tmp_path_factory.mktemp("compose"))
    try:
        stack("build", "postgres")
        stack.up()
        yield stack
    finally:
        stack("down", "-v", "--remove-orphans", check=False, timeout=300)


@pytest.fixture(scope="module")
def deployment_run(compose):
    """The tiny pipeline deployed from the worker container to a process pool, a flow run of it created through
    the Prefect API (the UI's Quick run), and the run once finished."""
    # the worker made its pool at start if it was missing
    compose("exec", "-T", "worker", "prefect", "work-pool", "create", "gpu", "--type", "process", "--overwrite")
    deployed = compose("exec", "-T", "worker", "mclpipe", "deploy", "trifeature_tiny", "--work-pool", "gpu",
                       *RUN_SETS)
    [deployment] = api(compose.stack, "/deployments/filter", {"deployments": {"name": {"any_": ["trifeature_tiny"]}}})
    flow_run_id = api(compose.stack, f"/deployments/{deployment['id']}/create_flow_run", {})["id"]
    deadline = time.monotonic() + 1800
    while (run := api(compose.stack, f"/flow_runs/{flow_run_id}", method="GET"))["state_type"] not in (
            "COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
        assert time.monotonic() < deadline, f"flow run {run['state_type']}: {compose.logs()}"
        time.sleep(3)
    assert run["state_type"] == "COMPLETED", f"{run['state']}\n{deployed.stdout}\n{compose.logs()}"
    return run


def test_a_deployment_run_triggered_through_the_api_trains_in_the_worker_container(compose, deployment_run):
    worker = compose("ps", "-q", "worker").stdout.strip()
    logs = docker("logs", worker)
    assert deployment_run["id"] in logs.stdout + logs.stderr  # this worker container picked it up
    found = tracked(compose)
    assert found["runs"], "no run in MLflow"
    assert any("train/loss" in metrics for metrics in found["runs"].values()), found  # trained, logged with them
    assert any(key.startswith("ami/") for metrics in found["runs"].values() for key in metrics), found  # k-means
    assert found["models"] and all(found["models"].values()), found
    summaries = compose("exec", "-T", "worker", "sh", "-c", "ls /home/mcl/app/runs/pipelines/*/summary.json")
    assert summaries.stdout.strip()


def test_every_endpoint_needs_the_credentials_and_only_loopback_is_published(compose):
    stack, prefect_auth = compose.stack, compose.secrets["PREFECT_API_AUTH_STRING"]
    user, password = compose.secrets["MLFLOW_TRACKING_USERNAME"], compose.secrets["MLFLOW_TRACKING_PASSWORD"]
    flow_runs = f"{stack.prefect_url}/api/flow_runs/filter"
    assert status_of(flow_runs, body={}) == 401
    assert status_of(flow_runs, body={}, auth=prefect_auth) == 200
    search = f"{stack.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1"
    for url in (search, f"{stack.mlflow_url}/api/2.0/mlflow-artifacts/artifacts", f"{stack.mlflow_url}/"):
        assert status_of(url) == 401, url
    assert status_of(search, auth=f"{user}:{password}") == 200
    published = []
    for container in compose("ps", "-q").stdout.split():
        ports = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Ports}}", container).stdout) or {}
        published += [binding["HostIp"] for bindings in ports.values() if bindings for binding in bindings]
    assert published and all(ipaddress.ip_address(host).is_loopback for host in published), published


def test_down_then_up_keeps_flow_runs_metrics_and_models(compose, deployment_run):
    before = tracked(compose)
    compose("down")  # not -v: the named volumes stay
    compose.up()

    assert tracked(compose) == before
    run = api(compose.stack, f"/flow_runs/{deployment_run['id']}", method="GET")
    assert run["state_type"] == "COMPLETED"
    summaries = compose("exec", "-T", "worker", "sh", "-c", "ls /home/mcl/app/runs/pipelines/*/summary.json")
    assert summaries.stdout.strip()
