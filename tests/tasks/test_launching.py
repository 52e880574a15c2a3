"""tasks/launching.py's gpu_slot: the slot of ``launcher.concurrency_limit`` is taken with the config's wait bound and
lease, so a killed holder's slot frees itself ``launcher.concurrency_lease_seconds`` after its last renewal."""
import logging
from contextlib import contextmanager

import pytest
import prefect.concurrency.sync

from pipeline_config.loader import load_config
from tasks import launching


@pytest.mark.parametrize("sets, lease", [([], 300.0), (["launcher.concurrency_lease_seconds=30"], 30.0)])
def test_the_slot_is_taken_with_the_configured_lease_and_wait(monkeypatch, sets, lease):
    taken = []

    @contextmanager
    def concurrency(names, **kwargs):
        taken.append((names, kwargs))
        yield

    monkeypatch.setattr(prefect.concurrency.sync, "concurrency", concurrency)
    monkeypatch.setattr(launching, "get_run_logger", lambda: logging.getLogger("test"))
    config = load_config("trifeature_tiny", ["launcher.concurrency_limit=gpus",
                                             "launcher.concurrency_timeout_seconds=60", *sets])
    with launching.gpu_slot(config):
        assert len(taken) == 1  # held while the body runs
    assert taken == [("gpus", {"occupy": 1, "strict": True, "timeout_seconds": 60.0, "lease_duration": lease})]


def test_a_lease_too_short_to_renew_is_refused():
    with pytest.raises(Exception, match="concurrency_lease_seconds"):
        load_config("trifeature_tiny", ["launcher.concurrency_limit=gpus", "launcher.concurrency_lease_seconds=1"])
