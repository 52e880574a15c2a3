"""The pipeline freezes the heap it starts with (flows.pipeline.freeze_imported_heap), so the full collection that
ends every stage and export (release_device_memory) scans only what the run created since."""
import gc
import weakref

import pytest

from flows import pipeline


def test_the_pipeline_freezes_the_imported_heap_before_its_first_step(monkeypatch):
    seen = []

    def first_step(**_):
        seen.append(gc.get_freeze_count())
        raise RuntimeError("stop before any work")
    monkeypatch.setattr(pipeline.t, "prepare_data", first_step)
    monkeypatch.setattr(pipeline, "check_run_parameters", lambda config: None)
    gc.unfreeze()
    try:
        with pytest.raises(RuntimeError, match="stop before any work"):
            pipeline.mcl_pipeline.fn(config=None)
    finally:
        gc.unfreeze()
    assert seen and seen[0] > 10_000  # the imported modules' objects (prefect, torch, mlflow: hundreds of thousands)


class _Node:
    pass


def _cycle():
    """An unreachable reference cycle (as a model with hooks or a DDP wrapper leaves) and a weak reference to it."""
    node = _Node()
    node.itself = node
    return weakref.ref(node)


def test_the_freeze_collects_todays_garbage_freezes_the_survivors_and_later_cycles_are_still_collected():
    """Our function, not Python's collector: garbage alive before the call is collected (frozen, it would never
    be), what survives goes to the permanent generation, and a cycle made afterwards is still collected."""
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: only freeze_imported_heap's own collect may free `before`
    gc.unfreeze()
    try:
        before = _cycle()
        assert before() is not None  # not collected yet
        pipeline.freeze_imported_heap()
        assert before() is None  # the collection before the freeze
        assert gc.get_freeze_count() > 10_000  # what survives (the imported modules' objects) is frozen
        after = _cycle()
        gc.collect()
        assert after() is None  # garbage made after the freeze is collected as before
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
