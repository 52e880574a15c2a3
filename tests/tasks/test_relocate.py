"""tasks/tracking/relocate.py: a local MLflow store copied or moved with its run directory keeps its artifacts at
the new place, and never reads or writes the old one."""
import logging
import shutil

from tasks.tracking import Tracker
from tasks.tracking.relocate import ARTIFACT_ROOT_TAG


def tracker_in(project, experiment: str = "moves", artifacts: str = "runs/mlartifacts") -> Tracker:
    return Tracker(uri=f"sqlite:///{project / 'mlflow.db'}", experiment=experiment,
                   artifact_root=project / artifacts, retries=0)


def a_run_with_an_artifact(project) -> str:
    tracker = tracker_in(project)
    run_id = tracker.start_run(name="stage", tags={"stage": "0"})
    (project / "model.pt").write_bytes(b"weights")
    tracker.log_artifact(run_id, project / "model.pt", artifact_path="model")
    tracker.end_run(run_id)
    return run_id


def locations(tracker: Tracker, run_id: str) -> tuple[str, str]:
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    return experiment.artifact_location, tracker.client.get_run(run_id).info.artifact_uri


def test_a_copied_store_points_at_its_own_artifacts_and_never_at_the_original(tmp_path, caplog):
    run_id = a_run_with_an_artifact(tmp_path / "old")
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    shutil.rmtree(tmp_path / "old")  # the small disk unmounted: nothing may be read from or written there
    with caplog.at_level(logging.WARNING):
        moved = tracker_in(tmp_path / "new")
    lines = [r.getMessage() for r in caplog.records if "was made in" in r.getMessage()]
    assert len(lines) == 1 and str(tmp_path / "old") in lines[0] and str(tmp_path / "new") in lines[0]
    experiment_location, artifact_uri = locations(moved, run_id)
    assert experiment_location == (tmp_path / "new" / "runs" / "mlartifacts").as_uri()
    assert artifact_uri == (tmp_path / "new" / "runs" / "mlartifacts" / run_id / "artifacts").as_uri()
    assert moved.client.download_artifacts(run_id, "model/model.pt", str(tmp_path / "got"))
    (tmp_path / "new" / "more.txt").write_text("x")
    moved.log_artifact(run_id, tmp_path / "new" / "more.txt")
    assert (tmp_path / "new" / "runs" / "mlartifacts" / run_id / "artifacts" / "more.txt").exists()
    assert not (tmp_path / "old").exists()
    caplog.clear()
    tracker_in(tmp_path / "new")  # once moved, the store is where it is: no second rewrite, no line
    assert not [r for r in caplog.records if "was made in" in r.getMessage()]


def test_a_store_of_an_earlier_version_without_the_tag_follows_its_run_directory(tmp_path):
    tracker = tracker_in(tmp_path / "old")
    run_id = a_run_with_an_artifact(tmp_path / "old")
    tracker.client.delete_experiment_tag(tracker.experiment_id, ARTIFACT_ROOT_TAG)
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    moved = tracker_in(tmp_path / "new")
    assert locations(moved, run_id)[1].startswith((tmp_path / "new").as_uri() + "/")
    assert moved.client.get_experiment(moved.experiment_id).tags[ARTIFACT_ROOT_TAG] == "runs/mlartifacts"


def test_a_store_shared_by_another_output_dir_is_left_where_it_is(tmp_path):
    """Two pipelines of one store with different output_dirs: the experiment keeps the artifact location the first
    one gave it (no move happened), for either."""
    run_id = a_run_with_an_artifact(tmp_path)
    other = tracker_in(tmp_path, artifacts="other/runs/mlartifacts")
    assert locations(other, run_id) == ((tmp_path / "runs" / "mlartifacts").as_uri(),
                                        (tmp_path / "runs" / "mlartifacts" / run_id / "artifacts").as_uri())


def test_an_output_dir_moved_without_its_store_is_followed_and_the_old_place_not_recreated(tmp_path):
    """The store stays (tracking.uri elsewhere), the output_dir moves to a bigger disk and the small one goes."""
    store = tmp_path / "store"
    tracker = Tracker(uri=f"sqlite:///{store / 'mlflow.db'}", experiment="moves",
                      artifact_root=tmp_path / "small" / "runs" / "mlartifacts", retries=0)
    run_id = tracker.start_run(name="stage", tags={"stage": "0"})
    (tmp_path / "model.pt").write_bytes(b"weights")
    tracker.log_artifact(run_id, tmp_path / "model.pt", artifact_path="model")
    shutil.copytree(tmp_path / "small", tmp_path / "big")
    shutil.rmtree(tmp_path / "small")
    moved = Tracker(uri=f"sqlite:///{store / 'mlflow.db'}", experiment="moves",
                    artifact_root=tmp_path / "big" / "runs" / "mlartifacts", retries=0)
    assert locations(moved, run_id) == ((tmp_path / "big" / "runs" / "mlartifacts").as_uri(),
                                        (tmp_path / "big" / "runs" / "mlartifacts" / run_id / "artifacts").as_uri())
    moved.log_artifact(run_id, tmp_path / "model.pt", artifact_path="again")
    assert (tmp_path / "big" / "runs" / "mlartifacts" / run_id / "artifacts" / "again" / "model.pt").exists()
    assert not (tmp_path / "small").exists()
