"""run_job and LogTail (launchers/base.py): streaming, failure messages, cancel on the way out."""
from pathlib import Path

import pytest

from launchers.base import JobFailed, JobHandle, JobSpec, JobState, JobStatus, LogTail, run_job


def test_log_tail_returns_whole_new_lines_only(tmp_path):
    path = tmp_path / "job.log"
    path.write_text("old run\n")
    tail = LogTail(path)
    assert tail.new_lines() == []
    with open(path, "a") as log:
        log.write("one\ntw")
    assert tail.new_lines() == ["one"]
    with open(path, "a") as log:
        log.write("o\nthree\n")
    assert tail.new_lines() == ["two", "three"]
    assert tail.last_lines(2) == ["two", "three"] and tail.last_lines(10) == ["one", "two", "three"]


class ScriptedLauncher:
    """A job whose states and log lines follow a script; records what was called."""
    kind = "scripted"

    def __init__(self, tmp_path: Path, states: list[JobStatus], lines: list[list[str]]):
        self.log = tmp_path / "job.log"
        self.states, self.lines, self.calls = list(states), list(lines), []

    def submit(self, job):
        self.calls.append("submit")
        return JobHandle(kind=self.kind, job_id="42", log=LogTail(self.log))

    def poll(self, handle):
        self.calls.append("poll")
        status = self.states.pop(0)
        with open(self.log, "a") as log:
            log.writelines(f"{line}\n" for line in self.lines.pop(0))
        return status

    def new_lines(self, handle):
        return handle.log.new_lines()

    def last_lines(self, handle, n=20):
        return handle.log.last_lines(n)

    def cancel(self, handle):
        self.calls.append("cancel")


JOB = JobSpec(name="stage0", stage_dir=Path("/runs/s0"), args_path=Path("/runs/s0/a.json"), nproc_per_node=2)


def test_lines_stream_until_success(tmp_path):
    launcher = ScriptedLauncher(tmp_path, [JobStatus(JobState.PENDING), JobStatus(JobState.RUNNING),
                                           JobStatus(JobState.SUCCEEDED)], [[], ["step 1"], ["step 2", "done"]])
    seen, sleeps = [], []
    status = run_job(launcher, JOB, on_line=seen.append, poll_seconds=3, sleep=sleeps.append)
    assert status.state is JobState.SUCCEEDED and seen == ["step 1", "step 2", "done"]
    assert sleeps == [3, 3] and "cancel" not in launcher.calls


def test_a_failed_job_raises_with_its_id_and_last_lines(tmp_path):
    launcher = ScriptedLauncher(tmp_path, [JobStatus(JobState.RUNNING), JobStatus(JobState.FAILED, "exit code 1")],
                                [["a", "b"], ["Traceback", "ValueError: bad"]])
    with pytest.raises(JobFailed) as raised:
        run_job(launcher, JOB, on_line=lambda line: None, poll_seconds=0, sleep=lambda s: None, tail_lines=3)
    message = str(raised.value)
    assert "scripted job 42 of stage0 ended failed (exit code 1)" in message
    assert "  b\n  Traceback\n  ValueError: bad\n" in message and "/runs/s0/checkpoints/last.pt" in message
    assert raised.value.job_id == "42" and raised.value.last_lines == ["b", "Traceback", "ValueError: bad"]
    assert "cancel" not in launcher.calls


def test_an_interruption_cancels_the_job(tmp_path):
    launcher = ScriptedLauncher(tmp_path, [JobStatus(JobState.RUNNING)] * 3, [[]] * 3)

    class FlowCancelled(BaseException):  # Prefect's cancellation is a BaseException raised into the task
        pass

    def sleep(seconds):
        raise FlowCancelled()
    with pytest.raises(FlowCancelled):
        run_job(launcher, JOB, on_line=lambda line: None, poll_seconds=1, sleep=sleep)
    assert launcher.calls == ["submit", "poll", "cancel"]
