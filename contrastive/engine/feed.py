"""The batch source, watched: a reader that stops yielding (a filter that drops every sample, a hung network
mount, a dead decode worker) ends the stage with a message instead of hanging it in silence, a known failure of
the peers' loaders (open_clip issues #1016, #681, #899).

The source's iterator runs in a thread that hands batches over through a short queue; the loop waits at most
``seconds`` for each (``first_seconds`` for the first: workers start, shards are listed). Order and content are
the source's own; only where it runs changes (sources draw randomness from keyed generators, never from the
global RNG the training step draws from, so nothing interleaves).
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, TypeVar

from contrastive.errors import DataError

T = TypeVar("T")
_END = object()


class InputStalled(DataError):
    """No batch arrived from the source within the stall limit."""


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


def watched(iterator: Iterator[T], *, seconds: float | None, first_seconds: float | None = None,
            describe: Callable[[], str] = lambda: "the batch source") -> Iterator[T]:
    """``iterator``'s items, each within ``seconds`` (None: unwatched, in this thread); InputStalled naming
    ``describe()`` (the reader and where it was) and the setting otherwise. An error of the source is re-raised
    here as it was."""
    if seconds is None:
        yield from iterator
        return
    handoff: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in iterator:
                if not put(item):
                    return
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread, raised there
            put(_Failed(exc))

    threading.Thread(target=pump, name="mclpipe-input", daemon=True).start()
    limit = first_seconds or seconds
    first = True
    try:
        while True:
            try:
                item = handoff.get(timeout=limit)
            except queue.Empty:
                what = "the first batch" if first else "the next batch"
                raise InputStalled(
                    f"no batch for {limit:.0f} s: {describe()} did not deliver {what}. A reader that stopped (a "
                    "hung network mount, a filter that drops every sample, a dead worker) would hang here: check "
                    "the data; if it is only slow, raise train.stall_seconds") from None
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            first, limit = False, seconds
            yield item
    finally:
        stop.set()
