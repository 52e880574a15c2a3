"""An embeddings stage under DDP on CPU (gloo, 2 processes) against one process with the same global batch: NT-Xent's
negatives gathered from both ranks with their gradient and batch norm over the global batch, so with the views off
(no feature dropout, no noise) the loss curve and the final weights are the single process's within float
tolerance, on cluster-pure batches; with the views on each rank draws its own. The export of 2 ranks (each a
contiguous share of the vectors) writes what one process writes."""
import json

import numpy as np
import pytest
import torch

from contrastive.embeddings import load_embeddings
from contrastive.engine.checkpoint import load_checkpoint
from contrastive.engine.distributed import DistInfo
from contrastive.engine.rng import rng_of_rank
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.modalities.embeddings.data import load_feature_dataset, prepare_synthetic
from contrastive.modalities.embeddings.steps import (FeatureStageSpec, export_feature_embeddings,
                                                     export_features_from_json, train_feature_stage,
                                                     train_feature_stage_from_json)
from tests.distributed import run_gloo_ranks

# about 20 s on the shared 2-core CPU (two spawned gloo ranks, each importing torch): make test-slow
pytestmark = pytest.mark.slow

WORLD = 2
#: SGD, not Adam: the bias of a Linear layer before batch norm has a true gradient of 0 (the norm subtracts the batch
#: mean, the bias with it), which Adam's normalisation turns from either run's float noise into lr-sized steps, and
#: the batch norm's running mean follows the bias: every weight and statistic is compared here.
OPTIM = OptimSpec(name="sgd", lr=0.05, momentum=0.9, weight_decay=0.0, schedule="constant")
VIEWS_OFF = {"temperature": 0.2, "feature_dropout": 0.0, "noise": 0.0}
VIEWS_ON = {"temperature": 0.2, "feature_dropout": 0.2, "noise": 0.1}


def _spec(stage_dir, data_dir, *, pseudo: str | None, views: dict) -> FeatureStageSpec:
    return FeatureStageSpec(stage_dir=str(stage_dir), seed=5, device="cpu", threads=1, record_keys=True,
                            optim=OPTIM,
                            loop=LoopSpec(epochs=2, log_every_steps=1, checkpoint_every_steps=1000),
                            dataset_dir=str(data_dir), pseudo_labels_path=pseudo,
                            encoder={"hidden": 16, "depth": 2, "dim": 4, "projection_dim": 8}, views=views,
                            batch_size=16, remainder_policy="drop")


def _export_kwargs(data_dir, model_path, out_dir) -> dict:
    return {"dataset_dir": str(data_dir), "model_path": str(model_path), "out_dir": str(out_dir), "batch_size": 7,
            "device": "cpu"}


def _worker(rank: int, specs: list[dict], export: dict) -> None:
    """What a torchrun launch of the modality's entries runs on each rank: the stages, then an export."""
    info = DistInfo(rank=rank, world_size=WORLD)
    for spec in specs:
        train_feature_stage_from_json(spec=spec, info=info)
    export_features_from_json(export=export, info=info)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("embeddings_ddp")
    data_dir = prepare_synthetic(root=tmp / "data", num_train=64, num_test=16, dim=12,
                                 classes={"dominant": 4, "weak": 2}, scales={"dominant": 3.0, "weak": 1.0},
                                 noise=0.3, seed=0)
    dataset = load_feature_dataset(data_dir)
    train_ids = dataset.ids[dataset.indices("train")]
    groups = np.arange(train_ids.size) % 2  # two pseudo-label groups of 32: two global batches of 16 each
    np.savez(tmp / "pseudo.npz", ids=train_ids, groups=groups)
    pseudo = str(tmp / "pseudo.npz")
    one = train_feature_stage(_spec(tmp / "one", data_dir, pseudo=pseudo, views=VIEWS_OFF))
    export_feature_embeddings(**_export_kwargs(data_dir, one["model_path"], tmp / "export-one"))
    run_gloo_ranks(_worker, [_spec(tmp / "two", data_dir, pseudo=pseudo, views=VIEWS_OFF).to_json(),
                             _spec(tmp / "two-views", data_dir, pseudo=None, views=VIEWS_ON).to_json()],
                   _export_kwargs(data_dir, one["model_path"], tmp / "export-two"), world=WORLD)
    return tmp, dataset, dict(zip(train_ids.tolist(), groups.tolist()))


def test_two_ranks_match_one_process_with_the_same_global_batch(runs):
    tmp, _, group_of = runs
    one = json.loads((tmp / "one" / "keys_rank0.json").read_text())
    two = [json.loads((tmp / "two" / f"keys_rank{r}.json").read_text()) for r in range(WORLD)]
    assert len(one["batches"]) == len(two[0]["batches"]) == 8  # 64 vectors / 16, two epochs
    for step, batch in enumerate(one["batches"]):
        halves = [two[r]["batches"][step] for r in range(WORLD)]
        assert sorted(halves[0] + halves[1]) == sorted(batch) and not set(halves[0]) & set(halves[1])
        assert len({group_of[k] for k in batch}) == 1
    assert two[0]["losses"] == pytest.approx(two[1]["losses"], rel=1e-6)  # one global loss on every rank
    assert two[0]["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-5)
    weights_one = torch.load(tmp / "one" / "model" / "model.pt", weights_only=True)["state_dict"]
    weights_two = torch.load(tmp / "two" / "model" / "model.pt", weights_only=True)["state_dict"]
    assert weights_two.keys() == weights_one.keys()  # plain batch norm in the saved model, as one process saves it
    for name, value in weights_one.items():
        assert torch.allclose(weights_two[name], value, rtol=1e-4, atol=1e-5), name
    summary = json.loads((tmp / "two" / "train_summary.json").read_text())
    assert summary["world_size"] == WORLD and summary["per_rank_batch"] == 8 and summary["global_batch"] == 16
    assert (tmp / "two" / "train_metrics.jsonl").is_file()  # what the flow reads after a launch


def test_with_the_views_on_each_rank_draws_its_own(runs):
    """Rank 1 seeds its view generator apart from rank 0 (the same draws on both would correlate the noise of the
    global batch's halves); both still log the one global loss."""
    tmp, _, _ = runs
    checkpoint = load_checkpoint(tmp / "two-views" / "checkpoints" / "last.pt")
    states = [rng_of_rank(checkpoint, rank=r, world_size=WORLD)["generators"]["views"] for r in range(WORLD)]
    assert not torch.equal(states[0], states[1])
    two = [json.loads((tmp / "two-views" / f"keys_rank{r}.json").read_text()) for r in range(WORLD)]
    assert len(two[0]["losses"]) == 8 and two[0]["losses"] == pytest.approx(two[1]["losses"], rel=1e-6)


def test_two_ranks_export_what_one_process_exports(runs):
    tmp, dataset, _ = runs
    ids_one, z_one = load_embeddings(directory=tmp / "export-one")
    ids_two, z_two = load_embeddings(directory=tmp / "export-two")
    assert ids_two.tolist() == ids_one.tolist() == dataset.ids.tolist() and z_one.shape == (80, 4)
    np.testing.assert_array_equal(z_two, z_one)  # the same model in eval mode: row by row the same arithmetic
    assert sorted(p.name for p in (tmp / "export-two").glob("*part-*.npy")) == ["rank000-part-00000.npy",
                                                                                "rank001-part-00000.npy"]
    summary = json.loads((tmp / "export-two" / "export_summary.json").read_text())
    assert summary["num_samples"] == 80 and summary["world_size"] == WORLD
