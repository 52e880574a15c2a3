"""train.on_nonfinite: a NaN loss stops the stage with the fix named, or rolls back to the last checkpoint, skips
the batch that diverged and scales the learning rate, at most max_rollbacks times; a stopped and resumed stage
ends equal to one that was not stopped."""
import math

import pytest
import torch

from contrastive.engine.loop import train
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.errors import MclpipeError
from tests.unit.engine.test_loop import CPU, FixedBatches, RegressionTask, Rows
from tests.unit.engine.recording import Recorder

SGD = OptimSpec(name="sgd", lr=0.05, weight_decay=0.0, schedule="constant")


class Poisoned(FixedBatches):
    """FixedBatches whose batch ``position`` of epoch ``epoch`` holds a NaN (every batch from there on when
    ``forever``): the loss of that batch is NaN whatever the weights."""

    def __init__(self, *, epoch: int, position: int, forever: bool = False):
        super().__init__()
        self.bad_epoch, self.bad_position, self.forever = epoch, position, forever

    def batches(self, *, epoch: int, start: int):
        for position, rows in enumerate(super().batches(epoch=epoch, start=start), start):
            bad = epoch == self.bad_epoch and (position == self.bad_position or
                                               (self.forever and position >= self.bad_position))
            if bad or (self.forever and epoch > self.bad_epoch):
                rows = Rows(rows.x.clone(), rows.y)
                rows.x[0, 0] = float("nan")
            yield rows



def _run(tmp_path, *, name, source, on_nonfinite="rollback", max_rollbacks=3, stop_after=None, seen=None):
    task = RegressionTask()
    loop = LoopSpec(epochs=3, checkpoint_every_steps=4, log_every_steps=1, on_nonfinite=on_nonfinite,
                    max_rollbacks=max_rollbacks, rollback_lr_factor=0.5)
    result = train(task=task, source=source, optim=SGD, loop=loop, device=CPU, checkpoint_path=tmp_path / name /
                   "last.pt", callbacks=[seen] if seen else [], stop_after_steps=stop_after)
    return task, result


def test_stop_names_the_step_and_the_rollback_setting(tmp_path):
    with pytest.raises(MclpipeError, match=r"diverged at step 7 \(loss nan\).*train.on_nonfinite=rollback"):
        _run(tmp_path, name="stop", source=Poisoned(epoch=1, position=1), on_nonfinite="stop")


@pytest.fixture
def rates(monkeypatch):
    """The learning rate of every SGD step taken, as the optimizer reads it (its parameter group's ``lr``)."""
    taken = []
    real_step = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        taken.append(self.param_groups[0]["lr"])
        return real_step(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.SGD, "step", step)
    return taken


def test_rollback_skips_the_batch_halves_the_rate_and_finishes(tmp_path, rates):
    seen = Recorder()
    task, result = _run(tmp_path, name="rollback", source=Poisoned(epoch=1, position=1), seen=seen)
    # 7 updates at the configured rate (the 7th undone by the rollback to step 6), the NaN batch caught before its
    # update, then steps 7-17 again at half of it
    assert rates == [0.05] * 7 + [0.025] * 11
    assert result.steps == 17 and result.rollbacks == 1 and result.skipped_batches == 1  # 18 batches, 1 skipped
    assert all(torch.isfinite(p).all() for p in task.model.parameters())
    [event] = seen.rollbacks
    # diverged at step 7 (epoch 1, batch 1); the last checkpoint was the end of epoch 0 (step 6); lr x 0.5 on
    assert (event["step"], event["restored_step"], event["epoch"], event["batch"]) == (7, 6, 1, 1)
    assert event["lr_scale"] == 0.5 and math.isnan(event["loss"])
    poisoned = seen.keys[7]  # the batch that diverged, trained on once (its loss was NaN), never again
    assert seen.keys.count(poisoned) == 1
    # step 6 (batch 0 of epoch 1) was trained twice: before the rollback and again from the checkpoint
    assert seen.keys[6] == seen.keys[8] and seen.keys[9] not in seen.keys[:8]


def test_a_rollback_run_stopped_and_resumed_equals_one_that_was_not(tmp_path, rates):
    full_task, full = _run(tmp_path, name="full", source=Poisoned(epoch=1, position=1))
    _, stopped = _run(tmp_path, name="resumed", source=Poisoned(epoch=1, position=1), stop_after=12)
    assert stopped.rollbacks == 1
    rates.clear()
    task, resumed = _run(tmp_path, name="resumed", source=Poisoned(epoch=1, position=1))
    assert rates == [0.025] * 5  # steps 13-17: the cut rate comes back with the checkpoint
    assert resumed.resumed_from_step == 12 and resumed.steps == full.steps and resumed.rollbacks == 1
    for a, b in zip(full_task.model.parameters(), task.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rollbacks_are_bounded(tmp_path):
    with pytest.raises(MclpipeError, match="after 2 rollbacks .*scaled the learning rate by 0.5.*max_rollbacks"):
        _run(tmp_path, name="bounded", source=Poisoned(epoch=1, position=2, forever=True), max_rollbacks=2)
