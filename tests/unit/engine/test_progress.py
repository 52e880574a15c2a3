"""The stage progress callback: its rate and time-left arithmetic, and when it speaks (a bar on a TTY, a plain line
every N seconds elsewhere). tqdm's rendering is not tested here."""
import io

import pytest

from contrastive.engine.callbacks import ProgressClock, StageProgress, format_seconds


def test_format_seconds_reads_like_a_clock():
    assert [format_seconds(s) for s in (0, 7.4, 125, 3723, -3)] == ["0:00", "0:07", "2:05", "1:02:03", "0:00"]


def test_nothing_is_claimed_before_two_reports():
    clock = ProgressClock(total_steps=100, started=0.0)
    assert clock.seconds_left() is None and clock.samples_per_second() is None
    clock.observe(now=5.0, step=10, samples_per_second=128.0)
    assert clock.seconds_left() is None
    assert clock.samples_per_second() == 128.0  # the loop's own window rate is known at once
    assert clock.rates() == "128 samples/s, ? left"


def test_time_left_is_the_steps_left_at_the_recent_pace():
    clock = ProgressClock(total_steps=100, started=0.0, window_seconds=30.0)
    clock.observe(now=10.0, step=10, samples_per_second=64.0)
    clock.observe(now=12.0, step=20, samples_per_second=320.0)  # 10 steps in 2 s: 5 steps/s
    assert clock.steps_per_second() == pytest.approx(5.0)
    assert clock.seconds_left() == pytest.approx(80 / 5.0)
    assert clock.samples_per_second() == pytest.approx(320.0)
    assert clock.line(now=12.0, description="stage 0", loss=1.23456) == (
        "stage 0: step 20/100 (20%), 320 samples/s, 0:16 left, 0:12 elapsed, loss 1.235")


def test_the_rates_follow_the_last_window_not_the_start():
    clock = ProgressClock(total_steps=1000, started=0.0, window_seconds=10.0)
    t = 0.0
    for step in range(10, 110, 10):  # 10 steps a second, 640 samples/s
        t += 1.0
        clock.observe(now=t, step=step, samples_per_second=640.0)
    for step in range(110, 210, 10):  # then the machine gets busy: 10 steps every 4 s, 160 samples/s
        t += 4.0
        clock.observe(now=t, step=step, samples_per_second=160.0)
    assert clock.steps_per_second() == pytest.approx(2.5)
    assert clock.seconds_left() == pytest.approx(800 / 2.5)
    assert clock.samples_per_second() == pytest.approx(160.0)
    # The stage's mean weights each report's rate by the time it covered: 9 s at 640, 40 s at 160.
    assert clock.mean_samples_per_second() == pytest.approx((9 * 640 + 40 * 160) / 49)


def test_a_resumed_stage_counts_only_its_own_steps():
    clock = ProgressClock(total_steps=100, started=0.0)
    clock.observe(now=30.0, step=60, samples_per_second=100.0)  # resumed at step 50, slow start-up
    clock.observe(now=32.0, step=70, samples_per_second=100.0)
    assert clock.seconds_left() == pytest.approx(30 / 5.0)


def test_time_left_never_goes_negative_past_the_planned_steps():
    clock = ProgressClock(total_steps=10, started=0.0)
    clock.observe(now=1.0, step=10)
    clock.observe(now=2.0, step=12)
    assert clock.seconds_left() == 0.0


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(progress: StageProgress, clock: _Clock, *, steps: int, seconds_per_report: float) -> None:
    for step in range(10, steps + 1, 10):
        clock.now += seconds_per_report
        progress.on_step(step=step, epoch=0, metrics={"train/loss": 2.0, "train/samples_per_s": 320.0})


def test_off_a_terminal_it_says_one_line_every_period_not_every_step():
    said, clock = [], _Clock()
    progress = StageProgress(total_steps=300, description="stage 1", say=said.append, stream=_Stream(tty=False),
                             every_seconds=30.0, clock=clock)
    assert progress.bar is None
    _run(progress, clock, steps=300, seconds_per_report=2.0)  # 30 reports over 60 s
    assert said == ["stage 1: step 150/300 (50%), 320 samples/s, 0:30 left, 0:30 elapsed, loss 2.000",
                    "stage 1: step 300/300 (100%), 320 samples/s, 0:00 left, 1:00 elapsed, loss 2.000"]
    progress.close(steps=305)  # the loop reports every 10 steps: the stage's own count is the last word
    assert said[-1] == "stage 1: trained 305 steps in 1:00, 320 samples/s"


def test_on_a_terminal_the_bar_carries_the_rate_and_time_left_and_no_line_is_said():
    said, clock, stream = [], _Clock(), _Stream(tty=True)
    progress = StageProgress(total_steps=300, description="stage 0", say=said.append, stream=stream,
                             every_seconds=30.0, clock=clock)
    assert progress.bar is not None
    _run(progress, clock, steps=150, seconds_per_report=2.0)
    assert progress.bar.n == 150
    assert progress.bar.postfix == "320 samples/s, 0:30 left, loss 2.000"
    assert said == []
    progress.close()
    assert said == ["stage 0: stopped at step 150 of 300 in 0:30, 320 samples/s"]


def test_a_stage_that_reported_nothing_closes_silently():
    said = []
    StageProgress(total_steps=10, description="stage 0", say=said.append, stream=_Stream(tty=False)).close()
    assert said == []


def test_one_pause_between_epochs_does_not_multiply_the_time_left():
    clock = ProgressClock(total_steps=3000, started=0.0)  # the default window
    for second in range(1, 101):  # 10 steps a second
        clock.observe(now=float(second), step=10 * second, samples_per_second=640.0)
    steady = clock.seconds_left()
    clock.observe(now=140.0, step=1010, samples_per_second=640.0)  # a 40 s pause (an epoch's start on a busy host)
    assert steady == pytest.approx(200.0)
    assert steady < clock.seconds_left() < 2 * steady


def test_the_loops_plan_replaces_the_callers_reckoning():
    said, clock, stream = [], _Clock(), _Stream(tty=True)
    progress = StageProgress(total_steps=300, description="stage 1", say=said.append, stream=stream, clock=clock)
    progress.on_train_start(total_steps=372, step=40)  # cluster-pure batches: more steps than N / batch size
    assert progress.bar.total == 372 and progress.bar.n == 40
    clock.now = 2.0
    progress.on_step(step=50, epoch=0, metrics={"train/samples_per_s": 320.0})
    clock.now = 4.0
    progress.on_step(step=60, epoch=0, metrics={"train/samples_per_s": 320.0})
    assert progress.progress.seconds_left() == pytest.approx(312 / 5.0)
    progress.close()
    assert said == ["stage 1: stopped at step 60 of 372 in 0:04, 320 samples/s"]
