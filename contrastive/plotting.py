"""Matplotlib for worker threads: pyplot keeps global state and is not thread-safe (two pipelines plotting at once
in one process corrupt each other's figures), so every plot is drawn under one lock with the file-only backend."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

_PYPLOT_LOCK = threading.Lock()


@contextmanager
def locked_pyplot():
    """``with locked_pyplot() as plt:`` draw, save and close figures; no other thread plots meanwhile."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with _PYPLOT_LOCK:
        yield plt


def grouped_bars(ax, *, results: dict[str, dict[str, float]], prefix: str, value_format: str | None = None) -> None:
    """Draw one group of bars per representation (the keys of ``results``, in order: stage 0, ..., concat) with one
    bar per ``prefix/<name>`` metric, and label the groups on the x axis. A metric a representation lacks is a gap
    (NaN), so representations with different metric sets still share one chart. ``value_format`` (e.g. "%.2f")
    writes each value above its bar. Call inside ``locked_pyplot``."""
    import numpy as np

    names = list(results)
    series = sorted({key.split("/", 1)[1] for r in results.values() for key in r if key.startswith(prefix + "/")})
    width = 0.8 / max(1, len(series))
    for i, name in enumerate(series):
        values = [results[r].get(f"{prefix}/{name}", np.nan) for r in names]
        bars = ax.bar(np.arange(len(names)) + (i - (len(series) - 1) / 2) * width, values, width, label=name)
        if value_format is not None:
            ax.bar_label(bars, fmt=value_format, fontsize=7)
    ax.set_xticks(np.arange(len(names)), names, rotation=20, ha="right")


def save_figure(plt, fig, path, *, dpi: int) -> Path:
    """Lay out, write ``path`` (creating its folder) and close ``fig``, so no figure outlives its plot call and
    pyplot's global figure list does not grow across pipelines. Call inside ``locked_pyplot``; returns the path."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
