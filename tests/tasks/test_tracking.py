"""tasks/tracking.py against a local sqlite MLflow store: nesting, reopening, retries, buffered metrics."""
import pytest
from pydantic import ValidationError

from contrastive.modalities.base import ResultsTable
from tasks.steps import tables_markdown
from tasks.records import EvalRecord, ExportRecord, finished_record
from tasks.tracking import MetricBuffer, Tracker, TrackingError, flatten


@pytest.fixture
def tracker(tmp_path):
    return Tracker(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="t", artifact_root=tmp_path / "art")


def test_flatten_nested_config():
    assert flatten({"train": {"lr": 0.1, "betas": [1, 2]}, "seed": 0}) == {
        "train.lr": "0.1", "train.betas": "[1, 2]", "seed": "0"}


def test_nested_runs_and_reopen_by_tags(tracker, tmp_path):
    parent = tracker.start_run(name="p", tags={"kind": "pipeline", "prefect.flow_run_id": "f1"},
                               reuse_tags={"prefect.flow_run_id": "f1"})
    child = tracker.start_run(name="c", tags={"stage": "0"}, parent_run_id=parent)
    assert tracker.client.get_run(child).data.tags["mlflow.parentRunId"] == parent
    tracker.end_run(parent, status="FAILED")
    # a retried Prefect flow run keeps its id, so it reopens the same MLflow run
    again = tracker.start_run(name="p", tags={"kind": "pipeline"}, reuse_tags={"prefect.flow_run_id": "f1"})
    assert again == parent and tracker.client.get_run(parent).info.status == "RUNNING"
    tracker.log_params(parent, {"a": {"b": 1}})
    tracker.log_params(parent, {"a": {"b": 1}})  # logging the same params again on a reopened run is fine
    (tmp_path / "f.txt").write_text("x")
    tracker.log_artifact(child, tmp_path / "f.txt", artifact_path="eval")
    assert [a.path for a in tracker.client.list_artifacts(child, "eval")] == ["eval/f.txt"]


class FlakyTracker:
    def __init__(self):
        self.down = True
        self.sent = []

    def log_metric_history(self, run_id, history):
        if self.down:
            raise TrackingError("down")
        self.sent += history


def test_metric_buffer_keeps_metrics_through_an_outage():
    flaky = FlakyTracker()
    buffer = MetricBuffer(tracker=flaky, run_id="r", flush_every=2)
    for step in range(1, 5):
        buffer.on_step(step=step, epoch=0, metrics={"loss": float(step)})  # flushes fail silently, nothing lost
        buffer.on_checkpoint(path=None, step=step)
    assert len(buffer.pending) == 4 and flaky.sent == []
    with pytest.raises(TrackingError):
        buffer.flush(final=True)
    flaky.down = False
    buffer.flush(final=True)
    assert [step for step, _ in flaky.sent] == [1, 2, 3, 4] and buffer.pending == []


def test_records_are_valid_only_while_their_files_exist(tmp_path):
    record = EvalRecord(key="k", dir=str(tmp_path / "step"), mlflow_run_id="r", name="stage0",
                        metrics={"probe/shape": 0.5}).save()
    assert record.is_on_disk() and finished_record(tmp_path / "step", EvalRecord) == record
    (tmp_path / "step" / "record.json").unlink()
    assert not record.is_on_disk() and finished_record(tmp_path / "step", EvalRecord) is None


def test_records_are_typed_and_reject_unknown_fields(tmp_path):
    with pytest.raises(ValidationError):
        ExportRecord(key="k", dir="d", mlflow_run_id="r", embeddings_dir="e", num_samples=1, dim=2, extra=1)
    with pytest.raises(ValidationError):
        ExportRecord(key="k", dir="d", mlflow_run_id="r", embeddings_dir="e", num_samples="many", dim=2)


def test_results_table_markdown():
    table = tables_markdown([ResultsTable(title="probe", metric="probe", rows={
        "stage 0": {"probe/color": 1.0, "probe/shape": 0.25, "knn/shape": 0.1}})])
    assert table.splitlines()[0] == "### probe"
    assert table.splitlines()[2] == "| representation | color | shape |"
    assert "| stage 0 | 1.000 | 0.250 |" in table


# ---------------------------------------------------------------------------------------------------- issue 16
def test_new_store_has_a_training_experiment_and_no_empty_default(tmp_path):
    from tasks.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
    tracker = Tracker(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="exp", artifact_root=tmp_path / "art")
    experiments = tracker.client.search_experiments()
    assert [e.name for e in experiments] == ["exp"]  # Default (id 0) was created empty by MLflow, then deleted
    assert experiments[0].tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_an_earlier_experiment_gets_the_training_kind_and_a_used_default_stays(tmp_path):
    from mlflow.tracking import MlflowClient

    from tasks.tracking import EXPERIMENT_KIND_TAG
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.create_run("0")  # someone's run in Default
    client.create_experiment("old")
    Tracker(uri=uri, experiment="old")
    assert client.get_experiment_by_name("old").tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert client.get_experiment("0").lifecycle_stage == "active"


