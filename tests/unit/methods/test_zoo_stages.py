"""BYOL, AMDIM, CPC v2 and YADIM each train as a stage through the engine (``contrastive.modalities.image.steps.train_stage``),
alone (random batches) and as an MCL stage (cluster-pure batches from pseudo-labels): the loss falls on a tiny
dataset it can memorise, the saved model reloads, and ``embed`` gives (B, D)."""
import numpy as np
import pytest
import torch

from contrastive.modalities.image import steps as stages
from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
from contrastive.engine.task import LoopSpec, OptimSpec

TINY_AMDIM = {"image_size": 32, "width": 4, "rkhs_dim": 16}
METHODS = {
    "byol": ({"name": "byol", "temperature": 0.2, "byol": {"tau_base": 0.99, "predictor_hidden": 16}}, 16),
    "amdim": ({"name": "amdim", "temperature": 0.2, "amdim": TINY_AMDIM}, 16),
    "yadim": ({"name": "yadim", "temperature": 0.2, "amdim": TINY_AMDIM, "patches": {"size": 16, "stride": 8}}, 16),
    "cpc_v2": ({"name": "cpc_v2", "temperature": 0.2, "amdim": TINY_AMDIM, "patches": {"size": 16, "stride": 8}},
               16),
}


class LossRecorder:
    def __init__(self):
        self.losses = []

    def on_step(self, *, step, epoch, metrics):
        self.losses.append(metrics["train/loss"])

    def on_epoch_end(self, *, epoch, metrics):
        pass

    def on_checkpoint(self, *, path, step):
        pass


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zoo")
    dataset_dir = prepare_trifeature(root=tmp / "data", num_train=32, num_test=16, image_size=32, num_colors=2,
                                     num_shapes=2, num_textures=2, seed=0)
    dataset = stages.load_dataset(dataset_dir)
    train_ids = dataset.ids[dataset.indices("train")]
    np.savez(tmp / "pseudo.npz", ids=train_ids, groups=np.arange(train_ids.size) % 2)  # two groups of 16
    return dataset_dir, tmp / "pseudo.npz"


def _spec(dataset_dir, stage_dir, method, *, pseudo_labels_path=None):
    return stages.ImageStageSpec(
        dataset_dir=str(dataset_dir), stage_dir=str(stage_dir),
        pseudo_labels_path=None if pseudo_labels_path is None else str(pseudo_labels_path),
        model=dict(encoder="small_cnn", widths=[8, 16], projection_hidden=16, projection_dim=8),
        method=method, augment=dict(crop_scale=(0.6, 1.0), crop_ratio=(0.75, 1.33), hflip=False, color_jitter=0.0),
        batch_size=16, seed=3, device="cpu", remainder_policy="partial",
        optim=OptimSpec(name="adam", lr=3e-3, weight_decay=0.0, schedule="constant", warmup_fraction=0.0),
        loop=LoopSpec(epochs=6, checkpoint_every_steps=100, log_every_steps=1, channels_last=False), threads=1)


@pytest.mark.parametrize("mcl", [False, True], ids=["alone", "mcl_stage"])
@pytest.mark.parametrize("name", list(METHODS))
def test_trains_as_a_stage_and_its_loss_falls(tmp_path, data, name, mcl):
    dataset_dir, pseudo = data
    method, dim = METHODS[name]
    recorder = LossRecorder()
    summary = stages.train_stage(_spec(dataset_dir, tmp_path / "stage", method, pseudo_labels_path=pseudo if mcl
                                       else None), callbacks=[recorder])
    assert summary["steps"] == 12 and summary["cluster_pure_batches"] == mcl
    losses = recorder.losses
    assert np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    model = stages.load_trained_model(model_path=summary["model_path"], device=torch.device("cpu"))
    assert model.embed(torch.rand(5, 3, 32, 32)).shape == (5, dim)
