"""tasks/records.py: a step's record names its files relative to the run root, and is read at the root it is in now
(DESIGN.md section 3: a run directory is relocatable)."""
import json
import shutil

from tasks.records import (RECORD, PseudoLabelRecord, TrainRecord, finished_record, gone_files, in_step_dir,
                           record_kind)


def trained(root, *, model_file: bool = True) -> TrainRecord:
    step = root / "steps" / "train0-abc"
    (step / "model").mkdir(parents=True)
    if model_file:
        (step / "model" / "model.pt").write_bytes(b"weights")
    model = str(step / "model" / "model.pt")
    return TrainRecord(key="abc", dir=str(step), mlflow_run_id="run", stage=0, model_path=model,
                       summary={"model_path": model, "final_loss": 1.5})


def test_a_saved_record_names_no_absolute_path_of_its_run(tmp_path):
    record = trained(tmp_path / "runs").save()
    text = (tmp_path / "runs" / "steps" / "train0-abc" / RECORD).read_text()
    assert str(tmp_path) not in text
    assert json.loads(text)["model_path"] == "steps/train0-abc/model/model.pt"
    assert json.loads(text)["summary"] == {"model_path": "steps/train0-abc/model/model.pt", "final_loss": 1.5}
    assert finished_record(record.dir, TrainRecord) == record


def test_a_copied_run_reads_its_own_files_not_the_originals(tmp_path):
    trained(tmp_path / "old" / "runs").save()
    shutil.copytree(tmp_path / "old", tmp_path / "new")  # the original stays where it was
    copy = finished_record(tmp_path / "new" / "runs" / "steps" / "train0-abc", TrainRecord)
    assert copy.dir == str(tmp_path / "new" / "runs" / "steps" / "train0-abc")
    assert copy.model_path == str(tmp_path / "new" / "runs" / "steps" / "train0-abc" / "model" / "model.pt")
    assert copy.summary["model_path"] == copy.model_path


def test_an_earlier_versions_absolute_record_is_read_at_the_root_it_was_moved_to(tmp_path):
    """Records written before paths were relative hold the writer's absolute paths: read in a copy (the original
    still there), each path under the old root is the same place under the new one; a path outside the run (a data
    set) stays as it was."""
    old_root = tmp_path / "old" / "runs"
    record = trained(old_root)
    (old_root / "steps" / "train0-abc" / RECORD).write_text(json.dumps(record.model_dump(mode="json")))
    pseudo_dir = old_root / "steps" / "pseudo1-def"
    pseudo_dir.mkdir(parents=True)
    outside = str(tmp_path / "datasets" / "labels.npz")
    (pseudo_dir / RECORD).write_text(json.dumps({"key": "def", "dir": str(pseudo_dir), "mlflow_run_id": "run",
                                                 "path": str(pseudo_dir / "pseudo_labels.npz"),
                                                 "stats": {"path": outside, "groups": 3}}))
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    new_root = tmp_path / "new" / "runs"
    moved = finished_record(new_root / "steps" / "train0-abc", TrainRecord)
    assert moved.model_path == str(new_root / "steps" / "train0-abc" / "model" / "model.pt")
    assert moved.summary["model_path"] == moved.model_path
    pseudo = finished_record(new_root / "steps" / "pseudo1-def", PseudoLabelRecord)
    assert pseudo.path == str(new_root / "steps" / "pseudo1-def" / "pseudo_labels.npz")
    assert pseudo.stats == {"path": outside, "groups": 3}
    # read where it was written, an old record is what it always was
    assert finished_record(old_root / "steps" / "train0-abc", TrainRecord) == record


def test_a_finished_record_whose_model_is_gone_names_it(tmp_path):
    record = trained(tmp_path / "runs").save()
    assert gone_files(record.dir, TrainRecord) == [] and record.is_on_disk()
    (tmp_path / "runs" / "steps" / "train0-abc" / "model" / "model.pt").unlink()
    assert gone_files(record.dir, TrainRecord) == [record.model_path]
    assert not record.is_on_disk()
    assert gone_files(tmp_path / "runs" / "steps" / "never-ran", TrainRecord) == []


def test_a_steps_own_summary_path_is_read_in_the_step_directory_where_it_is_now(tmp_path):
    here = tmp_path / "new" / "runs" / "steps" / "train0-abc"
    assert in_step_dir("/elsewhere/runs/steps/train0-abc/model/model.pt", here) == str(here / "model" / "model.pt")
    assert in_step_dir("model/model.pt", here) == str(here / "model" / "model.pt")
    assert in_step_dir("/data/weights.pt", here) == "/data/weights.pt"


def test_record_kind_is_the_tasks_return_type():
    from tasks import steps as t
    assert record_kind(t.train_stage) is TrainRecord
    assert record_kind(t.make_pseudo_labels) is PseudoLabelRecord


def test_an_export_whose_manifest_is_gone_is_not_finished(tmp_path):
    """Its reader would stop with "manifest.json missing: rerun the pipeline to export again": the rerun must."""
    from tasks.records import ExportRecord
    step = tmp_path / "runs" / "steps" / "export0-abc"
    (step / "embeddings").mkdir(parents=True)
    (step / "embeddings" / "manifest.json").write_text("{}")
    record = ExportRecord(key="abc", dir=str(step), mlflow_run_id="run", embeddings_dir=str(step / "embeddings"),
                          num_samples=3, dim=2).save()
    assert gone_files(record.dir, ExportRecord) == []
    (step / "embeddings" / "manifest.json").unlink()
    assert gone_files(record.dir, ExportRecord) == [str(step / "embeddings" / "manifest.json")]


def test_prefect_keeps_a_step_result_as_its_record_json_with_no_path_of_the_run(tmp_path):
    """Prefect's result store (``<output_dir>/prefect-results``) moves with the run: a step's cached result is the
    record as ``record.json`` holds it (relative paths, JSON, no pickle), read back as the same kind of record; a
    failed step's exception as its type and message."""
    from prefect.serializers import Serializer

    from tasks.records import RecordSerializer
    record = trained(tmp_path / "runs")
    blob = RecordSerializer().dumps(record)
    assert str(tmp_path).encode() not in blob and b"pickle" not in blob
    again = Serializer(type=RecordSerializer().type).loads(blob)  # as Prefect finds it by the type it recorded
    assert type(again) is TrainRecord and again.model_dump() == record.stored()
    error = Serializer(type=RecordSerializer().type).loads(RecordSerializer().dumps(OSError("disk full")))
    assert isinstance(error, RuntimeError) and str(error) == "OSError: disk full"
