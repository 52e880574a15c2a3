"""The plan for people: its rows as strings (the terminal, markdown, the Prefect table artifact), the summary lines,
and the progress of a run against it (time left, percent done)."""
from __future__ import annotations

from planning.model import Plan


def human_bytes(value: float) -> str:
    """Bytes for a person, in the unit that fits: 37 GB, 1.4 GB, 6.1 MB, 120 kB, 512 B."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            number = value / scale
            return f"{number:.0f} {unit}" if number >= 10 else f"{number:.1f} {unit}"
    return f"{value:.0f} B"


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "?"
    if value >= 3 * 3600:
        return f"{value / 3600:.1f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def fmt_bytes(value: int | None) -> str:
    return "-" if not value else human_bytes(value)


def table_rows(plan: Plan) -> list[dict[str, str]]:
    """The plan as rows of strings (terminal, markdown, the Prefect table artifact)."""
    return [{"step": r.title + (" *" if r.critical else ""), "time": fmt_seconds(r.seconds),
             "peak RAM": fmt_bytes(r.peak_ram), "disk written": fmt_bytes(r.disk),
             "GPU memory / device": fmt_bytes(r.gpu_mem), "rests on": r.basis} for r in plan.rows]


def summary_lines(plan: Plan) -> list[str]:
    some = "at least " if plan.unknown else ""  # the rows not projected add to it
    what = ("the wall time of `mclpipe run`: steps one after another, as the flow runs them, and the run's start, "
            f"bookkeeping and end ({fmt_seconds(plan.overhead_s)})" if plan.overhead else
            "steps one after another, as the flow runs them")
    time = (f"total {some}{fmt_seconds(plan.total_s)} ({what}); critical "
            f"path (* above) {some}{fmt_seconds(plan.critical_s)}" if len(plan.unknown) < len(plan.rows) else
            "time not projected")
    lines = [f"{time}; disk written {fmt_bytes(plan.disk)}; peak RAM {fmt_bytes(plan.peak_ram)}"]
    if plan.unknown:
        lines.append(f"not projected ({len(plan.unknown)}): {', '.join(plan.unknown[:6])}"
                     + (" ..." if len(plan.unknown) > 6 else ""))
    return lines + [f"assumes: {a}" for a in plan.assumptions]


def markdown(plan: Plan) -> str:
    rows = table_rows(plan)
    if not rows:
        return ""
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row[h] for h in header) + " |" for row in rows]
    return "\n".join(lines + [""] + [f"- {line}" for line in summary_lines(plan)]) + "\n"


def remaining_seconds(plan: Plan, done: int) -> float:
    """Projected seconds of the steps after the first ``done``."""
    return sum(r.seconds or 0.0 for r in plan.rows[done:])


def time_left(plan: Plan, done: int) -> str:
    """What the plan says is left after the first ``done`` steps, in words: a projection only where the steps left
    have one (a run on a machine with no calibration cached projects no time: it says so, not "0 s")."""
    rest = plan.rows[done:]
    if not rest:
        return "no step left by the plan"
    projected = [r.seconds for r in rest if r.seconds is not None]
    if not projected:
        return "time left not projected (no calibration of this config on this machine: `mclpipe plan` measures one)"
    some = "at least" if len(projected) < len(rest) else "about"
    return f"{some} {fmt_seconds(sum(projected))} left by the plan"


def progress_percent(plan: Plan, done: int) -> float:
    """Share of the steps' projected time the first ``done`` steps make up (by count when nothing is projected)."""
    total = sum(r.seconds or 0.0 for r in plan.rows)
    if not total:
        return 100.0 * done / max(len(plan.rows), 1)
    return min(100.0, 100.0 * (total - remaining_seconds(plan, done)) / total)

