"""The image modality through the engine: a stage killed mid-epoch resumes exactly, cluster-pure batches."""
import numpy as np
import torch

from tests.unit.modalities.image_training import train_on_images

IMAGES = torch.randint(0, 255, (48, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
GROUPS = np.repeat(np.arange(3), 16)
SIMCLR = {"name": "simclr", "temperature": 0.5}


def test_resume_mid_epoch_equals_uninterrupted(tmp_path):
    def run(name, stop=None):
        return train_on_images(checkpoint_dir=tmp_path / name, method_kwargs=SIMCLR, images=IMAGES,
                               plan_groups=GROUPS, warmup_fraction=0.1, checkpoint_every_steps=2,
                               stop_after_steps=stop)

    full_model, full = run("full")
    _, partial = run("crash", stop=5)  # killed in the middle of epoch 0
    assert partial.steps == 5
    resumed_model, resumed = run("crash")  # a fresh process would rebuild the model the same way
    assert resumed.resumed_from_step == 5 and resumed.steps == full.steps == 12
    for a, b in zip(full_model.state_dict().values(), resumed_model.state_dict().values()):
        assert torch.equal(a, b)
