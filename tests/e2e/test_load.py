"""Many pipelines at once (issue 38, "Load"): eight tiny pipelines (two of each modality, three pairs sharing their
stage 0) submitted together to one process work pool of the team stack (Prefect and MLflow servers on PostgreSQL),
run by one real `prefect worker`, their stages sharing a Prefect global concurrency limit of two slots
(``launcher.concurrency_limit``, what a team sets to its GPU count): all eight complete, never more than two stages
train at once, no shared step is computed twice, every pipeline's MLflow record is whole. Then four of them (the
trifeature pair, which shares stage 0, and the embeddings pair, which shares nothing) with the worker and its flow
runs killed (SIGKILL) halfway and started again: every pipeline reruns to completion from its finished steps, ends
with the undisturbed run's scores, and nothing is recorded twice.

Recorded twice, precisely: a pipeline with more than one parent run; a parent with two child runs of one (kind,
stage); a stage training (one step directory, one content key) with more than one MLflow run tagged with its
``train_key`` or more than one ``train/final_loss`` value; a ``train/loss`` step logged twice in a run; a
registered model with more than one version. A rerun reopens its parent and stage runs (the flow run keeps its
id) and registers the pipeline's model once, when it completes; a stage killed mid-way continues in its own run.

The slots are read from the Prefect server's side (``SlotWatch``: the limit's holders over the whole run, every
holder whatever it does inside its slot, killed ones too) and from the task runs that took one: both slots are used
and never more, every computed training, export, k-means and encoding took a slot, and every slot is given back
(after the kill too: the killed holders' leases run out by themselves, nobody recreates the limit). The killed run
resumes a stage from its checkpoint and ends with the undisturbed run's results.

The numbers of a run (wall time against the sum of the runs over two) are printed (``-s``) and kept as the test's
``record_property`` entries; docs/operating.md has the last ones measured.
"""
import json
import time

import pytest
from mlflow.tracking import MlflowClient

from contrastive.engine.checkpoint import verified_checkpoint
from tests.e2e.load import (LEASE_SECONDS, PIPELINES, SHARING, SLOTS, STAGES, computed_slot_steps, distinct_trainings,
                            load_stack, max_overlap, read_limit, report, slot_holds, step_files, trainings)
from tests.e2e.test_worker_retry import press_retry
from tests.e2e.worker import api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

# The kill test's pipelines: a pair that shares stage 0 (trifeature) and the pair that shares nothing (embeddings),
# both with stages that checkpoint part way (trifeature every 4 steps, embeddings at its first epoch's end). Half
# of the eight: the kill, the lease wait and the rerun cost about a whole undisturbed run of what they hold (20 min
# of CI for the eight on 2 cores, 2026-11-29), and every check of a lost worker holds for one pair of each kind.
KILLED = [pipeline for pipeline in PIPELINES if pipeline[1] in ("trifeature_tiny", "embeddings_tiny")]
SERVED = {"trifeature_tiny", "clip_tiny", "embeddings_tiny"}  # the modalities that register a model (text: none)


