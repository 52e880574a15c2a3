"""MLflow whole after a kill (flows/attempts.py): a process killed with SIGKILL closes none of its MLflow runs; the
next attempt of the same pipeline (a CLI rerun or `mclpipe resume`: a new Prefect flow run) carries its parent run
on, continues the killed stage in its own run (one loss curve), and leaves no run RUNNING. The kill is simulated
the way the kernel does it: the attempt's lock is released and nothing else happens (no run is closed)."""
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from contrastive.modalities.image import steps as stages
from flows import attempts
from flows.attempts import AttemptLock, claim_dead_attempts
from flows.pipeline import mcl_pipeline
from flows.runner import StepRunner
from tests.flows.mlflow_runs import run_tree


class Killed(Exception):
    """What the simulated SIGKILL raises inside stage 1's training (after its checkpoint of step 4)."""


class KillAfter:
    """A training callback that ends the stage at ``step``, as a SIGKILL would (after the checkpoint before it)."""

    def __init__(self, step: int):
        self.step = step

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        if step >= self.step:
            raise Killed(f"killed at step {step}")

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        pass


def kill_stage1_once(monkeypatch):
    """Stage 1's training dies at step 6 (it checkpoints at step 4); the dying process closes no MLflow run and
    its attempt's lock is released by the kernel, its file left behind."""
    real = stages.train_stage

    def dying(spec, **kwargs):
        if Path(spec.stage_dir).name.startswith("train1-"):
            kwargs["callbacks"] = [*kwargs.get("callbacks", []), KillAfter(6)]
        return real(spec, **kwargs)

    monkeypatch.setattr(stages, "train_stage", dying)
    monkeypatch.setattr(StepRunner, "close", lambda self, *, status: None)
    monkeypatch.setattr(AttemptLock, "end", AttemptLock.release)


@pytest.mark.slow  # two runs of the tiny pipeline (about 60-100 s on a loaded 2-core machine)
def test_a_rerun_after_a_kill_carries_the_killed_runs_on_and_leaves_none_running(tiny_config, monkeypatch):
    config = tiny_config("mcl.num_stages=2", "mcl.control=false")
    kill_stage1_once(monkeypatch)
    with pytest.raises(Exception, match="killed at step 6"):
        mcl_pipeline(config)
    monkeypatch.undo()
    client = MlflowClient(tracking_uri=config.tracking.uri)
    parents, children = run_tree(config.tracking.uri)
    assert [p.info.status for p in parents] == ["RUNNING"] and {c.info.status for c in children} == {"RUNNING"}

    summary = mcl_pipeline(config)  # the rerun: a new Prefect flow run of the same pipeline

    parents, children = run_tree(config.tracking.uri)
    every = client.search_runs([parents[0].info.experiment_id])
    assert [(r.info.run_name, r.info.status) for r in every if r.info.status != "FINISHED"] == []
    assert len(parents) == 1 and parents[0].data.tags.get("resumed_after_kill") == "true"
    assert sorted((c.data.tags["kind"], c.data.tags["stage"]) for c in children) == [("mcl", "0"), ("mcl", "1")]
    stage1 = next(c for c in children if c.data.tags["stage"] == "1")
    # one loss curve: the steps logged before the kill (2, 4: the checkpoint holds them) and after it (6, 8)
    steps = [m.step for m in client.get_metric_history(stage1.info.run_id, "train/loss")]
    assert sorted(steps) == [2, 4, 6, 8], steps
    assert stage1.data.tags["resumed_from_step"] == "4" and "train/final_loss" in stage1.data.metrics
    # the pipeline's links point at the runs that hold the stages, all finished, under the one parent
    linked = {run["run_id"] for run in summary["stage_runs"].values()}
    assert linked == {c.info.run_id for c in children}


def test_a_running_attempt_is_not_taken_over_and_a_dead_one_is(tmp_path):
    running = AttemptLock.take(tmp_path / attempts.ATTEMPTS_DIR / "run-a.lock")
    assert running is not None and claim_dead_attempts(tmp_path).locks == []  # alive: its runs are its own
    running.release()  # what the kernel does when its process dies
    dead = claim_dead_attempts(tmp_path)
    assert dead.parent_run_ids == ["run-a"]
    assert claim_dead_attempts(tmp_path).locks == []  # taken over once: held by the attempt that took it
    dead.locks[0].end()
    assert claim_dead_attempts(tmp_path).locks == [] and not (tmp_path / attempts.ATTEMPTS_DIR / "run-a.lock").exists()
