"""The team stack without Docker (issue 16): `mclpipe run` against an MLflow server and a Prefect server, both on
PostgreSQL, then the run tree, the registered model and the links between the two UIs read back from the servers.
Closed by default (issue 36): both servers refuse a request without the credentials of the stack's .env, and no
credential lands in their databases, the logs or the artifacts."""
import json
import urllib.request

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tasks.tracking import TRAINING_VIEW
from tests.e2e.stack import credentials_found, status_of

# a flow run through the worker may wait 900 s on a loaded machine (tests/e2e/worker.py), plus the stack's start
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def prefect_api(stack, path: str, body: dict | None = None):
    request = urllib.request.Request(f"{stack.prefect_url}/api{path}", data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json", **stack.prefect_headers()},
                                     method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_tiny_pipeline_on_the_postgres_stack(team_stack_run):
    stack, result = team_stack_run  # `mclpipe run` on the stack finished (tests/e2e/conftest.py)

    client = MlflowClient(tracking_uri=stack.mlflow_url)
    experiment = client.get_experiment_by_name("mclpipe")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "pipeline"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    # artifacts went to the server's store over HTTP (a worker's disk is not the team's)
    stage1 = next(c for c in children if c.data.tags["stage"] == "1")
    assert {"clusters", "pseudo_labels", "embeddings", "checkpoints"} <= {
        a.path for a in client.list_artifacts(stage1.info.run_id)}
    assert "pseudo_labels_stage1" in {d.dataset.name for d in client.get_run(stage1.info.run_id).inputs.dataset_inputs}

    # the registered model, loaded by name from the server
    mlflow.set_tracking_uri(stack.mlflow_url)
    model = mlflow.pyfunc.load_model("models:/stack_tiny@current")
    images = np.random.default_rng(0).integers(0, 256, size=(3, 3, 16, 16), dtype=np.uint8)
    embeddings = model.predict(images)
    assert embeddings.shape[0] == 3 and np.allclose(np.linalg.norm(embeddings, axis=1), np.sqrt(2), atol=1e-4)

    # Prefect (on PostgreSQL) holds the flow run; the two UIs link to each other
    # (the worker tests' deployment runs on the same stack are not this `mclpipe run`'s)
    flow_runs = prefect_api(stack, "/flow_runs/filter", {"flow_runs": {"deployment_id": {"is_null_": True}},
                                                         "limit": 10})
    assert len(flow_runs) == 1 and flow_runs[0]["state_type"] == "COMPLETED"
    flow_run_id = flow_runs[0]["id"]
    assert parent.data.tags["prefect.flow_run_url"] == f"{stack.prefect_url}/runs/flow-run/{flow_run_id}"
    artifacts = prefect_api(stack, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}},
                                                         "limit": 100, "offset": 0, "sort": "CREATED_DESC"})
    links = {a["data"].split("](")[-1].rstrip(")") for a in artifacts if str(a["data"]).startswith("[")}
    assert f"{stack.mlflow_url}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}{TRAINING_VIEW}" in links
    assert f"{stack.mlflow_url}/#/experiments/{experiment.experiment_id}/runs/{stage1.info.run_id}{TRAINING_VIEW}" in links
    # the end-of-run report printed the server's URL whole
    assert f"{stack.mlflow_url}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}{TRAINING_VIEW}" in \
        result.stdout.splitlines()



def test_both_servers_refuse_requests_without_the_credentials(team_stack):
    stack = team_stack
    prefect_auth = stack.secrets["PREFECT_API_AUTH_STRING"]
    user, password = stack.secrets["MLFLOW_TRACKING_USERNAME"], stack.secrets["MLFLOW_TRACKING_PASSWORD"]
    flow_runs = f"{stack.prefect_url}/api/flow_runs/filter"
    # Prefect's API: nothing without the auth string; its health probe stays open (what a load balancer polls)
    assert status_of(flow_runs, body={}) == 401
    assert status_of(flow_runs, body={}, auth=prefect_auth.split(":")[0] + ":wrong") == 401
    assert status_of(flow_runs, body={}, auth=prefect_auth) == 200
    assert status_of(f"{stack.prefect_url}/api/health") == 200
    # MLflow: the REST API, the artifact proxy and the UI ask for a login; MLflow's old default admin password
    # (password1234) is never accepted, the admin's password is the one from .env
    search = f"{stack.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1"
    for url in (search, f"{stack.mlflow_url}/api/2.0/mlflow-artifacts/artifacts", f"{stack.mlflow_url}/"):
        assert status_of(url) == 401, url
    assert status_of(search, auth=f"{user}:password1234") == 401
    assert status_of(search, auth=f"{user}:{password}x") == 401
    assert status_of(search, auth=f"{user}:{password}") == 200


def test_no_credential_in_the_databases_logs_or_artifacts(team_stack_run):
    """After `mclpipe run` on the stack: pg_dump of the MLflow and Prefect databases, the artifact store, the run
    directory and the servers' logs hold none of .env's secrets (tests/e2e/conftest.py checks again once every
    test of the session, the worker's flow runs included, is done)."""
    stack, result = team_stack_run
    assert credentials_found(stack) == []
    assert not [secret for secret in stack.credentials() if secret in result.stdout + result.stderr]
