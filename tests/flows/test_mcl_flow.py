"""The MCL flow under Prefect's test harness: MLflow run tree, artifacts, caching and rerun after a failure."""
import json
import signal
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from contrastive.modalities.image import steps as stages
from contrastive.errors import StageInterrupted
from flows.pipeline import mcl_pipeline
from tests.flows.mlflow_runs import artifact_paths, run_tree


@pytest.fixture
def count_training(monkeypatch):
    """Counts real training calls per stage directory, and can make one stage fail."""
    calls: list[str] = []
    fail_for: set[str] = set()
    real = stages.train_stage

    def wrapped(spec, **kwargs):
        name = Path(spec.stage_dir).name.split("-")[0]
        calls.append(name)
        if name in fail_for:
            raise RuntimeError(f"injected failure in {name}")
        if f"stop-{name}" in fail_for:  # what Ctrl-C or SIGTERM raises inside a stage
            raise StageInterrupted(signum=signal.SIGINT)
        return real(spec, **kwargs)

    monkeypatch.setattr(stages, "train_stage", wrapped)
    return calls, fail_for


def test_run_tree_artifacts_and_cache(tiny_config, count_training):
    calls, _ = count_training
    config = tiny_config()
    summary = mcl_pipeline(config)
    assert set(summary["results"]) == {"stage 0", "stage 1", "stage 2", "MCL concat", "control concat"}
    for metrics in summary["results"].values():
        assert {"probe/color", "probe/shape", "probe/texture", "knn/color"} <= set(metrics)
        assert all(0.0 <= v <= 1.0 for v in metrics.values())
    # three MCL stages + two control stages (the control shares stage 0)
    assert sorted(calls) == ["train0", "train1", "train1", "train2", "train2"]
    # the flow graph reads like the pipeline: task runs named by what they do
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import TaskRunSort
    with get_client(sync_client=True) as client:  # limit and sort given: null ones get a 422 (fastapi 0.154)
        names = {task_run.name for task_run in client.read_task_runs(limit=200, sort=TaskRunSort.EXPECTED_START_TIME_DESC)}
    assert {"train stage 0", "train stage 1 (MCL)", "train stage 2 (control)", "k-means stage 0",
            "pseudo-labels for stage 2", "probe MCL concat", "probe control concat"} <= names

    uri = config.tracking.uri
    client = MlflowClient(tracking_uri=uri)
    parents, children = run_tree(uri)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["pipeline_id"] == config.config_hash()
    assert "prefect.flow_run_id" in parent.data.tags and parent.info.status == "FINISHED"
    assert {(c.data.tags["kind"], c.data.tags["stage"]) for c in children} == {
        ("mcl", "0"), ("mcl", "1"), ("mcl", "2"), ("control", "1"), ("control", "2")}
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert {"config.yaml", "eval/probe_accuracy.png", "eval/cluster_sizes.png"} <= artifact_paths(client, parent.info.run_id)
    stage1 = next(c for c in children if c.data.tags["kind"] == "mcl" and c.data.tags["stage"] == "1")
    files = artifact_paths(client, stage1.info.run_id)
    for expected in ("checkpoints/last.pt", "model/model.pt", "embeddings/manifest.json", "embeddings/ids.npy",
                     "clusters/summary.json", "clusters/assignments.npz", "clusters/cluster_sizes.png",
                     "pseudo_labels/pseudo_labels.npz", "eval/stage1/metrics.json"):
        assert expected in files, expected
    # stage 2's run holds the k-means of stage 1 it trained on, with the AMI against stage 0's clustering
    stage2 = next(c for c in children if c.data.tags["kind"] == "mcl" and c.data.tags["stage"] == "2")
    assert "ami/stage_0" in stage2.data.metrics and "train/loss" in stage1.data.metrics
    assert stage1.data.params["train.epochs"] == "1"

    # The same pipeline again: nothing is retrained, no empty stage run is opened, and the new parent points at the
    # five runs that hold the stages.
    calls.clear()
    again = mcl_pipeline(config)
    assert calls == []
    assert again["results"] == summary["results"]
    # summary.json counts the steps computed and those found finished (flows.pipeline.CountingRunner)
    assert summary["steps"]["reused"] == 0 and summary["steps"]["computed"] >= 5
    assert again["steps"] == {"computed": 0, "reused": summary["steps"]["computed"]}
    assert json.loads((Path(again["dir"]) / "summary.json").read_text())["steps"] == again["steps"]
    parents, children = run_tree(uri)
    assert len(parents) == 2 and len(children) == 5
    assert {r["run_id"] for r in again["stage_runs"].values()} == {c.info.run_id for c in children}


