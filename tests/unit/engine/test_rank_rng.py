"""Each rank resumes its own random draws: 2 gloo ranks whose forward draws dropout masks from the global torch
RNG (seeded differently per rank, as dropout is) are stopped mid-stage and resumed; the weights equal an
uninterrupted run's only if every rank restored its own state (restoring rank 0's on both, as before, does not).
Also: a process without a GPU of its own is a ConfigError, not a second process on GPU 0."""
import os

import pytest
import torch
from torch import nn

from contrastive.engine import distributed
from contrastive.engine.distributed import DistInfo, current_info, device_for
from contrastive.engine.loop import train
from contrastive.engine.rng import rng_of_rank
from contrastive.engine.task import LoopSpec, OptimSpec, StageTask
from contrastive.errors import ConfigError
from tests.distributed import run_gloo_ranks
from tests.unit.engine.test_loop import FixedBatches


class DropoutRegression(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x, y):
        keep = (torch.rand(x.shape) > 0.3).float()  # the global RNG, as nn.Dropout draws it
        return ((self.linear(x * keep).squeeze(1) - y) ** 2).mean(), {}


class DropoutTask(StageTask):
    def __init__(self):
        with torch.random.fork_rng():  # the same initial weights on every rank (DDP requires it), own RNG kept
            torch.manual_seed(0)
            self.model = DropoutRegression()

    def forward_module(self):
        return self.model

    def inputs(self, batch, *, device, step):
        return {"x": batch.x, "y": batch.y}


def _stage(rank: int, out: str, name: str, stop_after: int | None) -> None:
    torch.manual_seed(1000 + rank)  # each rank its own dropout stream
    task = DropoutTask()
    train(task=task, source=FixedBatches(), optim=OptimSpec(name="sgd", lr=0.05, schedule="constant"),
          loop=LoopSpec(epochs=2, checkpoint_every_steps=3), device=torch.device("cpu"),
          checkpoint_path=os.path.join(out, name, "last.pt"), info=current_info(), stop_after_steps=stop_after)
    if rank == 0:
        torch.save(task.model.state_dict(), os.path.join(out, f"{name}-{stop_after}.pt"))


def _uninterrupted(rank: int, out: str) -> None:
    _stage(rank, out, "full", None)


def _stopped(rank: int, out: str) -> None:
    _stage(rank, out, "resumed", 4)


def _resumed(rank: int, out: str) -> None:
    torch.manual_seed(5)  # a resumed process starts from some other state: the checkpoint must replace it
    task = DropoutTask()
    train(task=task, source=FixedBatches(), optim=OptimSpec(name="sgd", lr=0.05, schedule="constant"),
          loop=LoopSpec(epochs=2, checkpoint_every_steps=3), device=torch.device("cpu"),
          checkpoint_path=os.path.join(out, "resumed", "last.pt"), info=current_info())
    if rank == 0:
        torch.save(task.model.state_dict(), os.path.join(out, "resumed-None.pt"))


def test_two_ranks_resume_their_own_draws(tmp_path):
    run_gloo_ranks(_uninterrupted, str(tmp_path))
    run_gloo_ranks(_stopped, str(tmp_path))
    checkpoint = torch.load(tmp_path / "resumed" / "last.pt", weights_only=True)
    assert len(checkpoint["rng_by_rank"]) == 2
    assert not torch.equal(checkpoint["rng_by_rank"][0]["torch"], checkpoint["rng_by_rank"][1]["torch"])
    assert torch.equal(rng_of_rank(checkpoint, rank=1, world_size=2)["torch"], checkpoint["rng_by_rank"][1]["torch"])
    run_gloo_ranks(_resumed, str(tmp_path))
    full = torch.load(tmp_path / "full-None.pt")
    resumed = torch.load(tmp_path / "resumed-None.pt")
    for name in full:
        torch.testing.assert_close(resumed[name], full[name], rtol=0, atol=0)


def test_a_checkpoint_of_another_world_size_falls_back_to_rank_0():
    checkpoint = {"rng": {"torch": "rank0"}, "rng_by_rank": [{"torch": "rank0"}, {"torch": "rank1"}]}
    assert rng_of_rank(checkpoint, rank=1, world_size=2) == {"torch": "rank1"}
    assert rng_of_rank(checkpoint, rank=2, world_size=4) == {"torch": "rank0"}
    assert rng_of_rank({"rng": {"torch": "old"}}, rank=1, world_size=2) == {"torch": "old"}


def test_more_processes_than_gpus_is_a_config_error(monkeypatch):
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 2)
    assert device_for(name="cuda", info=DistInfo(rank=1, world_size=2, local_rank=1)) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="process 2 of this node has no GPU of its own: 2 GPUs are visible.*"
                                          "distributed.nproc_per_node=2 or fewer"):
        device_for(name="cuda", info=DistInfo(rank=2, world_size=4, local_rank=2))
