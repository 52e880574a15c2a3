"""The background-thread prefetch of the next batches: order, errors, bounded look-ahead, early exit."""
import threading
import time

import pytest

from contrastive.engine.prefetch import prefetched


def test_results_arrive_in_order_and_are_computed_off_the_consumer_thread():
    consumer = threading.get_ident()
    out = list(prefetched(range(20), fn=lambda x: (x * x, threading.get_ident()), depth=3))
    assert [value for value, _ in out] == [x * x for x in range(20)]
    assert {thread for _, thread in out} != {consumer}


def test_an_error_is_raised_at_the_item_where_it_happened():
    def fn(x):
        if x == 3:
            raise ValueError("bad item 3")
        return x

    got = []
    with pytest.raises(ValueError, match="bad item 3"):
        for value in prefetched(range(10), fn=fn, depth=2):
            got.append(value)
    assert got == [0, 1, 2]


def test_look_ahead_is_bounded_and_leaving_early_stops_the_thread_and_closes_the_source():
    read, closed = [], []

    def source():
        try:
            for i in range(1000):
                read.append(i)
                yield i
        finally:
            closed.append(True)

    stream = prefetched(source(), fn=lambda x: x, depth=2)
    assert next(stream) == 0
    time.sleep(0.3)  # let the thread run as far ahead as it may
    assert len(read) <= 1 + 2 + 1  # the consumed item, a full queue, one blocked in put
    stream.close()
    assert closed == [True]
    assert not [t for t in threading.enumerate() if t.name == "mclpipe-prefetch"]


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        next(prefetched([1], fn=lambda x: x, depth=0))


def test_the_thread_works_on_the_caller_s_cuda_device(monkeypatch):
    """Under torchrun rank r's thread works on GPU r: the current device is per thread and a new one starts on 0
    (CUDA patched: this machine has none); a CPU run never initialises CUDA here."""
    import torch

    chosen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.update({threading.current_thread().name: d}))
    assert list(prefetched(iter([1, 2]))) == [1, 2]
    assert chosen == {"mclpipe-prefetch": 3}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    chosen.clear()
    assert list(prefetched(iter([1]))) == [1] and chosen == {}
