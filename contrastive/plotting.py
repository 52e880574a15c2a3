"""Matplotlib for worker threads: pyplot keeps global state and is not thread-safe (two pipelines plotting at once
in one process corrupt each other's figures), so every plot is drawn under one lock with the file-only backend."""
from __future__ import annotations

import threading
from contextlib import contextmanager

_PYPLOT_LOCK = threading.Lock()


@contextmanager
def locked_pyplot():
    """``with locked_pyplot() as plt:`` draw, save and close figures; no other thread plots meanwhile."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with _PYPLOT_LOCK:
        yield plt
