"""The baselines and naive inheritance through a real stage: tiny CIFAR-MNIST files (4 channels) -> train -> export
-> the same probes as every pipeline."""
import numpy as np
import pytest
import torch

from contrastive.modalities.image import steps as stages
from contrastive.modalities.image.datasets.cifar_mnist import prepare_cifar_mnist
from contrastive.engine.task import LoopSpec, OptimSpec
from tests.unit.modalities.image.datasets.test_cifar_mnist import write_cifar, write_mnist

MODEL = {"encoder": "small_cnn", "widths": [4, 8], "projection_hidden": 8, "projection_dim": 4, "in_channels": 4}
AUGMENT = {"crop_scale": (0.5, 1.0), "crop_ratio": (0.75, 1.33), "hflip": False, "color_jitter": 0.0}


def spec(tmp_path, dataset, name, method, **extra):
    return stages.ImageStageSpec(
        dataset_dir=str(dataset), stage_dir=str(tmp_path / name), pseudo_labels_path=None, model=MODEL,
        method=method, augment=AUGMENT, batch_size=8, seed=0, device="cpu", remainder_policy="partial",
        optim=OptimSpec(name="adam", lr=1e-2, weight_decay=0.0), loop=LoopSpec(epochs=1, checkpoint_every_steps=2,
                                                                               log_every_steps=1), **extra)


@pytest.fixture(scope="module")
def cifar_mnist(tmp_path_factory):
    root = tmp_path_factory.mktemp("cm")
    write_cifar(root / "c", per_batch=6)
    write_mnist(root / "m", n_train=40, n_test=10)
    return prepare_cifar_mnist(cifar_root=root / "c", mnist_root=root / "m", root=root / "cache")


@pytest.mark.parametrize("method", [{"name": "ifm", "temperature": 0.5, "ifm": {"epsilon": 0.1}},
                                    {"name": "ts", "temperature": 0.5, "ts": {"tau_min": 0.1, "tau_max": 1.0}},
                                    {"name": "fd", "temperature": 0.5, "fd": {"budget": 0.05, "width": 4}}])
def test_baseline_stage_on_four_channel_data(tmp_path, cifar_mnist, method):
    summary = stages.train_stage(spec(tmp_path, cifar_mnist, "train", method))
    assert summary["steps"] == 4 and np.isfinite(summary["final_loss"])  # 30 samples: 3 full batches + a partial
    exported = stages.export_stage_embeddings(dataset_dir=cifar_mnist, model_path=summary["model_path"],
                                              out_dir=tmp_path / "emb", batch_size=16, device="cpu")
    metrics = stages.evaluate_embeddings(dataset_dir=cifar_mnist, embeddings_dirs=[exported["dir"]], probe_c=1.0,
                                         probe_max_iter=50, probe_max_train=100, knn_k=3, seed=0)
    assert {"probe/cifar", "probe/digit", "knn/cifar", "knn/digit"} <= set(metrics)


def test_inheritance_starts_from_the_earlier_stage(tmp_path, cifar_mnist, monkeypatch):
    method = {"name": "simclr", "temperature": 0.5}
    first = stages.train_stage(spec(tmp_path, cifar_mnist, "s0", method))
    saved = torch.load(first["model_path"], weights_only=True)["state_dict"]
    started_from = {}

    class Stop(Exception):
        pass

    def capture(*, task, **kwargs):  # the weights the engine would start training from
        started_from[kwargs["checkpoint_path"].parent.parent.name] = {
            k: v.clone() for k, v in task.model.state_dict().items()}
        raise Stop

    monkeypatch.setattr(stages, "train", capture)
    for name, extra in (("inherited", {"init_model_path": first["model_path"]}), ("fresh", {})):
        with pytest.raises(Stop):
            stages.train_stage(spec(tmp_path, cifar_mnist, name, method, **extra))
    assert all(torch.equal(started_from["inherited"][k], v) for k, v in saved.items())
    weights = [k for k in saved if k.startswith("backbone") and k.endswith("weight")]
    assert not torch.equal(started_from["fresh"][weights[0]], saved[weights[0]])
