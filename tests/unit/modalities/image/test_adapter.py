"""The image modality through the engine: a stage killed mid-epoch resumes exactly, cluster-pure batches."""
import numpy as np
import torch

from tests.unit.modalities.image.training import train_on_images

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


def test_views_made_ahead_on_a_thread_train_exactly_as_views_made_in_the_step(tmp_path):
    def run(name, prefetch):
        return train_on_images(checkpoint_dir=tmp_path / name, method_kwargs=SIMCLR, images=IMAGES,
                               plan_groups=GROUPS, prefetch=prefetch)

    ahead_model, ahead = run("ahead", prefetch=True)
    inline_model, inline = run("inline", prefetch=False)
    assert [h["train/loss"] for h in ahead.history] == [h["train/loss"] for h in inline.history]
    for a, b in zip(ahead_model.state_dict().values(), inline_model.state_dict().values()):
        assert torch.equal(a, b)


def test_each_batch_draws_its_own_augmentation_from_its_epoch_and_index():
    from contrastive.modalities.image.augment import TwoViewAugment
    from contrastive.modalities.image.adapter import ImageBatch, ImageContrastiveTask, augment_seed
    from tests.unit.modalities.image.training import AUGMENT

    task = ImageContrastiveTask(method=torch.nn.Identity(), augment=TwoViewAugment(**AUGMENT), seed=3,
                                channels_last=False)

    def views(epoch, index):
        batch = ImageBatch(rows=np.arange(4), images=IMAGES[:4], groups=None, ids=np.arange(4), global_size=4,
                           offset=0, epoch=epoch, index=index)
        return task.views(batch, device=torch.device("cpu"))[0]

    assert torch.equal(views(0, 1), views(0, 1))  # whatever was drawn before
    assert not torch.equal(views(0, 1), views(0, 2)) and not torch.equal(views(0, 1), views(1, 1))
    assert len({augment_seed(seed=s, epoch=e, index=i) for s in range(3) for e in range(3) for i in range(3)}) == 27
