"""Host synchronisations per training step (issue 24): on a GPU every read of a device tensor on the host
(``.item()``, ``bool()``, ``float()``, ``.tolist()``) waits for the queued kernels. Outside logging steps the loop
makes one per step (the non-finite check and the stop signal, read together); counted here on the CPU by patching
those reads."""
import pytest
import torch
from torch import nn

from contrastive.engine.loop import train
from contrastive.engine.task import LoopSpec, OptimSpec, StageTask
from tests.unit.engine.test_loop import FixedBatches

READS = ("item", "__bool__", "__float__", "__int__", "tolist")


class Quiet(nn.Module):
    """A forward that reads nothing on the host (its metrics are empty): what the loop itself reads is counted."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x, y):
        return ((self.linear(x).squeeze(1) - y) ** 2).mean(), {}


class QuietTask(StageTask):
    def __init__(self):
        torch.manual_seed(0)
        self.model = Quiet()

    def forward_module(self):
        return self.model

    def inputs(self, batch, *, device, step):
        return {"x": batch.x, "y": batch.y}


@pytest.fixture
def host_reads(monkeypatch):
    counts = {"n": 0}
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


@pytest.mark.parametrize("accumulation", [1, 3])
def test_one_host_read_per_step_outside_logging(tmp_path, host_reads, accumulation):
    steps, epochs = 6 // accumulation, 3
    train(task=QuietTask(), source=FixedBatches(), optim=OptimSpec(name="sgd", lr=0.01, schedule="constant"),
          loop=LoopSpec(epochs=epochs, log_every_steps=10_000, checkpoint_every_steps=10_000,
                        grad_accumulation=accumulation),
          device=torch.device("cpu"), checkpoint_path=tmp_path / "last.pt")
    per_epoch_extra = 2  # the epoch's mean loss for the callbacks and the last step's loss for the result
    assert host_reads["n"] <= epochs * (steps + per_epoch_extra)
    assert host_reads["n"] >= epochs * steps  # the count sees the loop's reads (a check that cannot pass empty)
