"""tasks/tracking/ against a local sqlite MLflow store: nesting, reopening, retries, buffered metrics, a tracking
outage mid-stage (a client whose server is switched off and on) and the metrics journal a crash leaves."""
import json

import pytest
import requests
from pydantic import ValidationError

from contrastive.modalities.base import ResultsTable
from tasks.steps import tables_markdown
from tasks.records import EvalRecord, ExportRecord, finished_record
from tasks.tracking import PENDING_FILE, MetricBuffer, Tracker, TrackingError, flatten


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


def test_a_dataset_another_pipeline_inserted_first_is_linked_not_an_error(tracker, monkeypatch):
    """Two pipelines of one experiment logging the same dataset at once: MLflow's server looks the dataset up, then
    inserts it, so the later insert can break the unique key (seen with two pipelines on one `mlflow server`). The
    tracker asks again and the run gets the dataset; any other refusal is still raised."""
    import mlflow
    first, second = (tracker.start_run(name=n, tags={}) for n in ("a", "b"))
    race = mlflow.exceptions.RestException({"error_code": "BAD_REQUEST", "message": (
        "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest")})
    calls, log_inputs = [], tracker.client.log_inputs

    def insert_raced(run_id, datasets):
        calls.append(run_id)
        if len(calls) == 1:  # the other pipeline's insert lands between this call's lookup and its insert
            log_inputs(first, datasets)
            raise race
        return log_inputs(run_id, datasets)

    monkeypatch.setattr(tracker.client, "log_inputs", insert_raced)
    tracker.log_dataset(second, name="trifeature-abc", digest="d" * 64, source="/x", context="train", profile={})
    assert calls == [second, second]
    assert [i.dataset.name for i in tracker.client.get_run(second).inputs.dataset_inputs] == ["trifeature-abc"]
    refused = mlflow.exceptions.RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad digest"})
    monkeypatch.setattr(tracker.client, "log_inputs", lambda *a: (_ for _ in ()).throw(refused))
    with pytest.raises(mlflow.exceptions.RestException, match="bad digest"):
        tracker.log_dataset(second, name="other", digest="e" * 64, source="/y", context="train", profile={})


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


# ---------------------------------------------------------------------------------------------------- issue 26
class Switchable:
    """An MlflowClient whose server can be switched off: every call then fails as a refused connection does."""

    def __init__(self, client):
        self.client, self.down = client, False

    def __getattr__(self, name):
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.down:
                raise requests.exceptions.ConnectionError("[Errno 111] Connection refused")
            return attr(*args, **kwargs)
        return call


@pytest.fixture
def switchable(tmp_path):
    """(tracker, its switchable client, a stage run): a server that answered, with an hour of grace."""
    tracker = Tracker(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="t", retries=1, backoff_seconds=0.01,
                      outage_grace_seconds=3600)
    run = tracker.start_run(name="stage", tags={"stage": "0"})
    tracker.client = Switchable(tracker.client)
    return tracker, tracker.client, run


def train(buffer: MetricBuffer, steps: range, *, checkpoint_every: int = 2, scale: float = 1.0) -> None:
    """What the engine's loop calls: every step's metrics, a checkpoint every ``checkpoint_every`` steps."""
    for step in steps:
        buffer.on_step(step=step, epoch=0, metrics={"train/loss": scale * step})
        if step % checkpoint_every == 0:
            buffer.on_checkpoint(path=None, step=step)


def history(tracker: Tracker, run: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracker.client.client.get_metric_history(run, "train/loss"))


def journal_records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if "seq" in line] if path.exists() else []


def test_an_outage_mid_stage_keeps_training_and_every_metric_arrives_once(switchable, tmp_path):
    tracker, client, run = switchable
    journal = tmp_path / "step" / PENDING_FILE
    journal.parent.mkdir()
    buffer = MetricBuffer(tracker=tracker, run_id=run, journal=journal, flush_every=2, retry_seconds=0)
    train(buffer, range(1, 3))
    assert history(tracker, run) == [(1, 1.0), (2, 2.0)] and not journal.exists()  # sent and acknowledged

    client.down = True
    train(buffer, range(3, 9))  # four checkpoints' sends fail: no error reaches the loop, training goes on
    assert [r["metrics"][0][3] for r in journal_records(journal)] == [3, 5, 7]  # on disk, a record a checkpoint
    assert history(tracker, run) == [(1, 1.0), (2, 2.0)]

    client.down = False
    train(buffer, range(9, 11))  # the next checkpoint sends what waited, oldest first
    buffer.flush(final=True)
    assert history(tracker, run) == [(s, float(s)) for s in range(1, 11)]  # none lost, none twice
    assert not journal.exists()


