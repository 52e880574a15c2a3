"""The one worker pool: fn over planned items in order, inline or in worker processes that persist across maps."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch

from contrastive.data.workers import OrderedWorkers, result_tensor
from contrastive.errors import ConfigError


class Square:
    """Picklable work: the worker's pid beside the result, so the test sees who computed it."""

    def __call__(self, item: int) -> tuple[int, int]:
        import os
        return item * item, os.getpid()


def test_results_come_back_in_order_inline_and_from_two_processes():
    import os
    with OrderedWorkers(Square(), workers=0) as inline:
        assert [r for r, _ in inline.map(range(7))] == [i * i for i in range(7)]
        assert inline.worker_processes() == []
    with OrderedWorkers(Square(), workers=2, prefetch=1) as pool:
        results = list(pool.map(range(20)))
        assert [r for r, _ in results] == [i * i for i in range(20)]
        pids = {pid for _, pid in results}
        assert len(pids) == 2 and os.getpid() not in pids
        workers = pool.worker_processes()
        partial = pool.map(range(100, 200))
        assert next(partial)[0] == 100 * 100  # a map left part way ...
        assert [r for r, _ in pool.map([3, 4])] == [9, 16]  # ... is ended by the next, on the same workers
        assert pool.worker_processes() == workers
    for worker in workers:
        worker.join(timeout=10)
    assert not any(w.is_alive() for w in workers)


def test_a_bad_worker_count_names_the_setting():
    with pytest.raises(ConfigError, match="data.decode_workers"):
        OrderedWorkers(Square(), workers=-1, setting="data.decode_workers")


def test_a_temporary_directory_too_long_for_the_forkserver_socket_names_the_fix(monkeypatch):
    import shutil
    import tempfile
    from contrastive.data.workers import LONGEST_SOCKET_TMPDIR
    base = tempfile.mkdtemp(dir="/tmp")  # not tmp_path: under xdist it alone is near the limit
    try:
        longest = Path(base) / ("d" * (LONGEST_SOCKET_TMPDIR - len(base) - 1))
        longest.mkdir()
        assert len(str(longest)) == LONGEST_SOCKET_TMPDIR
        # at the limit the workers start and answer: in a fresh process, as this one's forkserver may run already
        # with its socket made elsewhere
        script = ("from contrastive.data.workers import OrderedWorkers\n"
                  "with OrderedWorkers(abs, workers=1) as pool:\n    print(list(pool.map([-2])))")
        started = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(longest)},
                                 capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3])
        assert started.returncode == 0 and started.stdout.strip() == "[2]", started.stderr[-2000:]
        # a byte more: refused before any worker starts, naming both fixes
        monkeypatch.setattr(tempfile, "tempdir", str(longest) + "e")
        with OrderedWorkers(Square(), workers=1, setting="data.decode_workers") as pool:
            with pytest.raises(ConfigError, match=r"TMPDIR=/tmp\), or data.decode_workers=0"):
                list(pool.map([2]))
            assert pool.worker_processes() == []
        with OrderedWorkers(Square(), workers=0) as inline:  # no socket, no limit
            assert [r for r, _ in inline.map([3])] == [9]
    finally:
        shutil.rmtree(base)


class FilledResult:
    """Picklable work: a result tensor filled with ``item``, and whether it was in shared memory before it left."""

    def __call__(self, item: int) -> tuple[torch.Tensor, bool]:
        out = result_tensor((2, 3), dtype=torch.float32 if item % 2 else torch.uint8)
        out.fill_(item)
        return out, out.is_shared()


def test_a_worker_s_result_tensor_is_in_shared_memory_from_the_start():
    """In a worker the result lives in shared memory before it is sent (nothing to copy on the way out); inline it
    is an ordinary tensor. Shape, dtype and contents arrive as written."""
    with OrderedWorkers(FilledResult(), workers=1) as pool:
        results = list(pool.map([2, 3]))
    assert [shared for _, shared in results] == [True, True]
    assert [t.dtype for t, _ in results] == [torch.uint8, torch.float32]
    assert all(t.shape == (2, 3) and bool((t == i).all()) for (t, _), i in zip(results, [2, 3]))
    inline, shared = FilledResult()(5)
    assert not shared and inline.shape == (2, 3) and bool((inline == 5).all())


