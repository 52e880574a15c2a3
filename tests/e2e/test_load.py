"""Many pipelines at once (issue 38, "Load"): eight tiny pipelines (two of each modality, three pairs sharing their
stage 0) submitted together to one process work pool of the team stack (Prefect and MLflow servers on PostgreSQL),
run by one real `prefect worker`, their stages sharing a Prefect global concurrency limit of two slots
(``launcher.concurrency_limit``, what a team sets to its GPU count): all eight complete, never more than two stages
train at once, no shared step is computed twice, every pipeline's MLflow record is whole. Then the same with the
worker and its flow runs killed (SIGKILL) halfway and started again: every pipeline reruns to completion from its
finished steps, and nothing is recorded twice.

Recorded twice, precisely: a pipeline with more than one parent run; a parent with two child runs of one (kind,
stage); a stage training (one step directory, one content key) with more than one MLflow run tagged with its
``train_key`` or more than one ``train/final_loss`` value; a ``train/loss`` step logged twice in a run; a
registered model with more than one version. A rerun reopens its parent and stage runs (the flow run keeps its
id) and registers the pipeline's model once, when it completes; a stage killed mid-way continues in its own run.

The numbers of a run (wall time against the sum of the runs over two) are printed (``-s``) and kept as the test's
``record_property`` entries; docs/operating.md has the last ones measured.
"""
import json
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.load import (PIPELINES, SHARING, SLOTS, STAGES, create_limit, delete_limit, load_stack, max_overlap,
                            read_limit, report, step_files, trainings)
from tests.e2e.test_worker_retry import press_retry
from tests.e2e.worker import api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

# Distinct stage trainings: two stages a pipeline, stage 0 shared by three of the four pairs.
TRAININGS = sum(STAGES * 2 - (1 if SHARING[preset] else 0) for preset in SHARING)
SERVED = {"trifeature_tiny", "clip_tiny", "embeddings_tiny"}  # the modalities that register a model (text: none)


