"""Against a real `mlflow server` on loopback: a pipeline over HTTP, two pipelines at once, an unreachable server."""
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from contrastive.engine.ports import free_port
from flows.pipeline import mcl_pipeline
from tasks.tracking import Tracker, TrackingError


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "art"),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("mlflow server did not start within 120 s")
    yield url
    process.terminate()
    process.wait(timeout=30)


def test_two_pipelines_at_once_over_http_do_not_mix(tiny_config, mlflow_server):
    configs = [tiny_config("mcl.num_stages=2", "mcl.control=false", f"seed={seed}", f"tracking.uri={mlflow_server}",
                           "tracking.experiment=shared") for seed in (0, 1)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        summaries = list(pool.map(mcl_pipeline, configs))
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("shared")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = {r.info.run_id: r for r in runs if r.data.tags.get("kind") == "pipeline"}
    assert {s["mlflow_run_id"] for s in summaries} == set(parents)
    for child in (r for r in runs if r.info.run_id not in parents):
        parent = parents[child.data.tags["mlflow.parentRunId"]]
        assert child.data.tags["pipeline_id"] == parent.data.tags["pipeline_id"]
    assert len({p.data.tags["pipeline_id"] for p in parents.values()}) == 2
    stage1 = next(r for r in runs if r.data.tags.get("stage") == "1")
    assert any(a.path == "model" for a in client.list_artifacts(stage1.info.run_id))  # uploaded over HTTP


def test_unreachable_server_fails_fast_with_the_fix():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.time()
    with pytest.raises(TrackingError, match="Start the server or fix tracking.uri"):
        Tracker(uri=url, experiment="x", retries=1, backoff_seconds=0.1)
    assert time.time() - started < 60
