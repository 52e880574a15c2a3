"""The one worker pool: fn over planned items in order, inline or in worker processes that persist across maps."""
import pytest

from contrastive.data.workers import OrderedWorkers
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
