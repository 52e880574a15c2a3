"""A finished stage leaves nothing of its model alive in the process, so the next stage starts with the device
memory it had before (on CUDA, release_device_memory then returns the cache to the driver)."""
import gc
import weakref

from contrastive.modalities.image import steps as stages
from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
from tests.faults.train_tiny_stage import tiny_spec


def test_a_finished_stage_frees_its_model(tmp_path, monkeypatch):
    dataset_dir = prepare_trifeature(root=tmp_path / "data", num_train=64, num_test=16, image_size=16, num_colors=2,
                                     num_shapes=2, num_textures=2, seed=0)
    built = []
    real_build = stages.build_method

    def tracking_build(**kwargs):
        method = real_build(**kwargs)
        built.append(weakref.ref(method))
        return method

    monkeypatch.setattr(stages, "build_method", tracking_build)
    summary = stages.train_stage(tiny_spec(dataset_dir, tmp_path / "stage", epochs=1))
    assert summary["steps"] == 4 and len(built) == 1
    gc.collect()
    assert built[0]() is None  # no reference to the trained model, its optimizer state or its DDP wrapper is left
