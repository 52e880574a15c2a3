"""tasks/tracking.py against a local sqlite MLflow store: nesting, reopening, retries, buffered metrics."""
import pytest
from pydantic import ValidationError

from tasks.mcl_tasks import results_table_markdown
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
    table = results_table_markdown({"stage 0": {"probe/color": 1.0, "probe/shape": 0.25, "knn/shape": 0.1}})
    assert table.splitlines()[0] == "| representation | color | shape |"
    assert "| stage 0 | 1.000 | 0.250 |" in table
