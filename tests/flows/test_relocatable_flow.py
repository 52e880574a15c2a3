"""A run directory is relocatable and a missing output is recomputed, never a dead end (DESIGN.md section 3; issue 47),
under Prefect's test harness. Slow: each test runs the two-stage tiny pipeline twice."""
import shutil
from pathlib import Path

import pytest

from flows.pipeline import mcl_pipeline
from pipeline_config.loader import load_config
from tests.flows.test_mcl_flow import count_training  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


def config_in(project: Path):
    """The two-stage tiny pipeline with its output_dir, data and MLflow store in ``project``."""
    return load_config("trifeature_tiny", ["mcl.num_stages=2", f"output_dir={project / 'runs'}",
                                           f"data.cache_dir={project / 'data'}",
                                           f"tracking.uri=sqlite:///{project / 'mlflow.db'}"])


def test_a_finished_stage_whose_model_is_gone_retrains_with_the_steps_that_read_it(tmp_path, count_training):
    """The "trained model .../model.pt is missing: rerun the pipeline" dead end: the stage retrains (one line says
    so), and every step that read its model (its export, the k-means and pseudo-labels made from that export, the
    MCL stage trained on them, the evaluations) is computed again; the control's stage 1, which reads nothing of
    stage 0, is reused."""
    calls, _ = count_training
    config = config_in(tmp_path)
    first = mcl_pipeline(config)
    steps = Path(config.output_dir) / "steps"
    (next(steps.glob("train0-*")) / "model" / "model.pt").unlink()
    calls.clear()
    again = mcl_pipeline(config)
    assert calls == ["train0", "train1"]
    replaced = sorted(p.name.split("-")[0] for p in steps.glob("*.replaced-*"))
    # the evaluations of stage 0, stage 1, the MCL concatenation and the control's (it holds stage 0 too)
    assert replaced == ["cluster0", "diag", "diag", "eval", "eval", "eval", "eval", "export0", "export1", "pseudo1",
                        "train0", "train1"], replaced
    assert (next(steps.glob("train0-*[!0-9]")) / "model" / "model.pt").exists()
    assert again["results"] == first["results"]  # CPU training is deterministic: the same weights again


def test_a_copied_run_with_the_original_removed_reuses_every_step_and_never_touches_the_old_place(
        tmp_path, count_training):
    calls, _ = count_training
    first = mcl_pipeline(config_in(tmp_path / "small"))
    shutil.copytree(tmp_path / "small", tmp_path / "big")
    shutil.rmtree(tmp_path / "small")  # the small disk unmounted
    calls.clear()
    again = mcl_pipeline(config_in(tmp_path / "big"))
    assert calls == []
    assert again["results"] == first["results"]
    assert not (tmp_path / "small").exists()  # nothing was read from (it would fail) or written to the old place
    assert not list((tmp_path / "big" / "runs" / "steps").glob("*.replaced-*"))  # no step recomputed
