"""The one worker pool: fn over planned items in order, inline or in worker processes that persist across maps."""
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
