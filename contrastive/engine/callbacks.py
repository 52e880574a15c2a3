"""Training callbacks of the library (the pipeline's MLflow and Prefect callbacks live in tasks/)."""
from __future__ import annotations

import json
import time
from pathlib import Path


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