def check_records(load, runs: dict[str, dict]) -> None:
    """Every pipeline's MLflow run tree and registered model whole; every stage trained once, its steps logged
    once; the pipelines that share stage 0 point at the one run that trained it (module docstring)."""
    client = MlflowClient(tracking_uri=load.stack.mlflow_url)
    experiment = client.get_experiment_by_name(load.experiment)
    every = client.search_runs([experiment.experiment_id], max_results=2000)
    by_id = {r.info.run_id: r for r in every}
    # a run left RUNNING reads in the MLflow UI as a pipeline still going; name each with what it holds
    open_runs = [(r.info.run_name, r.info.status, {k: v for k, v in r.data.tags.items() if k.startswith(
        ("kind", "stage", "pipeline_id", "prefect.flow_run_id", "reused.", "train_key", "mlflow.parentRunId"))},
        sorted(r.data.metrics)[:5]) for r in every if r.info.status != "FINISHED"]
    assert not open_runs, open_runs

    # each stage's training: one step directory, one run tagged with its key, one final loss, no step twice
    dirs = sorted(p for p in load.steps.glob("*train[0-9]*-*") if p.is_dir())
    assert not [d for d in dirs if ".replaced-" in d.name], dirs  # nothing was recomputed over a finished step
    assert len(dirs) == TRAININGS, [d.name for d in dirs]
    trained_by = {}
    for directory in dirs:
        key = directory.name.rsplit("-", 1)[1]  # <prefix>train<stage>-<content key>
        tagged = [r for r in every if r.data.tags.get("train_key") == key]
        assert len(tagged) == 1, (directory.name, [r.info.run_name for r in tagged])
        run = tagged[0]
        assert len(client.get_metric_history(run.info.run_id, "train/final_loss")) == 1, directory.name
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps and len(steps) == len(set(steps)), (directory.name, steps)
        assert json.loads((directory / "record.json").read_text())["mlflow_run_id"] == run.info.run_id
        trained_by[run.info.run_id] = directory

    stage0_trained_in = {}
    for pipeline in load.pipelines:
        parents = [r for r in every if r.data.tags.get("kind") == "pipeline"
                   and r.data.tags.get("pipeline_name") == pipeline.name]
        assert len(parents) == 1, (pipeline.name, [r.info.run_name for r in parents])
        parent = parents[0]
        assert parent.data.tags["prefect.flow_run_id"] == runs[pipeline.name]["id"]
        children = [r for r in every if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        kinds = [(r.data.tags["kind"], r.data.tags["stage"]) for r in children]
        assert len(kinds) == len(set(kinds)), (pipeline.name, kinds)
        assert any(k.startswith("eval/mcl_concat/") for k in parent.data.metrics), pipeline.name
        for stage in range(STAGES):
            run_id = parent.data.tags[f"stage_run.mcl.stage.{stage}"]
            stage_run = by_id[run_id]
            # the run that trained this stage: this one, or the one its reuse tag names
            trainer = run_id if run_id in trained_by else stage_run.data.tags.get("reused.train.source_run_id")
            assert trainer in trained_by, (pipeline.name, stage, stage_run.data.tags)
            if stage == 0:
                stage0_trained_in[pipeline.name] = trainer
        if pipeline.preset in SERVED:
            versions = client.search_model_versions(f"name='{pipeline.name}'")
            assert len(versions) == 1, (pipeline.name, [(v.version, v.run_id) for v in versions])
            assert client.get_model_version_by_alias(pipeline.name, "current").run_id == parent.info.run_id
    for preset, shares in SHARING.items():
        pair = {stage0_trained_in[p.name] for p in load.pipelines if p.preset == preset}
        assert len(pair) == (1 if shares else 2), (preset, pair)


def check_slots(load) -> list:
    """Never more than SLOTS stage trainings at one moment, from every finished training's recorded interval."""
    trained = trainings(load.steps)
    most = max_overlap([(t.start, t.end) for t in trained])
    assert 1 <= most <= SLOTS, [(t.dir.name, round(t.start, 1), round(t.end, 1)) for t in trained]
    assert read_limit(load.stack, load.limit)["active_slots"] == 0  # every slot given back
    return trained


def report_numbers(load, runs, record_property, **extra) -> dict:
    numbers = {**report(load, runs), "max_trainings_at_once": max_overlap(
        [(t.start, t.end) for t in trainings(load.steps)]), **extra}
    print(f"\nload ({load.tag}): {json.dumps(numbers)}")
    for name, value in numbers.items():
        record_property(name, value)
    return numbers


def test_eight_pipelines_at_once_share_two_slots(team_stack, record_property):
    with load_stack(team_stack, "all") as load:
        load.submit_all()
        runs = load.wait_all(seconds=2400)
        assert {r["run_count"] for r in runs.values()} == {1}
        check_slots(load)
        check_records(load, runs)
        report_numbers(load, runs, record_property)


@pytest.mark.timeout(3600)
def test_a_killed_worker_restarted_reruns_every_pipeline_from_its_finished_steps(team_stack, record_property):
    with load_stack(team_stack, "kill") as load:
        load.submit_all()
        # halfway: about half of the stage trainings finished, and some pipeline still running
        deadline = time.time() + 2400
        while len(trainings(load.steps)) < TRAININGS // 2:
            assert time.time() < deadline, load.log.read_text()[-4000:]
            time.sleep(1)
        load.kill_worker()
        before = load.runs()
        unfinished = {name for name, r in before.items() if r["state_type"] != "COMPLETED"}
        assert unfinished, "every pipeline finished before the kill: kill earlier"
        finished_files = step_files(load.steps)
        trained_before = {t.dir for t in trainings(load.steps)}

        # The slots the killed flow runs held stay taken until their lease runs out (Prefect's default: 300 s);
        # the operator who knows the holders are dead frees them now by creating the limit again (the stale
        # leases then expire against the deleted one).
        leaked = read_limit(load.stack, load.limit)["active_slots"]
        delete_limit(load.stack, load.limit)
        create_limit(load.stack, load.limit)
        # Nobody is left to report the killed flow runs: they still read Running. The operator marks them Crashed
        # (the UI's "Change state", forced) and presses Retry (tests/e2e/test_worker_retry.py); scheduled ones the
        # new worker picks up by itself.
        for name in unfinished:
            if before[name]["state_type"] in ("RUNNING", "PENDING"):
                api(load.stack, f"/flow_runs/{before[name]['id']}/set_state",
                    {"state": {"type": "CRASHED", "message": "worker lost (SIGKILL)"}, "force": True})
            if before[name]["state_type"] != "SCHEDULED":
                assert press_retry(load.stack, before[name]["id"])["status"] == "ACCEPT", name
        load.start_worker()
        runs = load.wait_all(seconds=2400)

        # the retried ones ran twice, under their own ids; the rest once
        assert {name for name, r in runs.items() if r["run_count"] == 2} <= unfinished
        assert all(r["run_count"] == 1 for name, r in runs.items() if name not in unfinished)
        # every step finished before the kill was reused as it was: no file of it rewritten, none added
        after = {p: p.stat().st_mtime_ns for record in {f.parent for f in finished_files if f.name == "record.json"}
                 for p in record.rglob("*") if p.is_file()}
        assert after == finished_files
        assert trained_before <= {t.dir for t in check_slots(load)}
        check_records(load, runs)
        report_numbers(load, runs, record_property, killed_after_trainings=len(trained_before),
                       pipelines_rerun=len(unfinished), slots_leaked_by_the_kill=leaked)