def check_records(load, runs: dict[str, dict], *, killed: bool = False) -> None:
    """Every pipeline's MLflow run tree and registered model whole; every stage trained once, its steps logged
    once; the pipelines that share stage 0 point at the one run that trained it (module docstring). After a kill
    (``killed``), the killed attempt's runs that the rerun did not carry on end KILLED or FAILED (docs/tracking.md):
    none is left RUNNING, and none is what a pipeline links to or counts among its stage runs."""
    client = MlflowClient(tracking_uri=load.stack.mlflow_url)
    experiment = client.get_experiment_by_name(load.experiment)
    every = client.search_runs([experiment.experiment_id], max_results=2000)
    by_id = {r.info.run_id: r for r in every}
    # a run left RUNNING reads in the MLflow UI as a pipeline still going; name each with what it holds
    open_runs = [(r.info.run_name, r.info.status, {k: v for k, v in r.data.tags.items() if k.startswith(
        ("kind", "stage", "pipeline_id", "prefect.flow_run_id", "reused.", "train_key", "mlflow.parentRunId"))},
        sorted(r.data.metrics)[:5]) for r in every if r.info.status != "FINISHED"]
    ended = {"KILLED", "FAILED"} if killed else set()
    assert not [run for run in open_runs if run[1] not in ended], open_runs
    every = [r for r in every if r.info.status == "FINISHED"]  # a dead attempt's ended runs hold nothing linked

    # each stage's training: one step directory, one run tagged with its key, one final loss, no step twice
    dirs = sorted(p for p in load.steps.glob("*train[0-9]*-*") if p.is_dir())
    assert not [d for d in dirs if ".replaced-" in d.name], dirs  # nothing was recomputed over a finished step
    presets = {pipeline.preset for pipeline in load.pipelines}
    assert len(dirs) == distinct_trainings([p for p in PIPELINES if p[1] in presets]), [d.name for d in dirs]
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
            assert run_id in by_id and by_id[run_id].info.status == "FINISHED", (pipeline.name, stage, run_id)
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
    for preset in presets:
        shares = SHARING[preset]
        pair = {stage0_trained_in[p.name] for p in load.pipelines if p.preset == preset}
        assert len(pair) == (1 if shares else 2), (preset, pair)


def check_slots(load, *, killed: bool = False) -> list:
    """Both slots used at once and never more (SLOTS > 1, so a serialised run fails), from the limit's holders
    over the whole run; every computed training, export, k-means and encoding took a slot (one that ran beside two
    holders without one fails), exactly once in an undisturbed run (at least once after a kill: a killed holder
    took its slot again), and no other step took one; every slot is given back."""
    load.slots.stop()
    assert load.slots.samples, load.slots.errors[-3:]
    assert SLOTS > 1 and load.slots.most() == SLOTS, (load.slots.most(), load.slots.samples[::50])
    held, computed = slot_holds(load), computed_slot_steps(load.steps)
    # CLIP's evaluation encodings are the one "encode" step (the other modalities encode inside their eval step)
    encodes = {"encode"} if any(pipeline.preset == "clip_tiny" for pipeline in load.pipelines) else set()
    assert set(held) == set(computed) == {"train", "export", "cluster", *encodes}, (held, computed)
    if killed:
        assert all(held[kind] >= computed[kind] for kind in computed), (held, computed)
    else:
        assert held == computed
    if killed:  # a killed holder's slot comes back when its lease runs out, which a quick rerun can beat: wait
        deadline = time.time() + LEASE_SECONDS + 60
        while read_limit(load.stack, load.limit)["active_slots"] and time.time() < deadline:
            time.sleep(2)
    assert read_limit(load.stack, load.limit)["active_slots"] == 0  # every slot given back: none leaked
    trained = trainings(load.steps)
    assert max_overlap([(t.start, t.end) for t in trained]) <= SLOTS
    return trained


def results(load, runs: dict[str, dict]) -> dict[str, dict[str, float]]:
    """{pipeline's short name: its parent run's eval/* metrics} (what its summary and the MLflow UI report)."""
    client = MlflowClient(tracking_uri=load.stack.mlflow_url)
    out = {}
    for pipeline in load.pipelines:
        [parent] = client.search_runs([client.get_experiment_by_name(load.experiment).experiment_id],
                                      f"tags.kind = 'pipeline' and tags.pipeline_name = '{pipeline.name}'")
        out[pipeline.name.removeprefix(f"load_{load.tag}_")] = {
            k: v for k, v in parent.data.metrics.items() if k.startswith("eval/")}
    return out


def report_numbers(load, runs, record_property, **extra) -> dict:
    numbers = {**report(load, runs), "max_trainings_at_once": max_overlap(
        [(t.start, t.end) for t in trainings(load.steps)]), **extra}
    print(f"\nload ({load.tag}): {json.dumps(numbers)}")
    for name, value in numbers.items():
        record_property(name, value)
    return numbers


