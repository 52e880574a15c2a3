"""The engine's collectives on 2 real gloo ranks: gathering with gradient and batch norm over the global batch give
the single-process loss and gradients once DDP-style averaging is applied; on one process they are the identity."""
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from contrastive.engine.distributed import GlobalBatchNorm, gather_with_grad, per_rank_batch, sync_batch_norms
from contrastive.errors import ConfigError
from tests.distributed import run_gloo_ranks

WORLD = 2
ROWS = [3, 5]  # ranks hold different numbers of rows: padding must be stripped


def _data():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(sum(ROWS), 4, 3, 3, generator=gen), torch.randn(4, generator=gen)


def _loss(x: torch.Tensor, norm: nn.Module, weights: torch.Tensor) -> torch.Tensor:
    """A global loss over all rows: batch norm, then a pairwise term that couples every row with every other."""
    z = norm(x).mean(dim=(2, 3)) * weights
    return (z @ z.T).logsumexp(dim=1).mean()


def _worker(rank: int, out: str) -> None:
    x, weights = _data()
    start = sum(ROWS[:rank])
    mine = x[start:start + ROWS[rank]].clone().requires_grad_(True)
    norm = sync_batch_norms(nn.Sequential(nn.BatchNorm2d(4)), device=torch.device("cpu"))
    assert isinstance(norm[0], GlobalBatchNorm)
    z = norm(mine).mean(dim=(2, 3))
    gathered = gather_with_grad(z * weights)
    loss = (gathered @ gathered.T).logsumexp(dim=1).mean()
    loss.backward()
    grads = {"x": mine.grad, "bn_weight": norm[0].weight.grad.clone()}
    dist.all_reduce(grads["bn_weight"])  # what DDP does with parameter gradients: average over ranks
    grads["bn_weight"] /= WORLD
    torch.save({"loss": loss.item(), "grads": grads, "running_mean": norm[0].running_mean.clone(),
                "running_var": norm[0].running_var.clone()}, os.path.join(out, f"rank{rank}.pt"))


def test_two_ranks_reproduce_the_single_process_loss_and_gradients(tmp_path):
    run_gloo_ranks(_worker, str(tmp_path), world=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    x, weights = _data()
    x = x.clone().requires_grad_(True)
    norm = nn.BatchNorm2d(4)
    loss = _loss(x, norm, weights)
    loss.backward()
    for r, rank in enumerate(ranks):
        assert rank["loss"] == pytest.approx(loss.item(), rel=1e-5)
        start = sum(ROWS[:r])
        # Each rank gets W times its rows' gradient (the gather's backward sums the ranks' identical losses);
        # DDP's average over W then yields exactly the single-process parameter gradient.
        assert torch.allclose(rank["grads"]["x"] / WORLD, x.grad[start:start + ROWS[r]], atol=1e-6)
        assert torch.allclose(rank["grads"]["bn_weight"], norm.weight.grad, atol=1e-6)
        assert torch.allclose(rank["running_mean"], norm.running_mean, atol=1e-6)
        assert torch.allclose(rank["running_var"], norm.running_var, atol=1e-5)


def test_one_process_is_the_identity():
    x = torch.randn(3, 2, requires_grad=True)
    assert gather_with_grad(x) is x
    model = nn.Sequential(nn.BatchNorm1d(2))
    assert sync_batch_norms(model, device=torch.device("cpu")) is model and isinstance(model[0], nn.BatchNorm1d)


def test_global_batch_norm_in_eval_mode_uses_running_statistics():
    norm = GlobalBatchNorm(3)
    norm.running_mean.fill_(1.0)
    norm.eval()
    assert torch.allclose(norm(torch.ones(2, 3)), torch.zeros(2, 3), atol=1e-3)


def test_per_rank_batch_names_the_fix():
    assert per_rank_batch(global_batch_size=64, world_size=4) == 16
    with pytest.raises(ConfigError, match="multiple of the 3 processes.*nproc_per_node"):
        per_rank_batch(global_batch_size=64, world_size=3)


def test_a_launch_takes_its_device_from_whichever_kwargs_carry_it():
    """A stage's spec, an export's or an encoding's kwargs each carry the config's device; the launch's process
    group and device follow it (an export with device=cpu on a GPU node must not open NCCL and a CUDA context)."""
    from contrastive.engine.launch import device_name
    assert device_name({"spec": {"device": "cuda", "seed": 0}}) == "cuda"
    assert device_name({"export": {"dataset_dir": "d", "device": "cpu"}}) == "cpu"
    assert device_name({"encode": {"model_path": "m", "device": "cpu"}}) == "cpu"
    assert device_name({"device": "cpu", "spec": {"device": "cuda"}}) == "cpu"
    assert device_name({"spec": {"seed": 0}}) == "auto"
