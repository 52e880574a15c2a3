"""The real `mclpipe` on a run directory in the default layout (runs/, data/, mlflow.db, .prefect/ side by side,
every path relative; issue 47): resumed from another directory, copied elsewhere with the original gone, and with a
finished stage's model deleted, it exits 0 with the first run's results, computing again only what is gone. Slow:
one first run, then one CLI run a test, each starting its own Prefect server."""
import json
import os
import shutil
import subprocess

import pytest

from tests.faults.cli_process import ANSI, MCLPIPE

pytestmark = pytest.mark.slow


def user_env() -> dict[str, str]:
    """A user's shell: no Prefect home, server or MLflow store named, so everything goes where the CLI is run."""
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "250"}
    for name in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    return env


def mclpipe(cwd, *args: str) -> tuple[int, str]:
    done = subprocess.run([MCLPIPE, *args], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=900)
    return done.returncode, ANSI.sub("", done.stdout + done.stderr)


def finished_steps(project) -> dict[str, float]:
    """{step directory: mtime of its record.json} for every finished step."""
    return {p.parent.name: p.stat().st_mtime for p in (project / "runs" / "steps").glob("*/record.json")}


def results(project) -> dict:
    (summary,) = (project / "runs" / "pipelines").glob("*/summary.json")
    return json.loads(summary.read_text())["results"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished `mclpipe run trifeature_tiny` in the default layout: (its directory, its pipeline id)."""
    project = tmp_path_factory.mktemp("first")
    code, output = mclpipe(project, "run", "trifeature_tiny")
    assert code == 0, output[-3000:]
    (pipeline,) = (p.name for p in (project / "runs" / "pipelines").iterdir())
    return project, pipeline


@pytest.mark.timeout(1200)
def test_no_file_of_the_finished_run_names_the_directory_it_ran_in(finished):
    """What the run keeps under runs/ (step records and summaries, Prefect's results, logged models, the saved config)
    names its files relative to the run root: only the logs (history) and Prefect's own storage_key name the
    directory (tests.flows.run_paths; docs/running.md)."""
    from tests.flows.run_paths import files_naming
    project, _ = finished
    assert files_naming(project / "runs", project) == {}
    # not a vacuous search: the log (history) names the directory the way a path of it would be written
    assert any(str(project) in log.read_text() for log in (project / "runs" / "logs").glob("*.log"))


@pytest.mark.timeout(1200)
def test_resume_from_another_directory_reuses_every_step_and_writes_nothing_there(finished, tmp_path):
    original, pipeline = finished
    shutil.copytree(original, tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = finished_steps(tmp_path / "project")
    code, output = mclpipe(elsewhere, "resume", pipeline[:12], "--output-dir", "../project/runs")
    assert code == 0, output[-3000:]
    assert finished_steps(tmp_path / "project") == before  # every step reused
    assert list(elsewhere.iterdir()) == []  # no runs/, data/, mlflow.db or .prefect/ where the command ran
    assert results(tmp_path / "project") == results(original)


@pytest.mark.timeout(1200)
def test_a_copied_run_with_the_original_gone_reruns_without_recomputing_or_touching_the_old_place(finished,
                                                                                                  tmp_path):
    original, _ = finished
    expected = results(original)
    copy = tmp_path / "big-disk"
    shutil.copytree(original, copy)
    away = original.with_name(original.name + ".away")
    original.rename(away)  # the small disk unmounted: reading or writing there would fail or recreate it
    try:
        before = finished_steps(copy)
        code, output = mclpipe(copy, "run", "trifeature_tiny")
        recreated = original.exists()
    finally:
        if original.exists():
            shutil.rmtree(original)
        away.rename(original)
    assert code == 0, output[-3000:]
    assert not recreated
    assert finished_steps(copy) == before and not list((copy / "runs" / "steps").glob("*.replaced-*"))
    assert results(copy) == expected
    assert sum("is now in" in line for line in output.splitlines()) == 1, output[-3000:]  # the MLflow store moved


@pytest.mark.timeout(1200)
def test_a_finished_stage_whose_model_was_deleted_retrains_in_one_line(finished, tmp_path):
    original, _ = finished
    project = tmp_path / "project"
    shutil.copytree(original, project)
    (train_dir,) = (project / "runs" / "steps").glob("train0-*")
    (train_dir / "model" / "model.pt").unlink()
    code, output = mclpipe(project, "run", "trifeature_tiny")
    assert code == 0, output[-3000:]
    lines = [line for line in output.splitlines() if "is gone" in line]
    assert len(lines) == 1 and "model.pt" in lines[0] and "computing it again" in lines[0], output[-3000:]
    assert "rerun the pipeline" not in output
    assert (train_dir / "model" / "model.pt").exists() and list(train_dir.parent.glob("train0-*.replaced-*"))
    assert results(project) == results(original)  # CPU training is deterministic: the same weights again


@pytest.mark.timeout(1800)
def test_after_a_full_disk_the_run_directory_moved_to_a_big_one_finishes_without_recomputing(tmp_path,
                                                                                             small_tmpfs):
    """The disk-full message says to free space or move to a larger disk: the output_dir copied to a big disk and
    the small one unmounted, the rerun there exits 0 (it ended in "trained model .../model.pt is missing: rerun the
    pipeline" for ever), reuses every step that had finished and never writes to the old place."""
    from tests.faults.cli_process import cli_env, one_line

    def run(output_dir):
        args = ["run", "trifeature_tiny", "--set", f"output_dir={output_dir}", "--set",
                f"data.cache_dir={tmp_path / 'data'}", "--set", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
        done = subprocess.run([MCLPIPE, *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True,
                              timeout=1500)
        return done.returncode, ANSI.sub("", done.stdout + done.stderr)

    code, output = run(small_tmpfs / "runs")
    assert code == 2 and one_line(output, "error:").startswith("error: disk full"), output[-3000:]
    shutil.copytree(small_tmpfs / "runs", tmp_path / "big" / "runs")
    before = finished_steps(tmp_path / "big")
    assert before, "the disk filled up before any step finished: the test config needs a larger tmpfs"
    subprocess.run(["umount", "-l", str(small_tmpfs)], check=True)
    code, output = run(tmp_path / "big" / "runs")
    assert code == 0, output[-3000:]
    after = finished_steps(tmp_path / "big")
    assert {name: after[name] for name in before} == before  # reused, not recomputed
    assert list(small_tmpfs.iterdir()) == []  # nothing written where the small disk was