@pytest.fixture(scope="module")
def undisturbed(team_stack):
    """The eight pipelines run once, undisturbed: (load, flow runs), the worker ended; what the killed run's
    results are compared with."""
    with load_stack(team_stack, "all") as load:
        load.submit_all()
        runs = load.wait_all(seconds=2400)
        load.close()
        yield load, runs


def test_eight_pipelines_at_once_share_two_slots(undisturbed, record_property):
    load, runs = undisturbed
    assert {r["run_count"] for r in runs.values()} == {1}
    check_slots(load)
    check_records(load, runs)
    report_numbers(load, runs, record_property, most_slots_held=load.slots.most())


def mid_training(steps) -> list:
    """Trainings under way that have written a checkpoint they would resume from (no summary yet)."""
    return [d for d in steps.glob("*train[0-9]*-*") if d.is_dir() and not (d / "train_summary.json").exists()
            and verified_checkpoint(d / "checkpoints" / "last.pt") is not None]


@pytest.mark.timeout(3600)
def test_a_killed_worker_restarted_reruns_every_pipeline_from_its_finished_steps(team_stack, undisturbed,
                                                                                record_property):
    with load_stack(team_stack, "kill", KILLED) as load:
        load.submit_all()
        # halfway: about half of the stage trainings finished, and a stage under way past its first checkpoint
        deadline, total = time.time() + 2400, distinct_trainings(KILLED)
        while (done := len(trainings(load.steps))) < total // 2 or not mid_training(load.steps):
            assert time.time() < deadline, load.log.read_text()[-4000:]
            assert done < total, "every stage finished before one was seen past its checkpoint: kill earlier"
            time.sleep(0.5)
        load.kill_worker()
        interrupted = mid_training(load.steps)
        assert interrupted, "every stage under way finished before the kill: kill earlier"
        before = load.runs()
        unfinished = {name for name, r in before.items() if r["state_type"] != "COMPLETED"}
        assert unfinished, "every pipeline finished before the kill: kill earlier"
        finished_files = step_files(load.steps)
        trained_before = {t.dir for t in trainings(load.steps)}

        # The slots the killed flow runs held stay taken until their leases run out (load.py's LEASE_SECONDS after
        # the kill): the rerun waits for them; nobody recreates the limit (check_slots: all given back at the end).
        leaked = read_limit(load.stack, load.limit)["active_slots"]
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
        assert trained_before <= {t.dir for t in check_slots(load, killed=True)}
        check_records(load, runs, killed=True)
        # each stage killed past a checkpoint resumed from it, in its own MLflow run
        client = MlflowClient(tracking_uri=load.stack.mlflow_url)
        for directory in interrupted:
            resumed = json.loads((directory / "train_summary.json").read_text())["resumed_from_step"]
            run_id = json.loads((directory / "record.json").read_text())["mlflow_run_id"]
            assert resumed and client.get_run(run_id).data.tags.get("resumed_from_step") == str(resumed), directory
        # and every pipeline ends with the scores of the undisturbed run (the same configs, a bit-exact resume)
        got = results(load, runs)
        expected = {name: metrics for name, metrics in results(*undisturbed).items() if name in got}
        assert set(got) == set(expected) == {short for short, _, _ in KILLED} and all(set(got[n]) == set(expected[n]) and expected[n] for n in got)
        differ = {(n, k): (got[n][k], v) for n in got for k, v in expected[n].items() if abs(got[n][k] - v) > 1e-4}
        assert not differ, differ
        report_numbers(load, runs, record_property, killed_after_trainings=len(trained_before),
                       pipelines_rerun=len(unfinished), slots_held_at_the_kill=leaked,
                       stages_resumed=len(interrupted), most_slots_held=load.slots.most())
