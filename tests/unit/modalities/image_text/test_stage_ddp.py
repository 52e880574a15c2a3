"""A whole CLIP stage under DDP on CPU (gloo, 2 processes) against one process reading the same 2 data slots: the
same global batches, loss curve and final weights, for the random stage 0 and a cluster-pure stage."""
import json

import numpy as np
import pytest
import torch

from contrastive.modalities.image_text.data import iter_raw_samples, write_tiny_shards
from contrastive.modalities.image_text.grouped import reshard_by_group
from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip, load_stage_model
from contrastive.modalities.image_text.steps import ClipStageSpec, train_stage
from contrastive.engine.distributed import DistInfo
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.errors import ConfigError
from tests.distributed import run_gloo_ranks

WORLD = 2
EPOCHS = 2
STEPS = 3  # per epoch


def _spec(stage_dir, *, urls, grouped_dir=None, data_slots=None) -> ClipStageSpec:
    return ClipStageSpec(clip=ClipSpec(model_name=TINY_MODEL, init_seed=0, trainable_image_blocks=1).to_dict(),
                         urls=urls, grouped_dir=grouped_dir, stage_dir=str(stage_dir), global_batch_size=8,
                         optim=OptimSpec(name="adamw", lr=1e-3, weight_decay=0.0, schedule="constant"),
                         loop=LoopSpec(epochs=EPOCHS, max_steps_per_epoch=STEPS, log_every_steps=1), device="cpu",
                         seed=5, record_keys=True, threads=1, shuffle_buffer=8, data_slots=data_slots,
                         max_skip_fraction=0.1)


def _worker(rank: int, specs: list[dict]) -> None:
    for spec in specs:
        train_stage(ClipStageSpec.from_json(spec), info=DistInfo(rank=rank, world_size=WORLD))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clip_stage_ddp")
    shards = write_tiny_shards(directory=tmp / "shards", num_samples=64, samples_per_shard=8, seed=3)
    keys = np.array([s["__key__"] for s in iter_raw_samples(shards["urls"])])
    keys = keys[~np.isin(keys, shards["corrupt_keys"])]
    groups = np.arange(keys.size) % 2
    reshard_by_group(urls=shards["urls"], keys=keys, groups=groups, out_dir=tmp / "grouped", slots=WORLD, seed=0)
    kinds = {"random": {}, "pure": {"grouped_dir": str(tmp / "grouped")}}
    for kind, extra in kinds.items():
        train_stage(_spec(tmp / f"one-{kind}", urls=shards["urls"], data_slots=WORLD, **extra))
    run_gloo_ranks(_worker, [_spec(tmp / f"two-{kind}", urls=shards["urls"], **extra).to_json()
                             for kind, extra in kinds.items()], world=WORLD)
    return tmp, dict(zip(keys.tolist(), groups.tolist()))


def _trained(stage_dir) -> dict:
    model = load_stage_model(path=stage_dir / "model" / "model.pt", device=torch.device("cpu")).model
    return {name: value for name, value in model.state_dict().items() if value.is_floating_point()}


@pytest.mark.parametrize("kind", ["random", "pure"])
def test_two_ranks_equal_one_process_reading_the_same_slots(runs, kind):
    tmp, group_of = runs
    one = json.loads((tmp / f"one-{kind}" / "keys_rank0.json").read_text())
    two = [json.loads((tmp / f"two-{kind}" / f"keys_rank{r}.json").read_text()) for r in range(WORLD)]
    assert len(one["batches"]) == EPOCHS * STEPS
    for step, batch in enumerate(one["batches"]):
        assert two[0]["batches"][step] + two[1]["batches"][step] == batch  # rank r holds slot r of the batch
        if kind == "pure":
            assert len({group_of[k] for k in batch}) == 1
    assert one["batches"][:STEPS] != one["batches"][STEPS:]  # a new order in the next epoch
    assert two[0]["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-5)
    weights_one, weights_two = _trained(tmp / f"one-{kind}"), _trained(tmp / f"two-{kind}")
    initial = _trained_init()
    moved = 0
    for name, value in weights_one.items():
        other = weights_two[name]
        if name.endswith("attn.in_proj_bias"):
            # The key bias adds the same score to every key of a query, which softmax removes: its true gradient
            # is 0 and Adam turns either run's float noise into lr-sized steps. Query and value biases must match.
            width = value.numel() // 3
            value, other = torch.cat([value[:width], value[2 * width:]]), torch.cat([other[:width], other[2 * width:]])
        assert torch.allclose(other, value, rtol=1e-4, atol=1e-5), name
        moved += not torch.equal(weights_one[name], initial[name])
    assert moved > 0  # the trainable blocks did train
    summary = json.loads((tmp / f"two-{kind}" / "train_summary.json").read_text())
    assert summary["data_slots"] == WORLD and summary["per_rank_batch"] == 4


def _trained_init() -> dict:
    model = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=0, trainable_image_blocks=1)).model
    return {name: value for name, value in model.state_dict().items() if value.is_floating_point()}


def test_slots_that_processes_cannot_share_fail_before_training(tmp_path):
    shards = write_tiny_shards(directory=tmp_path / "shards", num_samples=16, samples_per_shard=8, seed=3)
    with pytest.raises(ConfigError, match="cannot share evenly"):
        train_stage(_spec(tmp_path / "stage", urls=shards["urls"], data_slots=3), info=DistInfo(rank=0, world_size=2))
    assert not (tmp_path / "stage" / "checkpoints").exists()
