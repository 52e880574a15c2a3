"""A text (SimCSE) stage under DDP on CPU (gloo, 2 processes) against one process with the same global batch: the
negatives gathered from both ranks with their gradient, so the loss curve and the final weights are the single
process's within float tolerance (dropout off: with it each rank draws its own masks), for unsupervised SimCSE on
cluster-pure batches and supervised SimCSE on random batches."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from contrastive.engine.distributed import DistInfo
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.modalities.text.dataset import GeneratorParams, load_text_dataset, prepare_generated_text
from contrastive.modalities.text.encoders import TextEncoderSpec
from contrastive.modalities.text.steps import TextStageSpec, train_text_stage
from tests.distributed import run_gloo_ranks

WORLD = 2
KINDS = ("unsup_pure", "sup_random")


def _spec(stage_dir, data_dir, *, kind: str, pseudo: str) -> TextStageSpec:
    return TextStageSpec(
        stage_dir=str(stage_dir), seed=3, device="cpu", threads=1, record_keys=True,
        optim=OptimSpec(name="adam", lr=1e-3, weight_decay=0.0, schedule="constant"),
        loop=LoopSpec(epochs=2, log_every_steps=1, checkpoint_every_steps=1000), dataset_dir=str(data_dir),
        pseudo_labels_path=pseudo if kind == "unsup_pure" else None,
        encoder=TextEncoderSpec(dim=16, depth=1, heads=2, max_length=16, dropout=0.0).to_json(),
        method={"name": "simcse_unsup" if kind == "unsup_pure" else "simcse_sup", "temperature": 0.05,
                "mlp_head": True},
        batch_size=16, remainder_policy="drop", isotropy={"every_steps": 0})


def _worker(rank: int, specs: list[dict]) -> None:
    for spec in specs:
        train_text_stage(TextStageSpec.from_json(spec), info=DistInfo(rank=rank, world_size=WORLD))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text_ddp")
    data_dir = prepare_generated_text(root=tmp / "data", params=GeneratorParams(
        num_train=64, num_test=16, num_sts_pairs=10, num_csts_pairs=5))
    dataset = load_text_dataset(data_dir)
    train_ids = dataset.ids[dataset.indices("train")]
    groups = np.arange(train_ids.size) % 2  # two pseudo-label groups of 32: two global batches of 16 each
    np.savez(tmp / "pseudo.npz", ids=train_ids, groups=groups)
    for kind in KINDS:
        train_text_stage(_spec(tmp / f"one-{kind}", data_dir, kind=kind, pseudo=str(tmp / "pseudo.npz")))
    run_gloo_ranks(_worker, [_spec(tmp / f"two-{kind}", data_dir, kind=kind, pseudo=str(tmp / "pseudo.npz")).to_json()
                             for kind in KINDS], world=WORLD)
    return tmp, dict(zip(train_ids.tolist(), groups.tolist()))


@pytest.mark.parametrize("kind", KINDS)
def test_two_ranks_match_one_process_with_the_same_global_batch(runs, kind):
    tmp, group_of = runs
    one = json.loads((tmp / f"one-{kind}" / "keys_rank0.json").read_text())
    two = [json.loads((tmp / f"two-{kind}" / f"keys_rank{r}.json").read_text()) for r in range(WORLD)]
    assert len(one["batches"]) == len(two[0]["batches"]) == 8  # 64 sentences / 16, two epochs
    for step, batch in enumerate(one["batches"]):
        halves = [two[r]["batches"][step] for r in range(WORLD)]
        assert sorted(halves[0] + halves[1]) == sorted(batch) and not set(halves[0]) & set(halves[1])
        if kind == "unsup_pure":
            assert len({group_of[k] for k in batch}) == 1
    assert two[0]["losses"] == pytest.approx(two[1]["losses"], rel=1e-6)  # one global loss on every rank
    assert two[0]["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-5)
    weights_one = torch.load(tmp / f"one-{kind}" / "model" / "model.pt", weights_only=True)["state_dict"]
    weights_two = torch.load(tmp / f"two-{kind}" / "model" / "model.pt", weights_only=True)["state_dict"]
    for name, value in weights_one.items():
        other = weights_two[name]
        if name.endswith("in_proj_bias"):
            # The key bias adds the same score to every key of a query, which softmax removes: its true gradient
            # is 0 and Adam turns either run's float noise into lr-sized steps. Query and value biases must match.
            width = value.numel() // 3
            value, other = torch.cat([value[:width], value[2 * width:]]), torch.cat([other[:width], other[2 * width:]])
        assert torch.allclose(other, value, rtol=1e-4, atol=1e-5), name
    summary = json.loads((tmp / f"two-{kind}" / "train_summary.json").read_text())
    assert summary["world_size"] == WORLD and summary["per_rank_batch"] == 8 and summary["global_batch"] == 16


def test_without_gathering_two_ranks_would_train_differently(runs):
    """The check above can fail: each rank's loss over its own half (8 sentences, 7 negatives each) is not the
    global batch's (15 negatives each)."""
    from contrastive.modalities.text.simcse import simcse_unsup_loss
    torch.manual_seed(0)
    z1, z2 = torch.randn(16, 8), torch.randn(16, 8)
    whole = simcse_unsup_loss(z1=z1, z2=z2, temperature=0.05)
    halves = (simcse_unsup_loss(z1=z1[:8], z2=z2[:8], temperature=0.05)
              + simcse_unsup_loss(z1=z1[8:], z2=z2[8:], temperature=0.05)) / 2
    assert not torch.isclose(whole, halves, rtol=1e-3)
