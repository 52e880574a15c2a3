"""The sweep flow under Prefect's test harness: child flow runs, shared stage 0, the comparison, and a rerun that
computes nothing."""
from pathlib import Path

from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, TaskRunFilter
from prefect.client.schemas.sorting import ArtifactSort

from contrastive.modalities.image import steps as stages
from flows.sweep_flow import mcl_sweep


def test_cluster_sweep_shares_stage_zero_and_reruns_nothing(tmp_path, monkeypatch):
    calls: list[str] = []
    real = stages.train_stage

    def counted(spec, **kwargs):
        calls.append(Path(spec.stage_dir).name.split("-")[0])
        return real(spec, **kwargs)

    monkeypatch.setattr(stages, "train_stage", counted)
    overrides = [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                 f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "mcl.num_stages=2", "mcl.control=false"]
    summary = mcl_sweep(config="trifeature_tiny", grid={"mcl.clusters": ["2", "4"]}, seeds=[0], overrides=overrides)
    assert sorted(calls) == ["train0", "train1", "train1"]  # stage 0 once for both K
    assert {(r["mcl.clusters"], r["representation"]) for r in summary["rows"]} == {
        (k, rep) for k in ("2", "4") for rep in ("stage 0", "stage 1", "MCL concat")}
    stage0 = [r for r in summary["rows"] if r["representation"] == "stage 0" and r["attribute"] == "shape"]
    assert stage0[0]["mean"] == stage0[1]["mean"]  # the same shared model
    out = Path(summary["dir"])
    for name in ("comparison.md", "comparison.csv", "accuracy_vs_mcl_clusters.png", "summary.json"):
        assert (out / name).is_file(), name
    assert "| mcl.clusters | representation | color | shape | texture |" in (out / "comparison.md").read_text()

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    sweep_run = client.get_run(summary["mlflow_run_id"])
    assert sweep_run.data.tags["kind"] == "sweep" and sweep_run.info.status == "FINISHED"
    for child in summary["pipelines"]:
        pipeline_runs = client.search_runs([sweep_run.info.experiment_id],
                                           f"tags.pipeline_id = '{child['pipeline_id']}' and tags.kind = 'pipeline'")
        assert pipeline_runs[0].data.tags["mlflow.parentRunId"] == sweep_run.info.run_id
    key = f"mcl-sweep-{summary['sweep_id'][:8]}"
    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                           flow_run_filter=FlowRunFilter(), task_run_filter=TaskRunFilter(),
                                           sort=ArtifactSort.CREATED_DESC, limit=5, offset=0)
    assert artifacts and "| mcl.clusters | representation |" in artifacts[0].data

    calls.clear()
    again = mcl_sweep(config="trifeature_tiny", grid={"mcl.clusters": ["2", "4"]}, seeds=[0], overrides=overrides)
    assert calls == [] and again["rows"] == summary["rows"]