def test_a_crash_during_an_outage_leaves_the_journal_and_the_rerun_sends_it_once(switchable, tmp_path):
    tracker, client, run = switchable
    journal = tmp_path / PENDING_FILE
    client.down = True
    crashed = MetricBuffer(tracker=tracker, run_id=run, journal=journal, flush_every=2, retry_seconds=0)
    train(crashed, range(1, 6))  # checkpoints at 2 and 4; step 5 is trained again after the crash
    del crashed  # killed: its memory is gone, its journal is not
    with open(journal, "a") as handle:
        handle.write('{"seq": 9, "run_id": "')  # and it was killed while appending: a torn last line

    client.down = False
    resumed = MetricBuffer(tracker=tracker, run_id=run, journal=journal, flush_every=2, retry_seconds=0)
    assert history(tracker, run) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]  # replayed when it started
    train(resumed, range(5, 7), scale=10.0)  # the resumed stage, from its checkpoint at step 4
    resumed.flush(final=True)
    assert history(tracker, run) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0)]
    assert not journal.exists()


def test_a_record_sent_again_after_its_acknowledgement_was_lost_is_not_doubled(switchable, tmp_path):
    """Killed after MLflow took a record and before the journal said so: the rerun sends it again, and the store
    ignores the points it holds (same key, value, timestamp and step)."""
    tracker, client, run = switchable
    journal = tmp_path / PENDING_FILE
    buffer = MetricBuffer(tracker=tracker, run_id=run, journal=journal, flush_every=100)
    train(buffer, range(1, 5))  # two records in the journal, nothing sent yet (flush_every)
    kept = journal.read_text()
    buffer.flush()
    assert history(tracker, run) == [(s, float(s)) for s in range(1, 5)] and not journal.exists()
    journal.write_text(kept)  # as if the acknowledgement had never been written
    MetricBuffer(tracker=tracker, run_id=run, journal=journal)
    assert history(tracker, run) == [(s, float(s)) for s in range(1, 5)] and not journal.exists()


def test_an_outage_past_its_grace_stops_the_stage_in_one_line_and_keeps_the_journal(tmp_path):
    tracker = Tracker(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="t", retries=1, backoff_seconds=0.01,
                      outage_grace_seconds=0)
    run = tracker.start_run(name="stage", tags={"stage": "0"})
    tracker.client = Switchable(tracker.client)
    tracker.client.down = True
    journal = tmp_path / PENDING_FILE
    buffer = MetricBuffer(tracker=tracker, run_id=run, journal=journal, flush_every=2, retry_seconds=0)
    with pytest.raises(TrackingError) as stopped:
        train(buffer, range(1, 3))
    line = str(stopped.value)
    assert "has not answered for" in line and "tracking.outage_grace_seconds (0 s)" in line and "\n" not in line
    assert PENDING_FILE in line and "Start the server or fix tracking.uri" in line
    assert [r["metrics"][0][3] for r in journal_records(journal)] == [1]  # kept for the stage's next run


def test_a_send_mid_stage_past_the_grace_stops_at_its_first_failure(switchable, tmp_path, monkeypatch):
    """The stage stops close to the grace a user set: the journal tries again within half the grace, and once the
    grace has run out a mid-stage send stops the stage without the retries (and their sleeps) of a final one."""
    tracker, client, run = switchable
    tracker.outage_grace_seconds = 6.0
    buffer = MetricBuffer(tracker=tracker, run_id=run, journal=tmp_path / PENDING_FILE, flush_every=1)
    assert buffer.retry_seconds == 3.0  # half the grace: shorter than the default 10 s
    clock = {"now": 1000.0}
    monkeypatch.setattr("tasks.tracking.client.time.monotonic", lambda: clock["now"])
    monkeypatch.setattr("tasks.tracking.journal.time.monotonic", lambda: clock["now"])
    sleeps = []
    monkeypatch.setattr("tasks.tracking.client.time.sleep", sleeps.append)
    client.down = True
    train(buffer, range(1, 3))  # the outage starts: one try, kept for later
    clock["now"] += 3.0
    train(buffer, range(3, 5))  # 3 s away, within the grace: one more try
    assert sleeps == []
    clock["now"] += 3.0
    with pytest.raises(TrackingError, match="has not answered for 6 s"):
        train(buffer, range(5, 7))  # 6 s away: past the grace, the first failure stops the stage
    assert sleeps == []


