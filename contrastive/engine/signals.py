"""Stop on SIGINT (Ctrl-C) and SIGTERM (what Slurm, Kubernetes and systemd send before they kill) without losing work.

Two layers, both in the main thread (the only one Python delivers signals to):

* ``install_stop_handlers()``: the CLI calls it once. A signal that arrives while no training step is running
  raises :class:`~contrastive.errors.StageInterrupted` at once (a typed KeyboardInterrupt that names the signal).
* ``graceful_stop()``: the engine's loop runs inside it. There the first signal only records a stop request; the
  loop calls ``stop_requested()`` after every optimizer step, and when one is pending it writes a checkpoint and
  raises StageInterrupted, so a preempted stage loses nothing. A second signal stops at once (the last periodic
  checkpoint is kept). ``graceful_stop`` installs its handlers for its duration and restores the previous ones
  after, because Prefect's flow engine swaps in its own SIGTERM handler while a flow runs; a request that training
  did not consume (the signal came after the last step) is handed to the previous handler on the way out.
* ``wait_forwarding_stop`` / ``set_parent_death_signal``: a torchrun launch runs in its own session (a terminal's
  Ctrl-C reaches only the launcher), gets one SIGTERM forwarded when a stop is requested (its ranks then agree to
  stop after the same step and checkpoint it), and SIGTERM from the kernel if the launcher dies.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Callable, Iterator

from contrastive.errors import StageInterrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# The pending request of the innermost graceful_stop scope (a signal number), None when there is none.
_pending: dict[str, int | None] = {"signum": None}


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_now(signum: int, frame=None) -> None:
    raise StageInterrupted(signum=signum)


def install_stop_handlers() -> None:
    """SIGINT and SIGTERM raise StageInterrupted in the main thread (outside training: at once)."""
    if _in_main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, _raise_now)


def _defer(signum: int, frame=None) -> None:
    if _pending["signum"] is not None:  # asked twice: stop now, without waiting for the step to finish
        raise StageInterrupted(signum=signum)
    _pending["signum"] = signum
    # os.write, not print or logging: a signal handler may run while the main thread holds their locks.
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    os.write(2, f"\n{name}: stopping after the training step in progress and writing a checkpoint "
                f"(send it again to stop at once)\n".encode())


def stop_requested() -> int | None:
    """The signal number of a pending stop request of the current ``graceful_stop`` scope, or None."""
    return _pending["signum"]


@contextlib.contextmanager
def graceful_stop(*, on_interrupt: Callable[[StageInterrupted], None] | None = None) -> Iterator[None]:
    """Defer SIGINT / SIGTERM to the caller's next ``stop_requested()`` check (module docstring).

    ``on_interrupt`` sees every StageInterrupted leaving the scope (to name the checkpoint that survives a second
    signal). Outside the main thread no handler is installed: signals reach the main thread only, where the
    handlers installed there decide.
    """
    if not _in_main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    outer_pending = _pending["signum"]
    _pending["signum"] = None
    for signum in STOP_SIGNALS:
        signal.signal(signum, _defer)
    try:
        yield
    except StageInterrupted as exc:
        _pending["signum"] = None  # the stop is under way: nothing to hand on
        if on_interrupt is not None:
            on_interrupt(exc)
        raise
    finally:
        unconsumed = _pending["signum"]
        _pending["signum"] = outer_pending
        for signum, handler in previous.items():
            if handler is not None:  # None: installed outside Python; it cannot be restored from here
                signal.signal(signum, handler)
        if unconsumed is not None:
            signal.raise_signal(unconsumed)  # the previous handler decides, as if it had arrived just now


PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send this process ``signum`` when the thread that started it exits (Linux ``prctl``);
    False where that is not supported. For child processes (``preexec_fn``) that must not outlive their parent."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def wait_forwarding_stop(process: subprocess.Popen, *, poll_seconds: float = 0.2) -> int | None:
    """Wait for ``process`` (started in its own session, so a terminal's Ctrl-C does not reach it) and forward a
    stop request to it once, as SIGTERM: torchrun hands that to its ranks, which finish their step, checkpoint and
    exit. Returns the signal that asked for the stop (consumed), or None. Call it inside ``graceful_stop``."""
    forwarded = None
    while process.poll() is None:
        signum = stop_requested()
        if signum is not None and forwarded is None:
            forwarded = signum
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=poll_seconds)
        except subprocess.TimeoutExpired:
            pass
    if forwarded is not None:
        consume(forwarded)
    return forwarded


def consume(signum: int) -> None:
    """Mark the pending request handled (the caller raised StageInterrupted for it)."""
    if _pending["signum"] == signum:
        _pending["signum"] = None
