"""What a researcher sees in MLflow and Prefect after a tiny pipeline (issue 16), read back through MLflow's client
from the sqlite store in tmp_path and through Prefect's client from the test harness's server."""
import asyncio
import json
import os
from pathlib import Path

import mlflow
import mlflow.artifacts
import mlflow.pyfunc
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from contrastive.data.loading import load_dataset
from contrastive.embeddings import load_embeddings
from contrastive.integrate import concat_normalized
from flows.pipeline import mcl_pipeline
from tasks.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from tests.flows.mlflow_runs import artifact_paths, run_tree


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """One two-stage pipeline and an identical rerun (every step reused), both finished."""
    from pipeline_config.loader import load_config
    root = tmp_path_factory.mktemp("ux")
    config = load_config("trifeature_tiny", [
        f"output_dir={root / 'runs'}", f"data.cache_dir={root / 'data'}", f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
        "mcl.num_stages=2", "mcl.control=false", "tracking.system_metrics_seconds=0.2",
        "data.trifeature.num_train=128", "data.trifeature.num_test=64", "train.batch_size=16"])
    first = mcl_pipeline(config)
    again = mcl_pipeline(config)
    return config, first, again, MlflowClient(tracking_uri=config.tracking.uri)


def stage_runs(client, parent_id):
    _, children = run_tree(client.tracking_uri)
    return {c.data.tags["stage"]: c for c in children if c.data.tags["mlflow.parentRunId"] == parent_id}


def test_experiment_opens_as_model_training_and_no_empty_default(pipeline):
    config, _, _, client = pipeline
    experiment = client.get_experiment_by_name(config.tracking.experiment)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert [e.name for e in client.search_experiments()] == [config.tracking.experiment]


def test_one_name_per_metric_without_spaces(pipeline):
    _, first, _, client = pipeline
    parent = client.get_run(first["mlflow_run_id"])
    metrics = parent.data.metrics
    assert not [k for k in metrics if " " in k]
    for name, slug in (("stage 0", "stage0"), ("stage 1", "stage1"), ("MCL concat", "mcl_concat")):
        for key, value in first["results"][name].items():
            assert metrics[f"eval/{slug}/{key}"] == pytest.approx(value)
    assert all(k.startswith("eval/") for k in metrics)  # the parent holds the results, under their one name


def test_stage_runs_hold_what_a_user_looks_for(pipeline):
    config, first, _, client = pipeline
    runs = stage_runs(client, first["mlflow_run_id"])
    assert set(runs) == {"0", "1"}
    files0, files1 = (artifact_paths(client, runs[s].info.run_id) for s in ("0", "1"))
    # stage 1 trained on the k-means of stage 0 and the pseudo-labels made from it: they are in stage 1's run
    assert not any(f.startswith(("clusters/", "pseudo_labels/")) for f in files0)
    assert {"clusters/assignments.npz", "clusters/cluster_sizes.png", "pseudo_labels/pseudo_labels.npz"} <= files1
    assert "kmeans/inertia" in runs["1"].data.metrics and "kmeans/inertia" not in runs["0"].data.metrics
    for files in (files0, files1):
        assert "checkpoints/last.pt" in files and "embeddings/manifest.json" in files
        assert not [f for f in files if f.endswith((".prev", ".sha256", ".tmp")) or ".prev." in f]
    # its description says its results
    assert "| probe/color |" in runs["0"].data.tags["mlflow.note.content"]
    # system metrics sampled while it trained
    assert any(k.startswith("system/cpu_utilization") for k in runs["0"].data.metrics)


def test_local_artifacts_are_one_copy_of_the_step_files(pipeline):
    config, first, _, client = pipeline
    run = stage_runs(client, first["mlflow_run_id"])["0"]
    logged = Path(run.info.artifact_uri.removeprefix("file://")) / "embeddings" / "ids.npy"
    step_file = next((Path(config.output_dir) / "steps").glob("export0-*")) / "embeddings" / "ids.npy"
    assert logged.stat().st_ino == step_file.stat().st_ino  # a hard link, not a second copy


def test_datasets_are_logged_as_run_inputs(pipeline):
    _, first, _, client = pipeline
    runs = stage_runs(client, first["mlflow_run_id"])
    inputs = {run: [(d.dataset.name, {t.key: t.value for t in d.tags}["mlflow.data.context"],
                     json.loads(d.dataset.profile)) for d in client.get_run(runs[run].info.run_id).inputs.dataset_inputs]
              for run in runs}
    assert [(name.startswith("trifeature"), context, profile["num_samples"]) for name, context, profile in inputs["0"]] \
        == [(True, "train", 128)]
    assert sorted(context for _, context, _ in inputs["1"]) == ["pseudo_labels", "train"]


