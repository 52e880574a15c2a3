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


def test_cyclic_garbage_made_after_the_freeze_is_still_collected():
    gc.unfreeze()
    try:
        pipeline.freeze_imported_heap()
        node = _Node()
        node.itself = node  # a reference cycle, as a model with hooks or a DDP wrapper holds
        alive = weakref.ref(node)
        del node
        gc.collect()
        assert alive() is None
    finally:
        gc.unfreeze()
