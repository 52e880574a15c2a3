"""What a training stage keeps of its metrics until MLflow has them: the append-only journal in its step directory
(:class:`PendingJournal`, ``mlflow-pending.jsonl``) and the training callback that fills and sends it
(:class:`MetricBuffer`), so neither a tracking outage nor a crash loses a metric or logs one twice."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import mlflow

from contrastive.engine.files import atomic_write_bytes, disk_full_error, is_disk_full
from tasks.tracking.client import GONE_RUN, PENDING_FILE, Tracker, TrackingAway, _short, metric_points, now_ms

log = logging.getLogger(__name__)

__all__ = ["PENDING_FILE", "MetricBuffer", "PendingJournal", "rank_metric_points"]


def rank_metric_points(path: Path) -> list[list]:
    """The points ``[key, value, timestamp_ms, step]`` of the metrics file a stage's ranks wrote
    (``contrastive.engine.callbacks.JsonlMetrics``): a step logged again (the stage resumed or rolled back and
    trained it again) keeps its last values only."""
    latest: dict[tuple[str, int], list] = {}
    lines = Path(path).read_text().splitlines() if Path(path).exists() else []
    for line in lines:
        record = json.loads(line)
        step, timestamp = int(record.pop("step")), int(record.pop("time_ms", now_ms()))
        for point in metric_points([(step, record)], timestamp_ms=timestamp):
            latest[(point[0], step)] = point
    return list(latest.values())



class PendingJournal:
    """What a training stage wants MLflow to hold and MLflow has not acknowledged yet, on disk in the stage's step
    directory (``mlflow-pending.jsonl``), so neither an outage nor a crash loses it.

    Append-only, one line per write: a record ``{"seq": n, "run_id": ..., "metrics": [[key, value, timestamp_ms,
    step], ...], "tags": {...}}`` for each batch a checkpoint holds, and ``{"ack": n}`` once MLflow took every
    record up to ``n``. A process killed while appending leaves at most a torn last line, dropped when the file is
    read again; the file is removed when nothing in it is unacknowledged. Records keep their timestamps, so a record
    sent again after its acknowledgement was lost is a no-op for MLflow's store (see :meth:`Tracker.log_points`).
    """

    def __init__(self, path: Path | None):
        self.path = Path(path) if path is not None else None
        self.records: list[dict] = self._read()
        self.next_seq = max((r["seq"] for r in self.records), default=0) + 1

    def _read(self) -> list[dict]:
        """The unacknowledged records a previous process left; rewrites the file without the rest (atomically)."""
        if self.path is None or not self.path.exists():
            return []
        records, acked = [], 0
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # the torn last line of a killed process: not acknowledged, not kept
                continue
            if "ack" in entry:
                acked = max(acked, int(entry["ack"]))
            else:
                records.append(entry)
        records = [r for r in records if r["seq"] > acked]
        if records:
            atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in records).encode(),
                               what="the stage's unsent MLflow metrics")
        else:
            self.path.unlink()
        return records

    @property
    def points(self) -> int:
        return sum(len(r["metrics"]) for r in self.records)

    def add(self, *, run_id: str, metrics: list[list], tags: dict[str, str] | None = None) -> None:
        if not metrics and not tags:
            return
        record = {"seq": self.next_seq, "run_id": run_id, "metrics": metrics, "tags": tags or {}}
        self.next_seq += 1
        self.records.append(record)
        self._append(record)

    def acknowledge(self, seq: int) -> None:
        """MLflow holds every record up to ``seq``."""
        self.records = [r for r in self.records if r["seq"] > seq]
        if self.path is None:
            return
        if self.records:
            self._append({"ack": seq})
        elif self.path.exists():
            self.path.unlink()

    def _append(self, entry: dict) -> None:
        if self.path is None:
            return
        data = (json.dumps(entry) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        try:
            while data:  # one write for a line in practice; a short write is finished, not repeated
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, size)  # no torn line for the next append to run into
            if is_disk_full(exc):
                raise disk_full_error(directory=self.path.parent, what="the stage's unsent MLflow metrics",
                                      kept="the stage's checkpoints and every step before are kept") from exc
            raise
        finally:
            os.close(fd)


class MetricBuffer:
    """Training callback sending per-step metrics to MLflow a batch at a time (a few round trips per epoch rather
    than one per step), without ever losing or repeating one.

    A step's metrics wait in memory until a checkpoint holds the step; then they go to the stage's
    :class:`PendingJournal` (``journal``: ``<step dir>/mlflow-pending.jsonl``) and are sent from there. A stage
    resumed after a crash, or rolled back after a non-finite loss, trains the steps after its checkpoint again and
    logs them then, so the steps after the checkpoint are dropped with the crash or the rollback; what the journal
    holds is sent when the server answers again, or by the stage's next run (this class reads the journal when it
    starts). While the server is away, training goes on: a send is one try, repeated at the next checkpoint at most
    every ``retry_seconds`` (half the grace when that is shorter); only the end of the stage waits for the server,
    up to the tracker's grace, and a send mid-stage once the grace has run out stops the stage at its first failure."""

    def __init__(self, *, tracker: Tracker, run_id: str, journal: Path | None = None, flush_every: int = 50,
                 retry_seconds: float = 10.0):
        self.tracker = tracker
        self.run_id = run_id
        self.flush_every = flush_every
        # At least two tries within the grace, so a stage stops close to the grace a user set, not 10 s after it.
        self.retry_seconds = min(retry_seconds, tracker.outage_grace_seconds / 2)
        self.unsaved: list[tuple[int, dict[str, float], int]] = []  # (step, metrics, timestamp ms) after the checkpoint
        self.journal = PendingJournal(journal)
        self._next_try = 0.0  # while the server is away: no send before this time.monotonic()
        self._steps_unsent = len(self.journal.records)  # logged steps not yet sent (an earlier run's record: 1)
        if self.journal.records:
            log.info("sending %d metric points an earlier run of this stage kept in %s", self.journal.points,
                     self.journal.path)
            self.flush()

    def add_trained(self, points: list[list]) -> None:
        """Points of steps the stage trained to its end elsewhere (its ranks' metrics file), to send with the rest:
        committed as they are (their timestamps make a second send a no-op)."""
        self._steps_unsent += 1
        self.journal.add(run_id=self.run_id, metrics=points)

    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        self.unsaved.append((step, metrics, now_ms()))

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None:
        # The loop checkpoints the end of an epoch just before it reports it.
        self.unsaved.append((epoch, metrics, now_ms()))
        self._commit()
        self.flush()

    def on_checkpoint(self, *, path: Path, step: int) -> None:
        self._commit()
        if self._steps_unsent >= self.flush_every:
            self.flush()

    def on_rollback(self, *, step: int, restored_step: int, epoch: int, batch: int, loss: float, lr_scale: float,
                    rollbacks: int) -> None:
        """A non-finite loss rolled training back to its last checkpoint (step ``restored_step``): the steps after
        it are trained again, so their metrics are dropped (the replay logs its own); the rollback is a metric and
        a tag of the run."""
        self.unsaved = []
        self.journal.add(run_id=self.run_id, metrics=metric_points(
            [(step, {"train/rollbacks": float(rollbacks), "train/lr_scale": lr_scale})], timestamp_ms=now_ms()),
            tags={f"rollback.{rollbacks}": (
                f"step {step}: loss {loss}; restored step {restored_step}, skipped batch {batch} of epoch {epoch}, "
                f"learning rate x {lr_scale:g}")})
        self.flush()

    def _commit(self) -> None:
        """A checkpoint holds every step seen so far: their metrics go to the journal."""
        points = [point for step, metrics, timestamp in self.unsaved
                  for point in metric_points([(step, metrics)], timestamp_ms=timestamp)]
        self._steps_unsent += len(self.unsaved)
        self.unsaved = []
        self.journal.add(run_id=self.run_id, metrics=points)

    def flush(self, *, final: bool = False) -> None:
        """Send the journal's records, oldest first. Mid-stage an outage within the grace keeps them for a later
        try (training must not wait for the server); at the end of the stage (``final``: everything is committed
        first) it waits for the server up to the grace. Past the grace :class:`TrackingError` stops the stage and
        the journal keeps the records for its next run."""
        if final:
            self._commit()
        elif time.monotonic() < self._next_try:
            return
        while self.journal.records:
            record = self.journal.records[0]
            try:
                self.tracker.log_points(record["run_id"], record["metrics"], tags=record["tags"], once=not final)
            except TrackingAway:
                self._next_try = time.monotonic() + self.retry_seconds
                return
            except mlflow.exceptions.MlflowException as exc:
                if exc.error_code not in GONE_RUN:
                    raise
                # Its run was deleted meanwhile: it will never take them; keeping them would stop every rerun.
                log.warning("MLflow refused %d metric points for run %s (%s); dropped", len(record["metrics"]),
                            record["run_id"], _short(exc))
            self.journal.acknowledge(record["seq"])
        self._steps_unsent = 0