def test_local_artifacts_are_hard_links_without_prev_digests_or_tmp(tracker, tmp_path):
    run = tracker.start_run(name="r", tags={})
    step = tmp_path / "step" / "checkpoints"
    step.mkdir(parents=True)
    for name in ("last.pt", "last.pt.sha256", "last.pt.prev", "last.pt.prev.sha256", "x.tmp"):
        (step / name).write_bytes(b"payload")
    (step / "sub").mkdir()
    (step / "sub" / "a.json").write_text("{}")
    tracker.log_artifact(run, step, artifact_path="checkpoints")
    assert {a.path for a in tracker.client.list_artifacts(run, "checkpoints")} == {"checkpoints/last.pt",
                                                                                    "checkpoints/sub"}
    logged = tracker.local_artifact_dir(run) / "checkpoints" / "last.pt"
    assert logged.stat().st_ino == (step / "last.pt").stat().st_ino and logged.stat().st_nlink == 2
    tracker.log_artifact(run, step / "sub" / "a.json")  # a single file, at the root
    assert (tracker.local_artifact_dir(run) / "a.json").exists()


def test_datasets_descriptions_and_urls(tracker, monkeypatch):
    import json
    run = tracker.start_run(name="r", tags={})
    tracker.log_dataset(run, name="trifeature-abc", digest="d" * 64, source="/data/x", context="train",
                        profile={"split": "train", "num_samples": 8})
    (inp,) = tracker.client.get_run(run).inputs.dataset_inputs
    assert (inp.dataset.name, inp.dataset.digest, json.loads(inp.dataset.profile)["num_samples"]) == (
        "trifeature-abc", "d" * 36, 8)
    assert json.loads(inp.dataset.source) == {"uri": "/data/x"} and inp.tags[0].value == "train"
    tracker.set_description(run, "## hello")
    assert tracker.client.get_run(run).data.tags["mlflow.note.content"] == "## hello"
    monkeypatch.delenv("MCLPIPE_MLFLOW_UI", raising=False)
    assert tracker.run_url(run) == (f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/{run}"
                                    "?workflowType=machine_learning")
    assert not tracker.run_exists("0" * 32) and tracker.run_exists(run)


def test_ui_command_works_as_printed(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    from tasks.tracking import ui_command
    assert ui_command("http://mlflow:5000") is None
    monkeypatch.chdir(tmp_path)  # not a checkout: the venv's own mlflow, with the store's URI
    command = ui_command(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert command.split()[0] == str(Path(sys.executable).with_name("mlflow")) and Path(command.split()[0]).exists()
    assert f"--backend-store-uri sqlite:///{tmp_path / 'mlflow.db'}" in command


def test_a_rollback_is_a_metric_and_a_tag_and_drops_the_replayed_steps_unsent_metrics(tracker):
    run = tracker.start_run(name="stage", tags={"stage": "0"})
    buffer = MetricBuffer(tracker=tracker, run_id=run, flush_every=100)
    for step in range(1, 8):
        buffer.on_step(step=step, epoch=0, metrics={"train/loss": float(step)})
        if step == 4:
            buffer.on_checkpoint(path=None, step=4)
            buffer.flush()  # steps 1..4 sent; 5..7 wait for the next checkpoint
    assert [m.step for m in tracker.client.get_metric_history(run, "train/loss")] == [1, 2, 3, 4]
    buffer.on_rollback(step=7, restored_step=4, epoch=1, batch=1, loss=float("nan"), lr_scale=0.5, rollbacks=1)
    for step in range(5, 8):  # the replay from the checkpoint at step 4
        buffer.on_step(step=step, epoch=0, metrics={"train/loss": 10.0 * step})
    buffer.flush(final=True)
    history = tracker.client.get_metric_history(run, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0),
                                                     (7, 70.0)]  # neither lost nor duplicated
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(run, "train/rollbacks")] == [(7, 1.0)]
    tag = tracker.client.get_run(run).data.tags["rollback.1"]
    assert "restored step 4, skipped batch 1 of epoch 1, learning rate x 0.5" in tag


def test_metrics_after_the_last_checkpoint_wait_for_it(tracker):
    """A crash loses the steps after the last checkpoint and the resumed stage trains them again: they are sent
    only once a checkpoint holds them, so the resumed stage's values are the only ones in MLflow."""
    run = tracker.start_run(name="stage", tags={"stage": "0"})
    crashed = MetricBuffer(tracker=tracker, run_id=run, flush_every=2)
    for step in range(1, 6):
        crashed.on_step(step=step, epoch=0, metrics={"train/loss": float(step)})
        if step == 3:
            crashed.on_checkpoint(path=None, step=3)
    # the process dies here: steps 4 and 5 were never sent
    resumed = MetricBuffer(tracker=tracker, run_id=run, flush_every=2)
    for step in range(4, 7):
        resumed.on_step(step=step, epoch=0, metrics={"train/loss": 10.0 * step})
    resumed.flush(final=True)
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(run, "train/loss")] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