class SegmentResult:
    """Picklable work: a result tensor of ``rows(item)`` rows filled with ``item``, and the inode of the shared
    memory segment behind it (the same inode: the worker reused the segment; a fresh one gets a new inode, where an
    address could be the last one's, unmapped and mapped again)."""

    def __init__(self, *, vary: bool = False) -> None:
        self.vary = vary

    def rows(self, item: int) -> int:
        return item % 5 + 1 if self.vary else 3

    def __call__(self, item: int) -> tuple[int, torch.Tensor, int]:
        out = result_tensor((self.rows(item), 1000))
        out.fill_(item % 256)
        import os
        fd, _ = out.untyped_storage()._share_fd_cpu_()  # the segment's descriptor (already shared: no copy)
        return item, out, os.fstat(fd).st_ino


def _intact(results, work: SegmentResult) -> bool:
    return all(t.shape == (work.rows(i), 1000) and bool((t == i % 256).all()) for i, t, _ in results)


def test_a_worker_reuses_a_result_s_segment_once_the_reader_drops_it():
    """Results read and dropped one at a time: the worker writes them into a few segments again and again (no fresh
    shared memory to fault in and zero each time), and every result arrives whole; with sizes that vary too (a
    smaller result reuses a bigger segment, a bigger one grows it)."""
    for work in (SegmentResult(), SegmentResult(vary=True)):
        with OrderedWorkers(work, workers=1, prefetch=2) as pool:
            addresses, intact = set(), True
            for item, images, address in pool.map(range(60)):
                intact &= _intact([(item, images, address)], work)
                addresses.add(address)
                del images
        assert intact
        if not work.vary:  # prefetch + 4 slots at most; fresh memory every time would give ~60
            assert len(addresses) <= 2 + 4
        assert len(addresses) < 30


def test_results_the_reader_keeps_are_never_overwritten():
    """A reader that keeps every result (its slots all lent out) gets fresh memory for the rest: each kept result
    still holds what its worker wrote, after the map and after a later map on the same workers."""
    work = SegmentResult(vary=True)
    with OrderedWorkers(work, workers=2, prefetch=2) as pool:
        kept = list(pool.map(range(40)))
        assert _intact(kept, work)
        later = list(pool.map(range(100, 140)))
        assert _intact(kept, work) and _intact(later, work)


def test_a_map_left_part_way_gives_its_segments_back():
    """A map abandoned with results still in flight (dropped by the next map): the next maps reuse those slots, so
    the segments in use stay few however many maps are left part way."""
    work = SegmentResult()
    with OrderedWorkers(work, workers=1, prefetch=2) as pool:
        addresses = set()
        for start in range(0, 200, 20):
            partial = pool.map(range(start, start + 20))
            item, images, address = next(partial)
            addresses.add(address)
            del images
        for item, images, address in pool.map(range(30)):
            assert _intact([(item, images, address)], work)
            addresses.add(address)
            del images
    assert len(addresses) <= 2 + 4


class _Pinned(torch.Tensor):
    """A tensor that says it is pinned, as the DataLoader's pin thread's copies are (no CUDA here to pin one)."""

    def is_pinned(self, *args, **kwargs) -> bool:
        return True


def test_a_slot_returns_when_its_result_is_dropped_or_at_once_when_pinned():
    """The reader's release rule on one worker's two slots: a result whose tensors the reader still holds keeps its
    slot; dropping them frees it; a pinned result (a copy made by the pin thread) frees its slot at once."""
    from contrastive.data.workers import _ResultBuffers

    buffers = _ResultBuffers(workers=1, slots=2)
    buffers.flags[0] = buffers.next_generation()  # the worker lent both slots in this map
    held, pinned = torch.zeros(4), torch.Tensor._make_subclass(_Pinned, torch.zeros(4))
    buffers.deliver(worker=0, slots=[0], result=(np.arange(4), held, []))
    buffers.deliver(worker=0, slots=[1], result=(pinned,))
    buffers.release_returned()
    assert buffers.flags[0].tolist() == [1, 0] and pinned.is_pinned()  # the pinned result still held: slot 1 free
    del held
    buffers.release_returned()
    assert buffers.flags[0].tolist() == [0, 0]
