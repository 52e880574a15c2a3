"""flows/runner.py StepRunner.close after a retried flow run (the Prefect harness of tests/flows/conftest.py)."""
from prefect import flow
from prefect.runtime import flow_run

from flows.runner import StageRun, StepRunner
from pipeline_config.schema import ImagePipelineConfig
from tasks.steps import tracker_for


def test_close_finishes_reused_runs_a_killed_attempt_of_this_flow_run_left_running(tmp_path):
    """A flow run killed (SIGKILL) after stage 0 leaves stage 0's MLflow run RUNNING; its retry (same flow run id)
    reuses stage 0, so only its close can finish that run, and a run the killed attempt opened for a step that another
    pipeline finished meanwhile. Another flow run's running stage is not touched."""
    config = ImagePipelineConfig(output_dir=str(tmp_path / "runs"),
                            tracking={"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "close"})
    tracker = tracker_for(config)

    @flow
    def retried_attempt() -> dict:
        this = str(flow_run.id)
        parent = tracker.start_run(name="p", tags={"kind": "pipeline", "prefect.flow_run_id": this})
        killed = tracker.start_run(name="s0", tags={"prefect.flow_run_id": this}, parent_run_id=parent)
        failed = tracker.start_run(name="s1", tags={"prefect.flow_run_id": "earlier"}, parent_run_id=parent)
        tracker.end_run(failed, status="FAILED")
        other = tracker.start_run(name="s2", tags={"prefect.flow_run_id": "another"}, parent_run_id=parent)
        # opened by the killed attempt for a step another pipeline finished meanwhile: this attempt links that
        # pipeline's run instead and never names this one
        orphan = tracker.start_run(name="s3", tags={"prefect.flow_run_id": this}, parent_run_id=parent)
        runner = StepRunner(config=config, data={}, parent_run_id=parent, pipeline_id=config.config_hash())
        runner.linked_runs = {StageRun("mcl", 0): killed, StageRun("mcl", 1): failed, StageRun("mcl", 2): other}
        runner.close(status="FINISHED")
        return {"parent": parent, "killed": killed, "failed": failed, "other": other, "orphan": orphan}

    runs = retried_attempt()
    status = {name: tracker.client.get_run(run_id).info.status for name, run_id in runs.items()}
    assert status == {"parent": "FINISHED", "killed": "FINISHED", "failed": "FINISHED", "other": "RUNNING",
                      "orphan": "FINISHED"}



def test_close_leaves_a_killed_attempts_run_that_another_pipeline_carried_on_and_finished(tmp_path):
    """Two pipelines share stage 0; the one that trained it (run ``shared``) and the one that reused it are both killed
    and retried. The reuser's retry logs a step of its own into ``shared`` (reopened) and finishes first, closing it
    FINISHED; the trainer's retry links ``shared`` (its training is reused), finds it finished, and must not end it
    KILLED (CI of 2026-11-28: the stage's training then had no finished run). A killed-attempt run nobody carried on
    still ends KILLED."""
    config = ImagePipelineConfig(output_dir=str(tmp_path / "runs"),
                                 tracking={"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "close"})
    tracker = tracker_for(config)

    @flow
    def retried_trainer() -> dict:
        killed = {"prefect.flow_run_id": "the killed attempt's"}  # a CLI rerun carries on under a new flow run
        parent = tracker.start_run(name="p", tags={"kind": "pipeline", **killed})
        shared = tracker.start_run(name="s0", tags=killed, parent_run_id=parent)
        unreached = tracker.start_run(name="s1", tags=killed, parent_run_id=parent)
        tracker.end_run(shared, status="FINISHED")  # the reuser's retry closed it
        runner = StepRunner(config=config, data={}, parent_run_id=parent, pipeline_id=config.config_hash())
        runner.inherited_runs = {shared, unreached}
        runner.linked_runs = {StageRun("mcl", 0): shared}
        runner.close(status="FINISHED")
        return {"parent": parent, "shared": shared, "unreached": unreached}

    runs = retried_trainer()
    status = {name: tracker.client.get_run(run_id).info.status for name, run_id in runs.items()}
    assert status == {"parent": "FINISHED", "shared": "FINISHED", "unreached": "KILLED"}

def test_step_titles_are_rendered_from_the_step_id():
    """A task run's title, the step's words in an error and its name in a plan come from its StepId (and the run it
    logs into), never from parsing a string."""
    from flows.graph import Rep, StepId, step_title
    mcl1, control2 = StageRun("mcl", 1), StageRun("control", 2)
    assert step_title(StepId(0, "mcl", "train"), run=StageRun("mcl", 0)) == "train stage 0"
    assert step_title(StepId(1, "mcl", "train"), run=mcl1) == "train stage 1 (MCL)"
    assert step_title(StepId(2, "control", "export"), run=control2) == "export stage 2 (control)"
    assert step_title(StepId(0, "mcl", "pseudo_labels"), run=mcl1, for_stage=1) == "pseudo-labels for stage 1"
    assert step_title(StepId(1, "mcl", "eval", Rep("mcl", 1)), run=mcl1) == "probe stage 1 (MCL)"
    assert step_title(StepId(2, "control", "eval", Rep("control", 2)), run=control2) == "probe stage 2 (control)"
    assert step_title(StepId(2, "pipeline", "eval", Rep("mcl", concat=True)), run=None) == "probe MCL concat"
    assert step_title(StepId(2, "mcl", "eval", Rep("mcl", concat=True, upto=2)),
                      run=StageRun("mcl", 2)) == "probe MCL concat of stages 0-2"
    assert step_title(StepId(None, "mcl", "encode", Rep("mcl", 1)), run=mcl1) == "encode stage 1 (MCL)"
    assert step_title(StepId(None, "pipeline", "soup"), run=None) == "model soup"
    # stage 0's k-means logs into MCL stage 1's run (its clusters feed stage 1) and is still stage 0's
    assert step_title(StepId(0, "mcl", "cluster"), run=mcl1) == "k-means stage 0"
    assert StepId(2, "control", "eval", Rep("control", concat=True)).name == "eval.control_concat"
    assert Rep("mcl", concat=True, upto=1).name == "mcl_concat_0_1" and Rep("control", 3).name == "control_stage3"


def test_a_stage_killed_between_its_summary_and_its_record_is_recorded_once_without_training_again(tmp_path):
    """A worker killed after a stage's training wrote model and train_summary.json, before its final metrics and its
    record (the uploads take a while): the rerun resumed a loop with no step left, whose final loss is NaN and
    was logged as none, so the stage's run never got train/final_loss (tests/e2e/test_load.py). The rerun records
    the finished training instead, and its numbers reach MLflow once however often it is recorded."""
    import json

    from tasks.steps import train_and_record

    config = ImagePipelineConfig(output_dir=str(tmp_path / "runs"), device="cpu",
                                 tracking={"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "kill"})
    tracker = tracker_for(config)
    stage_dir = tmp_path / "steps" / "train1-abc"
    for sub in ("checkpoints", "model"):
        (stage_dir / sub).mkdir(parents=True)
        (stage_dir / sub / "file.pt").write_bytes(b"weights")
    summary = {"steps": 8, "epochs": 1, "final_loss": 2.5, "resumed_from_step": None, "seconds": 3.0,
               "samples_per_second": 40.0, "trimmed_samples": 0, "batch_plan": {"groups": 3},
               "model_path": str(stage_dir / "model" / "file.pt")}
    (stage_dir / "train_summary.json").write_text(json.dumps(summary))
    run_id = tracker.start_run(name="mcl-stage1", tags={"stage": "1"})

    def must_not_train(callbacks):
        raise AssertionError("a finished training was trained again")

    class Spec:
        seed = 1001

    @flow
    def record_twice() -> list:
        return [train_and_record(config=config, tracker=tracker, mlflow_run_id=run_id, key="abc",
                                 out_dir=str(stage_dir), stage=1, spec=Spec(), entry="unused",
                                 train_here=must_not_train, batches_from=None, total_steps=8,
                                 extra_metrics=lambda s: {"train/views_per_second": 80.0}) for _ in range(2)]

    first, second = record_twice()
    assert first.summary == second.summary == summary
    assert json.loads((stage_dir / "record.json").read_text())["mlflow_run_id"] == run_id
    history = tracker.client.get_metric_history(run_id, "train/final_loss")
    assert [m.value for m in history] == [2.5]
    assert len(tracker.client.get_metric_history(run_id, "train/views_per_second")) == 1
    assert tracker.client.get_run(run_id).data.tags["train_key"] == "abc"


def test_a_pickle_in_prefects_result_store_is_never_unpickled_and_the_step_is_reused(tmp_path):
    """Prefect reads a cached result with the serializer its file names: a pickle in ``runs/prefect-results`` (an
    earlier version's, naming the old paths, or planted there) would run on the next cache hit. run_step removes it
    first; the step's body returns its finished record.json (nothing computed again) and the result is kept anew as
    JSON naming no path of the run (issue 47)."""
    import base64
    import json
    import pickle
    from pathlib import Path

    from prefect import flow

    from flows.runner import RESULT_STORE, run_step
    from tasks.records import EvalRecord, finished_record
    from tasks.steps import cached_task
    from tests.unit.test_safe_loading import Planted

    computed = []

    @cached_task("tiny-eval")
    def tiny_eval(*, key: str, out_dir: str) -> EvalRecord:
        if (done := finished_record(out_dir, EvalRecord)) is not None:
            return done
        computed.append(key)
        Path(out_dir).mkdir(parents=True)
        return EvalRecord(key=key, dir=out_dir, mlflow_run_id="r", name="probe", metrics={"acc": 0.5}).save()

    storage, out_dir = tmp_path / "runs" / RESULT_STORE, tmp_path / "runs" / "steps" / "eval-k1"

    @flow
    def steps():
        return run_step(tiny_eval, storage=storage, key="k1", out_dir=str(out_dir))

    first = steps()
    result = storage / "tiny-eval-k1"
    written = json.loads(result.read_text())
    sentinel = tmp_path / "SENTINEL"
    result.write_text(json.dumps({"metadata": {**written["metadata"], "serializer": {"type": "pickle"}},
                                  "result": base64.b64encode(pickle.dumps(Planted(sentinel))).decode()}))
    again = steps()
    assert not sentinel.exists(), "Prefect unpickled the planted result"
    assert computed == ["k1"] and again == first
    assert json.loads(result.read_text())["metadata"]["serializer"]["type"] == "mclpipe-step-record"
    assert str(tmp_path) not in json.loads(result.read_text())["result"]


class _Datasets:
    """A tracker that keeps what ``log_dataset`` is given."""

    def __init__(self):
        self.logged: list[dict] = []

    def log_dataset(self, run_id, **dataset):
        self.logged.append({"run_id": run_id, **dataset})


def test_an_inheriting_stage_logs_its_pseudo_labels_and_nothing_else_as_its_pseudo_label_dataset(tmp_path):
    """Naive inheritance (paper_table5_inheritance): stage 1's training receives the data, its pseudo-labels and
    stage 0's TrainRecord (``init_from``). Its MLflow inputs are the data and the pseudo-labels; the model it starts
    from is no pseudo-label dataset (issue 57: every record it received was logged as ``pseudo_labels_stage1``)."""
    from tasks.records import PseudoLabelRecord, TrainRecord
    config = ImagePipelineConfig(output_dir=str(tmp_path / "runs"))
    data = {"dir": str(tmp_path / "data" / "trifeature"), "digest": "d" * 40, "num_train": 100}
    runner = StepRunner(config=config, data=data, parent_run_id="parent", pipeline_id=config.config_hash())
    runner._tracker = _Datasets()
    pseudo = PseudoLabelRecord(key="p" * 40, dir=str(tmp_path / "pseudo1"), mlflow_run_id="r1",
                               path=str(tmp_path / "pseudo1" / "pseudo_labels.npz"), stats={"groups": 7})
    init_from = TrainRecord(key="t" * 40, dir=str(tmp_path / "train0"), mlflow_run_id="r0", stage=0,
                            model_path=str(tmp_path / "train0" / "model.pt"), summary={})
    runner.log_inputs(run_id="r1", stage=1, inputs={"data": data, "batches": pseudo, "init_from": init_from,
                                                    "stage": 1})
    assert [(d["name"], d["context"], d["digest"], d["source"]) for d in runner.tracker.logged] == [
        ("trifeature", "train", "d" * 40, data["dir"]),
        ("pseudo_labels_stage1", "pseudo_labels", "p" * 40, pseudo.path)]