def test_the_end_of_a_stage_waits_for_the_server_within_the_grace(switchable, tmp_path, monkeypatch):
    """The stage's last metrics are sent before it is recorded as finished: the final flush waits (retries) while
    the server is away and goes on when it answers."""
    tracker, client, run = switchable
    buffer = MetricBuffer(tracker=tracker, run_id=run, journal=tmp_path / PENDING_FILE, flush_every=100)
    train(buffer, range(1, 4))
    client.down = True
    sleeps = []

    def sleep(seconds):  # the server comes back while the tracker waits for it
        sleeps.append(seconds)
        client.down = len(sleeps) < 3
    monkeypatch.setattr("tasks.tracking.client.time.sleep", sleep)
    buffer.flush(final=True)
    assert len(sleeps) == 3 and history(tracker, run) == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_full_disk_under_the_journal_is_the_one_line_and_leaves_no_torn_line(tmp_path, monkeypatch):
    import errno
    import os

    from contrastive.errors import MclpipeError
    from tasks.tracking import PendingJournal
    journal = PendingJournal(tmp_path / PENDING_FILE)
    journal.add(run_id="r", metrics=[["train/loss", 1.0, 1, 1]])
    real_write = os.write

    def half_then_full(fd, data):  # half the line fits, then the disk is full
        monkeypatch.setattr("tasks.tracking.journal.os.write", lambda fd, data: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
        return real_write(fd, data[:len(data) // 2])
    monkeypatch.setattr("tasks.tracking.journal.os.write", half_then_full)
    with pytest.raises(MclpipeError, match="disk full: no space left in .* while writing the stage's unsent MLflow"):
        journal.add(run_id="r", metrics=[["train/loss", 2.0, 2, 2]])
    lines = (tmp_path / PENDING_FILE).read_text().split("\n")
    assert len(lines) == 2 and lines[1] == "" and json.loads(lines[0])["seq"] == 1  # the half line was cut off


def test_the_ranks_metrics_file_keeps_a_steps_last_values_and_sends_twice_without_doubling(tracker, tmp_path):
    """Under torchrun the ranks append to train_metrics.jsonl (JsonlMetrics); a resumed stage appends the steps
    after its checkpoint again: the later lines win, and sending the file again (a rerun after the send failed) adds
    nothing."""
    from contrastive.engine.callbacks import JsonlMetrics
    from tasks.tracking import rank_metric_points
    path = tmp_path / "train_metrics.jsonl"
    first, resumed = JsonlMetrics(path), JsonlMetrics(path)
    for step in (1, 2, 3):
        first.on_step(step=step, epoch=0, metrics={"train/loss": float(step)})
    for step in (3, 4):  # resumed from the checkpoint at step 2
        resumed.on_step(step=step, epoch=0, metrics={"train/loss": 10.0 * step})
    resumed.on_epoch_end(epoch=0, metrics={"train/epoch_loss": 5.0})
    run = tracker.start_run(name="stage", tags={"stage": "0"})
    for _ in range(2):
        buffer = MetricBuffer(tracker=tracker, run_id=run, journal=tmp_path / PENDING_FILE)
        buffer.add_trained(rank_metric_points(path))
        buffer.flush(final=True)
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(run, "train/loss")] == [
        (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(run, "train/epoch_loss")] == [(0, 5.0)]


def test_the_checkouts_ui_command_works_from_any_directory(tmp_path, monkeypatch):
    """`make ui-mlflow` worked only in the checkout; the printed `make -C <checkout> ui-mlflow` works anywhere."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tasks.tracking import ui_command
    checkout = Path(__file__).resolve().parents[2]
    if Path(sys.executable).parent.parent.resolve() != (checkout / ".venv").resolve():
        pytest.skip("not run from the checkout's venv")
    monkeypatch.chdir(checkout)
    command = ui_command(f"sqlite:///{checkout / 'mlflow.db'}")
    assert command == f"make -C {checkout} ui-mlflow"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    dry = subprocess.run([*command.split(), "-n"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert dry.returncode == 0 and f"mlflow ui --backend-store-uri sqlite:///{checkout}/mlflow.db" in dry.stdout
