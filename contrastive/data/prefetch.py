"""Work on the next batches while the training step runs: one background thread, a bounded queue."""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def prefetched(items: Iterable[In], *, fn: Callable[[In], Out], depth: int = 2) -> Iterator[Out]:
    """``fn(item)`` for every item, in order, computed on one background thread at most ``depth`` items ahead.

    Torch ops release the GIL, so a CPU augmentation overlaps the training step on another core. An exception
    in the thread (from ``items`` or ``fn``) is raised here, at the item where it happened. Closing the returned
    iterator (the training loop leaving an epoch early) stops the thread and closes ``items``.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(value) -> bool:
        while not stop.is_set():
            try:
                ready.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        source = iter(items)
        try:
            for item in source:
                if not offer(fn(item)):
                    return
            offer(_DONE)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
            offer(_Failure(error))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=work, name="mclpipe-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            value = ready.get()
            if value is _DONE:
                return
            if isinstance(value, _Failure):
                raise value.error
            yield value
    finally:
        stop.set()
        thread.join()
