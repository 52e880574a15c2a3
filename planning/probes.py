"""Cheap probes of this machine and this process (``/proc``, ``/sys/fs/cgroup``, the file system): what the plan's
feasibility check reads (free disk, available memory) and what the calibration times a step with (seconds, peak RSS,
peak GPU memory, bytes written). Nothing here imports Prefect, MLflow or the pipeline's modules."""
from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def machine_id() -> str:
    """This machine as a cache key: host name, CPU count and (when present) the GPU model."""
    import platform
    gpu = ""
    try:
        gpu = Path("/proc/driver/nvidia/gpus").is_dir() and "-".join(
            sorted(p.name for p in Path("/proc/driver/nvidia/gpus").iterdir())) or ""
    except OSError:
        pass
    return f"{platform.node()}-{os.cpu_count()}cpu{('-' + gpu) if gpu else ''}".replace("/", "_")


def free_bytes(path: Path) -> tuple[int, int] | None:
    """(free bytes, device id) of the filesystem ``path`` is (or would be created) on."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free, os.stat(path).st_dev
    except OSError:
        return None


def available_memory() -> int | None:
    """Bytes of memory this process can still use: MemAvailable, or the cgroup's limit less its usage if lower."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            room = int(limit) - used
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available


@dataclass
class Measured:
    seconds: float = 0.0
    peak_rss: int | None = None
    gpu_mem: int | None = None


def status_bytes(name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


@contextmanager
def measured(device: str):
    """Seconds, peak RSS of this process and peak GPU memory of the block."""
    cuda = str(device).startswith("cuda")
    torch = None
    if cuda:
        import torch
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
    reset_peak()
    out = Measured()
    start = time.perf_counter()
    yield out
    out.seconds = time.perf_counter() - start
    out.peak_rss = status_bytes("VmHWM")
    if cuda:
        out.gpu_mem = int(torch.cuda.max_memory_allocated())


def dir_bytes(path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.is_dir() \
        else 0
