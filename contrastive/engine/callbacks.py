"""Training callbacks of the library (the pipeline's MLflow and Prefect callbacks live in tasks/)."""
from __future__ import annotations

import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, TextIO


class JsonlMetrics:
    """Training callback appending metrics to a JSON-lines file (readable after a torchrun subprocess ends):
    ``{"step": s, "time_ms": t, **metrics}`` a line. A resumed or rolled-back stage appends the steps it trains
    again, so a later line of a step supersedes an earlier one; ``time_ms`` (when the step was logged) lets the
    file be sent to a tracker twice without doubling a point."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, record: dict) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps({**record, "time_ms": int(time.time() * 1000)}) + "\n")

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self._write({"step": step, **metrics})

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        self._write({"step": epoch, **metrics})

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        pass


class KeyRecorder:
    """Training callback keeping the sample keys of every batch this rank trained on (tests of the DDP split)."""

    def __init__(self):
        self.batches: list[list[str]] = []

    def on_batch(self, *, step: int, batch) -> None:
        self.batches.append(list(batch.keys))

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        pass


def format_seconds(seconds: float) -> str:
    """A duration as a clock reads it: 0:07, 2:05, 1:02:03 (as tqdm writes elapsed and remaining time)."""
    whole = int(round(max(seconds, 0.0)))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ProgressClock:
    """A stage's rate and time left, from what the loop reports at its logging steps.

    ``observe(now=, step=, samples_per_second=)``: the clock time, the optimizer steps done so far (a resumed stage
    starts above 0) and the loop's own samples/s over the steps since its previous report. Both rates cover the
    last ``window_seconds`` of reports (never fewer than the last two), so the time left follows the stage's
    current pace (a slower neighbour process, a faster later epoch) rather than its start-up, and a resumed stage
    counts only the steps it trains itself. The time left is the steps left at the recent steps/s, which counts the
    pauses between epochs (the loop's samples/s does not); the window is long enough that one such pause on a
    loaded machine (40 s seen on 2026-11-26) does not multiply the estimate. Nothing is claimed before two
    reports."""

    def __init__(self, *, total_steps: int, started: float, window_seconds: float = 120.0):
        self.total_steps = max(1, int(total_steps))
        self.started = started
        self.window_seconds = window_seconds
        self.points: deque[tuple[float, int, float | None]] = deque()  # (time, step, samples/s since the previous)
        self.step = 0
        self.samples, self.samples_seconds = 0.0, 0.0  # every report's rate x the time it covers, from the 2nd on

    def observe(self, *, now: float, step: int, samples_per_second: float | None = None) -> None:
        if self.points and samples_per_second is not None and now > self.points[-1][0]:
            self.samples_seconds += now - self.points[-1][0]
            self.samples += (now - self.points[-1][0]) * samples_per_second
        self.points.append((now, step, samples_per_second))
        self.step = step
        # Keep the newest report older than the window: the window's rates then span at least window_seconds.
        while len(self.points) > 2 and self.points[1][0] <= now - self.window_seconds:
            self.points.popleft()

    def steps_per_second(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, s0, _), (t1, s1, _) = self.points[0], self.points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def samples_per_second(self) -> float | None:
        """The loop's window rates over the clock's window, each weighted by the time it covers (the oldest
        report's rate covers time before the window and counts only when it is the one report)."""
        points = list(self.points)
        if len(points) == 1:
            return points[0][2]
        covered = [(t1 - t0, rate) for (t0, _, _), (t1, _, rate) in zip(points, points[1:])
                   if rate is not None and t1 > t0]
        seconds = sum(dt for dt, _ in covered)
        return sum(dt * rate for dt, rate in covered) / seconds if seconds > 0 else None

    def mean_samples_per_second(self) -> float | None:
        """The mean rate of all reports so far (the first report's alone until a second one comes)."""
        if self.samples_seconds > 0:
            return self.samples / self.samples_seconds
        return self.points[0][2] if self.points else None

    def seconds_left(self) -> float | None:
        rate = self.steps_per_second()
        return max(0, self.total_steps - self.step) / rate if rate else None

    def elapsed(self, now: float) -> float:
        return now - self.started

    def rates(self) -> str:
        """"612 samples/s, 1:05 left" ("?" for what is not known yet)."""
        samples, left = self.samples_per_second(), self.seconds_left()
        return (f"{samples:.0f} samples/s" if samples is not None else "? samples/s") + ", " + (
            f"{format_seconds(left)} left" if left is not None else "? left")

    def line(self, *, now: float, description: str, loss: float | None = None) -> str:
        """The plain progress line of a log: "stage 0: step 120/500 (24%), 612 samples/s, 0:38 left, 0:12 elapsed,
        loss 4.123"."""
        percent = 100.0 * min(self.step, self.total_steps) / self.total_steps
        text = (f"{description}: step {self.step}/{self.total_steps} ({percent:.0f}%), {self.rates()}, "
                f"{format_seconds(self.elapsed(now))} elapsed")
        return text + (f", loss {loss:.3f}" if loss is not None else "")


#: tqdm's bar with our rate and time left in place of its own (its postfix holds them, after ", ").
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps [{elapsed}{postfix}]"


class StageProgress:
    """Training callback showing a stage's progress with its rate (samples/s) and time left.

    On a terminal (``stream`` is a TTY): a tqdm bar, redrawn at every logging step and gone when the stage ends. Not
    on a terminal (a log file, a pipe, a Prefect worker): one plain line through ``say`` every ``every_seconds``
    (so a log gets a few lines a stage, not one per step). Either way ``close()`` says one closing line: the
    stage's steps, time and mean rate. ``say`` defaults to printing on ``stream``; the pipeline passes its run
    logger's ``info`` so the lines land in the orchestrator's logs (the library imports no orchestrator)."""

    def __init__(self, *, total_steps: int, description: str, say: Callable[[str], None] | None = None,
                 stream: TextIO | None = None, every_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.say = say or (lambda line: print(line, file=self.stream, flush=True))
        self.description, self.every_seconds, self.now = description, every_seconds, clock
        self.progress = ProgressClock(total_steps=total_steps, started=clock())
        self.last_said = self.progress.started
        self.loss: float | None = None
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm
            self.bar = tqdm(total=self.progress.total_steps, desc=description, file=self.stream, leave=False,
                            bar_format=BAR_FORMAT, dynamic_ncols=True)

    def on_train_start(self, *, total_steps: int, step: int) -> None:
        """The loop's own plan (the caller's ``total_steps`` is N / batch size; cluster-pure batches make more)."""
        self.progress.total_steps = max(1, int(total_steps))
        if self.bar is not None:
            self.bar.reset(total=self.progress.total_steps)
            self.bar.n = step

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        now = self.now()
        self.progress.observe(now=now, step=step, samples_per_second=metrics.get("train/samples_per_s"))
        self.loss = metrics.get("train/loss", self.loss)
        if self.bar is not None:
            self.bar.n = min(step, self.bar.total)
            self.bar.set_postfix_str(self.progress.rates() + (f", loss {self.loss:.3f}" if self.loss is not None
                                                              else ""), refresh=True)
        elif now - self.last_said >= self.every_seconds:
            self.say(self.progress.line(now=now, description=self.description, loss=self.loss))
            self.last_said = now

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:  # the epoch's log line (the pipeline's) then starts on a clean line
            self.bar.clear()

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        pass

    def close(self, *, steps: int | None = None) -> None:
        """Remove the bar and say the closing line: ``steps``, the stage's trained steps when it finished (the loop
        reports only every ``log_every_steps``), else the last reported step (a stage that stopped). No line when
        no step was reported: nothing trained here."""
        if self.bar is not None:
            self.bar.close()
        if not self.progress.points:
            return
        step = self.progress.step if steps is None else steps
        total, mean = self.progress.total_steps, self.progress.mean_samples_per_second()
        done = f"trained {step} steps" if steps is not None or step >= total else f"stopped at step {step} of {total}"
        self.say(f"{self.description}: {done} in {format_seconds(self.progress.elapsed(self.now()))}"
                 + (f", {mean:.0f} samples/s" if mean is not None else ""))
