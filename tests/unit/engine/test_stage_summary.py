"""contrastive.engine.files.write_stage_summary: a step's summary names its own files relative to its directory,
so a moved run directory holds no path of the machine that wrote it (DESIGN.md section 3)."""
import json

from contrastive.engine.files import write_stage_summary


def test_paths_inside_the_step_are_written_relative_and_others_as_they_are(tmp_path):
    stage = tmp_path / "runs" / "steps" / "train0-abc"
    stage.mkdir(parents=True)
    summary = {"model_path": str(stage / "model" / "model.pt"), "isotropy_path": str(stage / "isotropy.json"),
               "data": str(tmp_path / "data" / "index.npz"), "steps": 8, "batch_plan": {"groups": 3}}
    write_stage_summary(stage / "train_summary.json", summary)
    written = json.loads((stage / "train_summary.json").read_text())
    assert written == {**summary, "model_path": "model/model.pt", "isotropy_path": "isotropy.json"}
    assert summary["model_path"] == str(stage / "model" / "model.pt")  # the caller's dict keeps its paths