def test_an_interrupted_pipeline_marks_its_runs_killed_not_failed(tiny_config, count_training):
    _, fail_for = count_training
    config = tiny_config()
    fail_for.add("stop-train1")
    with pytest.raises(KeyboardInterrupt):
        mcl_pipeline(config)
    parents, children = run_tree(config.tracking.uri)
    assert [p.info.status for p in parents] == ["KILLED"]
    assert {c.data.tags["stage"]: c.info.status for c in children if c.data.tags["kind"] == "mcl"} == {
        "0": "KILLED", "1": "KILLED"}  # stage 0 finished its steps; the pipeline run it belongs to was stopped

    fail_for.clear()
    mcl_pipeline(config)  # the rerun finishes what was stopped in the same stage runs, which then read finished
    parents, children = run_tree(config.tracking.uri)
    assert sorted(p.info.status for p in parents) == ["FINISHED", "KILLED"]  # the stopped attempt stays on record
    assert {c.info.status for c in children} == {"FINISHED"}


def test_failed_stage_rerun_retrains_only_what_failed(tiny_config, count_training):
    calls, fail_for = count_training
    config = tiny_config()
    fail_for.add("train2")
    with pytest.raises(RuntimeError, match="injected failure in train2"):
        mcl_pipeline(config)
    assert calls == ["train0", "train1", "train2"]
    parents, _ = run_tree(config.tracking.uri)
    assert parents[0].info.status == "FAILED"

    calls.clear()
    fail_for.clear()
    mcl_pipeline(config)
    assert calls == ["train2", "train1", "train2"]  # MCL stage 2, then the control's stages 1-2
    # the rerun opened no copies: stages 0-1 stay in their runs (marked finished now), stage 2's training continued in
    # the run that holds its pseudo-labels
    _, children = run_tree(config.tracking.uri)
    status = sorted((c.data.tags["kind"], c.data.tags["stage"], c.info.status) for c in children)
    assert [s for s in status if s[0] == "mcl"] == [("mcl", "0", "FINISHED"), ("mcl", "1", "FINISHED"),
                                                    ("mcl", "2", "FINISHED")]
    stage2 = next(c for c in children if c.data.tags["kind"] == "mcl" and c.data.tags["stage"] == "2")
    assert "train/final_loss" in stage2.data.metrics and "pseudo_labels/num_groups" in stage2.data.metrics


def test_deleted_artifacts_are_recomputed_not_trusted(tiny_config, count_training):
    calls, _ = count_training
    config = tiny_config("mcl.num_stages=1")
    mcl_pipeline(config)
    steps = Path(config.output_dir) / "steps"
    train_dir = next(steps.glob("train0-*"))
    (train_dir / "record.json").unlink()
    (train_dir / "model" / "model.pt").unlink()
    calls.clear()
    mcl_pipeline(config)
    assert calls == ["train0"]


def test_rerun_from_recomputes_later_stages_and_keeps_old_files(tiny_config, count_training):
    calls, _ = count_training
    config = tiny_config("mcl.num_stages=2", "mcl.control=false")
    first = mcl_pipeline(config)
    calls.clear()
    again = mcl_pipeline(config, rerun_from=1)
    assert calls == ["train1"]
    steps = Path(config.output_dir) / "steps"
    assert len(list(steps.glob("train1-*.replaced-*"))) == 1 and len(list(steps.glob("train0-*"))) == 1
    assert set(again["results"]) == set(first["results"])
    _, children = run_tree(config.tracking.uri)
    stage1_runs = [c for c in children if c.data.tags["stage"] == "1"]
    assert any(c.data.tags.get("rerun_from") == "1" for c in stage1_runs)


def test_rerun_from_with_a_stage_override_keeps_earlier_stages(tiny_config, count_training):
    # Issue: "--rerun-from N, with a new config allowed for the stages that rerun". A change to train.epochs for
    # every stage would give every stage a new content key; put under stage_overrides it changes stage 1 only.
    calls, _ = count_training
    config = tiny_config("mcl.num_stages=2", "mcl.control=false")
    mcl_pipeline(config)
    steps = Path(config.output_dir) / "steps"
    stage0_dir = next(steps.glob("train0-*"))
    calls.clear()
    changed = tiny_config("mcl.num_stages=2", "mcl.control=false",
                          f"stage_overrides.1.train.epochs={config.train.epochs + 1}")
    mcl_pipeline(changed, rerun_from=1)
    assert calls == ["train1"]
    assert list(steps.glob("train0-*")) == [stage0_dir]  # stage 0 kept its key and was reused
    new_stage1 = [d for d in steps.glob("train1-*") if ".replaced-" not in d.name]
    assert len(new_stage1) == 2  # the first run's stage 1 and the overridden one (a different key)
    epochs = sorted(json.loads((d / "train_summary.json").read_text())["epochs"] for d in new_stage1)
    assert epochs == [config.train.epochs, config.train.epochs + 1]
    _, children = run_tree(config.tracking.uri)
    overridden = [c for c in children if c.data.tags.get("stage_override") == "true"]
    assert overridden and all(c.data.params["train.epochs"] == str(config.train.epochs + 1) for c in overridden)
