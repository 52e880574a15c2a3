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


def trained_stages(root: Path, prefix: str) -> list[str]:
    """The training steps a sweep computed, by stage: ``["train0", "train1", "train1"]``."""
    return sorted(p.name.removeprefix(prefix).split("-")[0] for p in (root / "steps").glob(f"{prefix}train*-*"))


def sweep_of(tmp_path, *, config: str, grid: dict, overrides: list[str]) -> dict:
    return mcl_sweep(config=config, grid=grid, seeds=[0], overrides=[
        *overrides, f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "device=cpu", "tracking.system_metrics_seconds=0"])


def test_a_clip_sweep_over_k_compares_its_mmvp_scores_through_the_same_flow(tmp_path):
    summary = sweep_of(tmp_path, config="clip_tiny", grid={"mcl.clusters": ["2", "4"]},
                       overrides=["train.max_steps_per_epoch=2", "data.synthetic.num_train=192", "eval.soup=false"])
    assert trained_stages(tmp_path / "runs", "clip-") == ["train0", "train1", "train1"]  # stage 0 once for both K
    assert not summary["failed"] and {(r["mcl.clusters"], r["representation"]) for r in summary["rows"]} == {
        (k, rep) for k in ("2", "4") for rep in ("stage 0", "stage 1", "MCL concat")}
    assert {r["attribute"] for r in summary["rows"]} >= {"average"}  # mmvp/average: CLIP's sweep metric, in percent
    assert all(0 <= r["mean"] <= 100 for r in summary["rows"])
    # K changes stage 1's batches, so its model and scores: each point's own stage 1, not one model's scores twice
    rows = {(r["mcl.clusters"], r["representation"], r["attribute"]): r["mean"] for r in summary["rows"]}
    stage1 = {k: [mean for (key, rep, _), mean in sorted(rows.items()) if key == k and rep == "stage 1"]
              for k in ("2", "4")}
    assert stage1["2"] and stage1["2"] != stage1["4"], stage1
    table = (Path(summary["dir"]) / "comparison.md").read_text()
    assert table.startswith("| mcl.clusters | representation |") and "| average |" in table.splitlines()[0] + " |"


def test_a_text_sweep_over_the_temperature_runs_each_point_through_the_same_flow(tmp_path):
    summary = sweep_of(tmp_path, config="text_tiny", grid={"method.temperature": ["0.05", "0.2"]},
                       overrides=["mcl.control=false"])
    # The temperature changes what every stage learns: nothing shared between the points.
    assert trained_stages(tmp_path / "runs", "text-") == ["train0", "train0", "train1", "train1"]
    rows = {(r["method.temperature"], r["representation"], r["attribute"]): r for r in summary["rows"]}
    assert {t for t, _, _ in rows} == {"0.05", "0.2"} and {rep for _, rep, _ in rows} == {"stage 0", "stage 1",
                                                                                           "MCL concat"}
    attributes = {a for _, _, a in rows}
    assert attributes and all(0 <= r["mean"] <= 1 for r in rows.values())  # probe accuracy per attribute
    scores = {t: [rows[(t, rep, a)]["mean"] for rep in ("stage 0", "stage 1") for a in sorted(attributes)]
              for t in ("0.05", "0.2")}
    assert scores["0.05"] != scores["0.2"]  # each point's own models, not one model's scores twice
    assert (Path(summary["dir"]) / "accuracy_vs_method_temperature.png").is_file()
