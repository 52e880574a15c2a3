"""tasks/launching.py under Prefect's test harness: a stage's job log streams into the task's log, a failed job
fails the task with its id and last lines, and the global concurrency limit is held for the whole stage. The job
itself is scripted here (the real Slurm path: tests/launchers/test_slurm_real.py)."""
import json
from pathlib import Path

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.context import get_run_context
from prefect.logging.handlers import APILogWorker

from contrastive.errors import ConfigError
from launchers.base import JobHandle, JobState, JobStatus, LogTail
from pipeline_config.loader import load_config
from tasks.launching import gpu_slot, job_name, run_stage_processes, uses_processes


class ScriptedJob:
    """A cluster job that prints a few lines, optionally fails, and writes rank 0's summary when it succeeds.
    Records the active slots of the concurrency limit ``watch`` while it runs."""
    kind = "scripted"

    def __init__(self, *, fail: bool = False, watch: str | None = None):
        self.fail, self.watch, self.polls, self.slots_seen, self.cancelled = fail, watch, 0, [], False

    def submit(self, job):
        self.job = job
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        return JobHandle(kind=self.kind, job_id="777", log=LogTail(job.log_path))

    def poll(self, handle):
        self.polls += 1
        if self.watch:
            with get_client(sync_client=True) as client:
                self.slots_seen.append(client.read_global_concurrency_limit_by_name(self.watch).active_slots)
        with open(self.job.log_path, "a") as log:
            log.write(f"step {self.polls}\n")
            if self.polls < 3:
                return JobStatus(JobState.RUNNING)
            if self.fail:
                log.write("RuntimeError: CUDA out of memory\n")
                return JobStatus(JobState.FAILED, "OUT_OF_MEMORY")
        (Path(self.job.stage_dir) / "train_summary.json").write_text(json.dumps({"steps": 3}))
        return JobStatus(JobState.SUCCEEDED)

    def new_lines(self, handle):
        return handle.log.new_lines()

    def last_lines(self, handle, n=20):
        return handle.log.last_lines(n)

    def cancel(self, handle):
        self.cancelled = True


@task
def launch(config, stage_dir: str, job) -> dict:
    with gpu_slot(config):
        return run_stage_processes(config=config, what="train", entry="contrastive.modalities.image.steps:train_stage_from_json",
                                   kwargs={"spec": {}}, stage_dir=stage_dir, launcher=job)


@flow
def one_stage(config, stage_dir: str, job) -> tuple[dict, str]:
    return launch(config, stage_dir, job), str(get_run_context().flow_run.id)


def flow_logs(flow_run_id: str) -> list[str]:
    APILogWorker.drain_all(timeout=10)  # logs reach the server in batches
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                 limit=200, offset=0)
    return [log.message for log in logs]


def slurm_config(tmp_path, *extra):
    return load_config("trifeature_tiny", [f"output_dir={tmp_path}", "launcher.kind=slurm",
                                           "launcher.slurm.poll_seconds=0.05", *extra])


def test_job_lines_reach_the_task_log(tmp_path):
    config = slurm_config(tmp_path)
    assert uses_processes(config) and not uses_processes(load_config("trifeature_tiny", []))
    job = ScriptedJob()
    result, flow_run_id = one_stage(config, str(tmp_path / "train" / "ab12cd"), job)
    assert result == {"steps": 3} and not job.cancelled
    messages = flow_logs(flow_run_id)
    assert [m for m in messages if m.startswith("[train] ")] == ["[train] step 1", "[train] step 2", "[train] step 3"]
    assert any("scripted job 777 submitted" in m for m in messages)
    assert job.job.name == "mclpipe-image-train-ab12cd" and job.job.nproc_per_node == 1


def test_a_failed_job_fails_the_task_with_its_id_and_last_lines(tmp_path):
    state = one_stage(slurm_config(tmp_path), str(tmp_path / "train" / "x"), ScriptedJob(fail=True),
                      return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception) as raised:
        state.result()
    message = str(raised.value)
    assert "scripted job 777 of mclpipe-image-train-x ended failed (OUT_OF_MEMORY)" in message
    assert "  step 3\n  RuntimeError: CUDA out of memory" in message and "checkpoints/last.pt" in message


def test_the_concurrency_limit_is_held_for_the_whole_stage(tmp_path):
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu-pool", limit=1))
    job = ScriptedJob(watch="gpu-pool")
    one_stage(slurm_config(tmp_path, "launcher.concurrency_limit=gpu-pool"), str(tmp_path / "t" / "s"), job)
    assert job.slots_seen == [1, 1, 1]
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name("gpu-pool").active_slots == 0


def test_a_missing_concurrency_limit_names_the_fix(tmp_path):
    state = one_stage(slurm_config(tmp_path, "launcher.concurrency_limit=no-such-pool"),
                      str(tmp_path / "t" / "s"), ScriptedJob(), return_state=True)
    with pytest.raises(ConfigError, match="prefect gcl create no-such-pool --limit"):
        state.result()


def test_job_names_are_dns_labels(tmp_path):
    name = job_name(config=slurm_config(tmp_path), stage_dir="/r/train/AB_12345678901234", what="export")
    assert name == "mclpipe-image-export-ab-1234567"
