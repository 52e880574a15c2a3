"""DDP on CPU (gloo, 2 processes): gathered-with-grad CLIP loss gives the single-process gradient, and cluster-pure
training over a 2-rank group re-shard gives ranks disjoint, group-pure batches in lockstep."""
import json
import os

import numpy as np
import pytest
import torch

from contrastive.modalities.image_text.data import ClipBatch, iter_raw_samples, write_tiny_shards
from contrastive.engine.distributed import DistInfo
from contrastive.modalities.image_text.grouped import reshard_by_group
from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip
from contrastive.modalities.image_text.steps import ClipStageSpec, train_stage
from contrastive.engine.task import LoopSpec, OptimSpec
from tests.distributed import run_gloo_ranks
from contrastive.modalities.image_text.adapter import ClipTrainModule

SPEC = ClipSpec(model_name=TINY_MODEL, init_seed=0, trainable_image_blocks=1)
WORLD = 2


def _fixed_batch(n: int = 8) -> ClipBatch:
    gen = torch.Generator().manual_seed(42)
    return ClipBatch(images=torch.randn(n, 3, 32, 32, generator=gen),
                     texts=[f"a caption number {i}" for i in range(n)], keys=[str(i) for i in range(n)])


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _worker(rank: int, tmp: str, grouped_dir: str, urls: list) -> None:
    full = _fixed_batch()
    half = full.images.shape[0] // WORLD
    mine = ClipBatch(images=full.images[rank * half:(rank + 1) * half],
                     texts=full.texts[rank * half:(rank + 1) * half], keys=full.keys[rank * half:(rank + 1) * half])
    out = {}
    for local_loss in (False, True):
        bundle = create_clip(spec=SPEC)
        module = torch.nn.parallel.DistributedDataParallel(
            ClipTrainModule(bundle.model, text_frozen=True, local_loss=local_loss))
        loss, _ = module(mine.images, bundle.tokenizer(mine.texts))
        loss.backward()  # DDP averages the gradients over ranks here
        out[local_loss] = {"loss": loss.item(), "grads": _grads(bundle.model)}
    torch.save(out, os.path.join(tmp, f"grads{rank}.pt"))
    spec = ClipStageSpec(clip=SPEC.to_dict(), urls=urls, grouped_dir=grouped_dir, stage_dir=os.path.join(tmp, "stage"),
                         global_batch_size=8, optim=OptimSpec(name="adamw", lr=1e-4, weight_decay=0.0,
                                                              schedule="constant"),
                         loop=LoopSpec(epochs=1, max_steps_per_epoch=3, log_every_steps=1), device="cpu", seed=0,
                         record_keys=True, threads=1)
    train_stage(spec, info=DistInfo(rank=rank, world_size=WORLD))


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    shards = write_tiny_shards(directory=tmp / "shards", num_samples=64, samples_per_shard=16, seed=2)
    keys = np.array([s["__key__"] for s in iter_raw_samples(shards["urls"])])
    keys = keys[~np.isin(keys, shards["corrupt_keys"])]
    groups = np.arange(keys.size) % 3
    reshard_by_group(urls=shards["urls"], keys=keys, groups=groups, out_dir=tmp / "grouped", slots=WORLD, seed=0)
    run_gloo_ranks(_worker, str(tmp), str(tmp / "grouped"), shards["urls"], world=WORLD)
    return tmp, dict(zip(keys.tolist(), groups.tolist()))


def test_gathered_loss_gradients_equal_the_single_process_gradient(ddp_run):
    tmp, _ = ddp_run
    ranks = [torch.load(tmp / f"grads{r}.pt", weights_only=True) for r in range(WORLD)]
    bundle = create_clip(spec=SPEC)
    batch = _fixed_batch()
    reference_loss, _ = ClipTrainModule(bundle.model, text_frozen=True)(batch.images, bundle.tokenizer(batch.texts))
    reference_loss.backward()
    reference = _grads(bundle.model)
    for local_loss in (False, True):
        losses = [r[local_loss]["loss"] for r in ranks]
        if local_loss:  # each rank its rows; their mean is the global loss
            assert np.mean(losses) == pytest.approx(reference_loss.item(), rel=1e-5)
        else:
            assert losses == pytest.approx([reference_loss.item()] * WORLD, rel=1e-5)
        for name, grad in reference.items():
            for r in ranks:
                assert torch.allclose(r[local_loss]["grads"][name], grad, atol=1e-5, rtol=1e-4), (local_loss, name)


def test_ranks_train_on_disjoint_group_pure_batches_in_lockstep(ddp_run):
    tmp, group_of = ddp_run
    per_rank = [json.loads((tmp / "stage" / f"keys_rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(len(p["batches"]) == 3 for p in per_rank)
    seen = [{k for batch in p["batches"] for k in batch} for p in per_rank]
    assert not seen[0] & seen[1]
    for step in range(3):
        # Both ranks' halves of a global batch come from the same group.
        assert len({group_of[k] for p in per_rank for k in p["batches"][step]}) == 1
    assert per_rank[0]["losses"] == pytest.approx(per_rank[1]["losses"], rel=1e-5)
    summary = json.loads((tmp / "stage" / "train_summary.json").read_text())
    assert summary["world_size"] == WORLD and summary["per_rank_batch"] == 4 and summary["steps"] == 3
    assert (tmp / "stage" / "model" / "model.pt").is_file()