def test_the_pipeline_model_loads_by_name_and_gives_the_exported_embeddings(pipeline):
    config, first, _, client = pipeline
    runs = stage_runs(client, first["mlflow_run_id"])
    for run in runs.values():  # each stage's encoder is a logged model of its run
        assert len(client.get_run(run.info.run_id).outputs.model_outputs) == 1
    assert first["model"]["registered_uri"] == f"models:/{config.name}@current"
    mlflow.set_tracking_uri(config.tracking.uri)  # where "models:/<name>@current" is looked up
    model = mlflow.pyfunc.load_model(first["model"]["registered_uri"])
    data_dir = next(Path(config.data.cache_dir).glob("trifeature*"))
    dataset = load_dataset(data_dir)
    rows = np.arange(10)
    predicted = model.predict(dataset.get_batch(rows).numpy())
    exports = sorted((Path(config.output_dir) / "steps").glob("export*-*"))
    expected = concat_normalized(stage_embeddings=[load_embeddings(directory=e / "embeddings")[1][rows] for e in exports])
    assert predicted.shape == expected.shape and expected.shape[0] == 10
    np.testing.assert_allclose(predicted, expected, atol=2e-3)  # exports are float16


def test_prefect_and_mlflow_link_both_ways(pipeline):
    config, first, _, client = pipeline
    parent = client.get_run(first["mlflow_run_id"])
    flow_url = parent.data.tags["prefect.flow_run_url"]
    assert flow_url.endswith(f"/runs/flow-run/{parent.data.tags['prefect.flow_run_id']}")
    description = parent.data.tags["mlflow.note.content"]
    for label, run in first["stage_runs"].items():
        assert run["url"] in description and label in description
    assert flow_url in description

    async def artifacts():
        from prefect.client.orchestration import get_client
        async with get_client() as prefect:  # the UI's own query: the flow run's artifacts
            response = await prefect._client.post("/artifacts/filter", json={
                "artifacts": {"flow_run_id": {"any_": [parent.data.tags["prefect.flow_run_id"]]}},
                "limit": 100, "offset": 0, "sort": "CREATED_DESC"})
            run = await prefect.read_flow_run(parent.data.tags["prefect.flow_run_id"])
            return response.json(), run.name
    found, flow_run_name = asyncio.run(artifacts())
    assert flow_run_name == f"{config.name} image {config.config_hash()[:8]}"  # says which pipeline and config
    # Prefect 3.8 stores a link artifact as the markdown link "[text](url)"
    links = {a["data"].split("](")[-1].rstrip(")") for a in found if str(a["data"]).startswith("[")}
    assert {first["mlflow_url"], *(r["url"] for r in first["stage_runs"].values())} <= links
    assert any(a["type"] == "table" for a in found)


def test_a_rerun_that_reuses_every_step_opens_no_empty_runs(pipeline):
    config, first, again, client = pipeline
    parents, children = run_tree(config.tracking.uri)
    assert len(parents) == 2 and len(children) == 2  # the rerun opened no stage run
    assert again["stage_runs"] == first["stage_runs"]  # it points at the runs that hold the stages
    rerun_parent = client.get_run(again["mlflow_run_id"])
    assert rerun_parent.data.tags["stage_run.mcl.stage.1"] == first["stage_runs"]["mcl stage 1"]["run_id"]
    assert rerun_parent.data.metrics["eval/mcl_concat/probe/color"] == first["results"]["MCL concat"]["probe/color"]
    saved = json.loads((Path(again["dir"]) / "summary.json").read_text())
    assert saved["stage_runs"] == first["stage_runs"] and saved["mlflow_run_id"] == again["mlflow_run_id"]
    logged = mlflow.artifacts.download_artifacts(run_id=again["mlflow_run_id"], artifact_path="eval/summary.json",
                                                 tracking_uri=config.tracking.uri)
    assert json.loads(Path(logged).read_text())["stage_runs"] == first["stage_runs"]  # the run's copy too
    # the second registration moved the alias to the rerun's model version
    version = client.get_model_version_by_alias(config.name, "current")
    assert version.run_id == again["mlflow_run_id"]


def test_cli_prints_a_working_command_and_unbroken_urls(pipeline, capsys):
    from rich.console import Console

    import flows.cli as cli
    config, first, _, _ = pipeline
    narrow = Console(width=40, force_terminal=False)
    original, cli.console = cli.console, narrow
    try:
        cli.print_links(config, first)
    finally:
        cli.console = original
    lines = capsys.readouterr().out.splitlines()
    assert first["mlflow_url"] in lines  # whole, on a line of its own, though longer than the 40-column terminal
    command = lines[0]
    make = f"make -C {Path.cwd()} ui-mlflow"  # the checkout's Makefile, from any directory
    assert f".venv/bin/mlflow ui --backend-store-uri {config.tracking.uri}" in command or make in command
    assert Path(command.split("`")[1].split()[0]).exists() or command.split("`")[1] == make


def test_one_prefect_home_for_make_and_the_venv_entry_point(tmp_path):
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "PREFECT_API_URL")}
    probe = "import flows.cli, os; print(os.environ['PREFECT_HOME'])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(tmp_path / ".prefect")
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "export PREFECT_HOME ?= $(CURDIR)/.prefect" in makefile
