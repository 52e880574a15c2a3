import numpy as np
import torch

from contrastive.augment import TwoViewAugment, random_resized_crop
from contrastive.checkpoint import load_checkpoint, save_checkpoint
from contrastive.methods import build_method
from contrastive.sampling import ClusterBatchSampler
from contrastive.train import lr_multiplier, seed_everything, train_contrastive


def test_full_crop_is_identity():
    images = torch.rand(3, 3, 8, 8)
    out = random_resized_crop(images=images, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=False,
                              generator=torch.Generator().manual_seed(0))
    assert torch.allclose(out, images, atol=1e-5)


def test_crop_keeps_colour_and_is_seeded():
    images = torch.zeros(4, 3, 16, 16)
    images[:, 0] = 1.0  # pure red: any crop of it is pure red
    aug = TwoViewAugment(crop_scale=(0.2, 1.0), crop_ratio=(0.75, 1.33), hflip=True, color_jitter=0.0)
    v1, v2 = aug((images * 255).to(torch.uint8), torch.Generator().manual_seed(1))
    assert torch.allclose(v1[:, 0], torch.ones_like(v1[:, 0]), atol=1e-5) and v1[:, 1:].abs().max() < 1e-5
    w1, _ = aug((images * 255).to(torch.uint8), torch.Generator().manual_seed(1))
    assert torch.equal(v1, w1)


def test_lr_schedule_closed_form():
    assert lr_multiplier(step=0, total_steps=100, warmup_steps=10, schedule="cosine") == 0.1
    assert lr_multiplier(step=10, total_steps=100, warmup_steps=10, schedule="cosine") == 1.0
    assert abs(lr_multiplier(step=55, total_steps=100, warmup_steps=10, schedule="cosine") - 0.5) < 1e-9
    assert lr_multiplier(step=99, total_steps=100, warmup_steps=0, schedule="constant") == 1.0


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)
    save_checkpoint({"step": 2}, path)
    assert load_checkpoint(path)["step"] == 2
    path.write_bytes(path.read_bytes()[:10])  # truncated, as by a crash mid-copy
    import pytest
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert load_checkpoint(path)["step"] == 1


def _train(tmp_path, *, stop_after_steps=None, epochs=2):
    images = torch.randint(0, 255, (48, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    groups = np.repeat(np.arange(3), 16)
    seed_everything(0)
    model = build_method(model_kwargs=dict(encoder="small_cnn", widths=[4, 8], projection_hidden=8, projection_dim=4),
                         method_kwargs=dict(name="simclr", temperature=0.5))
    sampler = ClusterBatchSampler(groups=groups, batch_size=8, seed=0)
    result = train_contrastive(
        model=model, batch_sampler=sampler, get_batch=lambda rows: images[torch.from_numpy(rows)],
        augment=TwoViewAugment(crop_scale=(0.3, 1.0), crop_ratio=(0.75, 1.33), hflip=False, color_jitter=0.0),
        epochs=epochs, optimizer="adam", lr=1e-2,
        weight_decay=0.0, schedule="cosine", warmup_fraction=0.1, seed=0, device=torch.device("cpu"),
        checkpoint_path=tmp_path / "ckpt" / "last.pt", checkpoint_every_steps=2, log_every_steps=1,
        stop_after_steps=stop_after_steps)
    return model, result


def test_resume_mid_epoch_equals_uninterrupted(tmp_path):
    full_model, full = _train(tmp_path / "full")
    _, partial = _train(tmp_path / "crash", stop_after_steps=5)  # killed in the middle of epoch 0
    assert partial.steps == 5
    resumed_model, resumed = _train(tmp_path / "crash")  # a fresh process would rebuild the model the same way
    assert resumed.resumed_from_step == 5 and resumed.steps == full.steps
    for a, b in zip(full_model.state_dict().values(), resumed_model.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6)
