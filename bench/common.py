"""Shared machinery of the benchmarks: side-by-side timing, peak memory, log-log slopes, result records.

The machine these run on is small and shared (2 cores, other jobs training beside us), so every figure that
matters is a RATIO against a baseline measured in the same process, in the same minutes: repetitions of the
baseline and of our code are interleaved (A B B A A B ...) and the medians compared. Absolute seconds are
reported for context only.

Peak memory comes in two flavours, and every figure says which:
- ``tracemalloc``: peak bytes allocated through Python's allocator hooks during the call (numpy registers its
  array buffers there), so it counts exactly what a numpy path allocates and nothing else;
- ``rss``: peak resident set size of the process during the call minus the RSS before it, read from
  /proc/self/status (VmHWM) after resetting the high-water mark via /proc/self/clear_refs (Linux). It sees
  everything (torch, faiss, Python objects) but also allocator caching, so it is an upper bound.
"""
from __future__ import annotations

import gc
import json
import math
import os
import statistics
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

MB = 1 << 20


# ---------------------------------------------------------------------------------------------------- timing
LAST_CPU_SECONDS = [0.0]  # CPU seconds (all threads of this process) of the latest timed() call


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(wall seconds, result) of one call, after a garbage collection so earlier garbage is not billed to it.
    The call's CPU seconds (this process, all threads) are left in LAST_CPU_SECONDS[0]."""
    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    LAST_CPU_SECONDS[0] = time.process_time() - cpu
    return seconds, result


def interleaved(candidates: dict[str, Callable[[], Any]], *, repeats: int,
                keep: Callable[[str, Any], None] | None = None,
                rss: dict[str, int | None] | None = None,
                cpu: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Time every candidate ``repeats`` times, alternating their order each round (A B, B A, A B, ...).

    Alternating the order spreads drifts of the machine's load evenly over the candidates. ``keep(name, result)``
    sees every result (e.g. to check the candidates agree); results are dropped afterwards. ``rss``, when given,
    receives each candidate's largest peak-RSS delta over its runs (see RssPeak; free to measure); ``cpu``, when
    given, each run's CPU seconds (this process, all threads).
    Returns name -> list of seconds.
    """
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(repeats):
        order = names if round_number % 2 == 0 else names[::-1]
        for name in order:
            with RssPeak() as peak:
                seconds, result = timed(candidates[name])
            times[name].append(seconds)
            if cpu is not None:
                cpu.setdefault(name, []).append(LAST_CPU_SECONDS[0])
            if rss is not None and peak.delta is not None:
                rss[name] = max(rss.get(name) or 0, peak.delta)
            if keep is not None:
                keep(name, result)
            del result
    return times


def median(values: list[float]) -> float:
    return float(statistics.median(values))


# ---------------------------------------------------------------------------------------------------- memory
def peak_tracemalloc(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(peak bytes traced during fn, result). Slows pure-Python code; use on numpy paths, outside timings."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return int(peak), result


def _status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


class RssPeak:
    """Context manager: ``.delta`` = peak RSS during the block minus RSS at its start, in bytes (None if the
    platform cannot reset the high-water mark). No overhead, so it can wrap timed calls."""

    def __enter__(self) -> "RssPeak":
        gc.collect()
        self.ok = _reset_rss_peak()
        self.start_kb = _status_kb("VmRSS")
        self.delta: int | None = None
        return self

    def __exit__(self, *exc) -> None:
        peak_kb = _status_kb("VmHWM")
        if self.ok and peak_kb is not None and self.start_kb is not None:
            self.delta = max(0, peak_kb - self.start_kb) * 1024


def peak_rss(fn: Callable[[], Any]) -> tuple[int | None, Any]:
    with RssPeak() as peak:
        result = fn()
    return peak.delta, result


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1 << 30:
        return f"{value / (1 << 30):.2f} GiB"
    if value >= MB:
        return f"{value / MB:.0f} MiB"
    return f"{value / 1024:.0f} KiB"


# ---------------------------------------------------------------------------------------------------- growth
def loglog_slope(sizes: list[float], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size): 1.0 = linear, 2.0 = quadratic."""
    if len(sizes) < 2:
        return float("nan")
    slope, _ = np.polyfit(np.log(np.asarray(sizes, float)), np.log(np.maximum(np.asarray(seconds, float), 1e-9)), 1)
    return float(slope)


def extrapolate(*, sizes: list[float], seconds: list[float], to: float) -> tuple[float, float]:
    """(seconds at size ``to``, slope): the log-log line through the measurements, evaluated at ``to``."""
    slope, intercept = np.polyfit(np.log(np.asarray(sizes, float)), np.log(np.asarray(seconds, float)), 1)
    return float(math.exp(intercept + slope * math.log(to))), float(slope)


def fmt_seconds(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.0f} ms"


def fmt_count(n: float) -> str:
    n = float(n)
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if n >= scale:
            text = f"{n / scale:.2f}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
    return f"{n:.0f}"


# ---------------------------------------------------------------------------------------------------- records
@dataclass
class Result:
    """One row of the table.

    ratio: how many times better ours is than the baseline, oriented so that > 1 is better (a speed-up for
    time, a throughput ratio for throughput). goal: text, e.g. ">= 50x and < 2 s". passed: True / False, or
    None when not applicable (skipped, not available, informational rows).
    """

    name: str
    workload: str
    baseline: str = ""
    baseline_s: float | None = None
    ours_s: float | None = None
    ratio: float | None = None
    ratio_note: str = ""  # how the ratio was obtained, when not simply baseline_s / ours_s
    goal: str = ""
    passed: bool | None = None
    memory: str = "-"
    growth: str = "-"
    status: str = "ok"  # ok | skipped | not available | error
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def verdict(self) -> str:
        if self.status != "ok":
            return self.status
        if self.passed is None:
            return "info"
        return "PASS" if self.passed else "MISS"


def write_results(results: list[Result], path: str | None) -> None:
    payload = [asdict(r) for r in results]
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2, default=float)
    else:
        json.dump(payload, sys.stdout, indent=2, default=float)


def read_results(path: str) -> list[Result]:
    with open(path) as f:
        return [Result(**row) for row in json.load(f)]


def module_main(run: Callable[..., list[Result]]) -> None:
    """``python -m bench.<module> [--quick] [--json PATH]``: run one benchmark module on its own."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="scaled-down sizes")
    parser.add_argument("--json", default=None, help="write the results here (default: stdout)")
    args = parser.parse_args()
    try:
        results = run(quick=args.quick)
    except Exception as exc:  # noqa: BLE001 - a crashed benchmark is a row, not a crashed report
        import traceback

        traceback.print_exc()
        results = [Result(name=getattr(run, "__module__", "benchmark"), workload="", status="error",
                          notes=[f"{type(exc).__name__}: {exc}"])]
    write_results(results, args.json)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def threads_note() -> str:
    return f"{os.cpu_count()} CPUs visible, load average {os.getloadavg()[0]:.1f} at start"


def replace_section(path, markdown: str, *, begin: str, end: str) -> None:
    """Replace the section of the markdown file ``path`` between its ``begin`` and ``end`` markers with ``markdown``
    (which carries the markers itself), or append it: each bench owns one section of BENCHMARKS.md."""
    from pathlib import Path
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        text = before + markdown + rest.split(end, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + markdown
    path.write_text(text)
