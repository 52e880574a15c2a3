import torch

from contrastive.modalities.image.augment import TwoViewAugment, random_resized_crop


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
