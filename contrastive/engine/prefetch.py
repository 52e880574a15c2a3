"""Work on the next batches while the training step runs: one background thread, a bounded queue."""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, TypeVar

import torch

In = TypeVar("In")
Out = TypeVar("Out")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def prefetched(items: Iterable[In], *, fn: Callable[[In], Out] | None = None, depth: int = 2,
               wait_seconds: float | None = None, first_wait_seconds: float | None = None,
               on_stall: Callable[[bool], BaseException] | None = None) -> Iterator[Out]:
    """``fn(item)`` (the item itself without ``fn``) for every item, in order, computed on one background thread
    at most ``depth`` items ahead.

    Torch ops release the GIL, so a CPU augmentation overlaps the training step on another core. An exception
    in the thread (from ``items`` or ``fn``) is raised here, at the item where it happened. Closing the returned
    iterator (the training loop leaving an epoch early) stops the thread and closes ``items``. With
    ``wait_seconds``, an item that takes longer (``first_wait_seconds`` for the first) raises
    ``on_stall(first)`` here; the thread, stuck in ``items``, is left behind as a daemon.
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

    device = _callers_cuda_device()

    def work() -> None:
        if device is not None:  # the current CUDA device is per thread: a DataLoader made here pins on this one
            torch.cuda.set_device(device)
        source = iter(items)
        try:
            for item in source:
                if not offer(item if fn is None else fn(item)):
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
    limit, stalled = first_wait_seconds or wait_seconds, False
    try:
        while True:
            try:
                value = ready.get(timeout=limit)
            except queue.Empty:
                stalled = True
                raise (on_stall or _stalled)(limit == (first_wait_seconds or wait_seconds)) from None
            if value is _DONE:
                return
            if isinstance(value, _Failure):
                raise value.error
            limit = wait_seconds
            yield value
    finally:
        stop.set()
        if not stalled:
            thread.join()


def _callers_cuda_device() -> int | None:
    """The calling thread's current CUDA device, where CUDA is in use (never initialised here for a CPU run).
    A new thread starts on device 0, so under torchrun a DataLoader iterator first made on the prefetch thread of
    rank r would pin its batches, and open a CUDA context, on GPU 0 instead of GPU r."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


def _stalled(first: bool) -> BaseException:
    return TimeoutError(f"no {'first ' if first else ''}item from the source in time")
