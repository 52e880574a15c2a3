"""The batch source, watched: a reader that stops yielding (a filter that drops every sample, a hung network
mount, a dead decode worker) ends the stage with a message instead of hanging it in silence, a known failure of
the peers' loaders (open_clip issues #1016, #681, #899).

The source's iterator runs on a background thread (``contrastive.engine.prefetch.prefetched``) that hands batches
over through a short queue; the loop waits at most ``seconds`` for each (``first_seconds`` for an epoch's first:
workers start, shards are listed). Order and content are the source's own; only where it runs changes (sources
draw randomness from keyed generators, never from the global RNG the training step draws from).
"""
from __future__ import annotations

from typing import Callable, Iterator, TypeVar

from contrastive.engine.prefetch import prefetched
from contrastive.errors import DataError

T = TypeVar("T")


class InputStalled(DataError):
    """No batch arrived from the source within the stall limit."""


def watched(iterator: Iterator[T], *, seconds: float | None, first_seconds: float | None = None,
            describe: Callable[[], str] = lambda: "the batch source") -> Iterator[T]:
    """``iterator``'s items, each within ``seconds`` (None: unwatched, in this thread); InputStalled naming
    ``describe()`` (the reader and where it was) and the setting otherwise. An error of the source is re-raised
    here as it was."""
    if seconds is None:
        return iterator

    def stalled(first: bool) -> InputStalled:
        limit, which = (first_seconds or seconds, "the first") if first else (seconds, "the next")
        return InputStalled(
            f"no batch for {_seconds(limit)} s: {describe()} did not deliver {which} batch. "
            "A reader that stopped (a hung network mount, a filter that drops every sample, a dead worker) would "
            "hang here: check the data; if it is only slow, raise train.stall_seconds")
    return prefetched(iterator, depth=2, wait_seconds=seconds, first_wait_seconds=first_seconds, on_stall=stalled)


def _seconds(value: float) -> str:
    """A limit as a user wrote it: 300 -> "300", 0.5 -> "0.5", 1200 -> "1,200" (two decimals at most)."""
    return f"{value:,.2f}".rstrip("0").rstrip(".")
