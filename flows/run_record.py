"""What a run records about itself beside its results, in ``summary.json`` and the JSON ``mclpipe reproduce``
writes: its wall time, how many of its steps it computed and how many it found finished (reused from an earlier
run, a cache hit), the machine and when it finished. The docs render run times from these fields
(``scripts/render_tables.py``), so a time in the docs always says whether it was measured from scratch, and where.

The flow counts its steps (``flows.pipeline``: ``steps`` in summary.json); the command that ran it adds the rest
(``record_run``), since only it sees the whole wall time a user waits (the Prefect server's start included).
"""
from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from contrastive.engine.files import write_json


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_model() -> str | None:
    """The first CUDA device's name when torch is loaded and sees one (no import of torch for this alone)."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a driver that fails here fails nothing else of the record
        return None


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none): a loaded machine stretches wall times."""
    try:
        return round(os.getloadavg()[0], 1)
    except OSError:
        return None


def machine(*, load_at_start: float | None = None) -> dict:
    """{"cpu", "cores", "gpu", "load_average": [at start, at end]}: the machine a wall time was measured on."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu_model(),
            "load_average": [load_at_start, load_average()]}


def finished_at() -> str:
    """Now, UTC, to the minute: ``2026-11-28T19:40Z``."""
    return time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())


def add_steps(counts: list[dict]) -> dict:
    """The sum of several runs' ``steps`` ({"computed": n, "reused": m}); a run without the field counts none."""
    return {kind: sum(c.get(kind, 0) for c in counts) for kind in ("computed", "reused")}


def record_run(summary: dict, *, wall_seconds: float, load_at_start: float | None) -> dict:
    """``summary`` (a finished run's, with its ``dir``) with ``wall_seconds``, ``machine`` and ``finished_at``
    added, written back to its summary.json; the flow's ``steps`` count stays as it wrote it."""
    recorded = {**summary, "wall_seconds": round(wall_seconds, 1), "machine": machine(load_at_start=load_at_start),
                "finished_at": finished_at()}
    path = Path(summary.get("dir", "")) / "summary.json"
    if summary.get("dir") and path.is_file():
        write_json(path, {k: v for k, v in recorded.items() if k not in ("dir", "tracking_hint")})
    return recorded
