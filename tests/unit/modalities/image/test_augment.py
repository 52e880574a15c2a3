"""contrastive/modalities/image/augment.py: the default pipeline draws and outputs bitwise what the first version did; a global
batch split over ranks is augmented as one process would; grayscale, blur, solarize and hue against closed forms;
every op that is off is the identity and draws nothing."""
import math

import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from contrastive.modalities.image.augment import (TwoViewAugment, adjust_hue, blur_radius, color_jitter, gaussian_blur,
                                 gaussian_kernels, random_grayscale, solarize)
from contrastive.errors import ConfigError
from pipeline_config.loader import load_config
from contrastive.modalities.image.config import AugmentConfig


# --- frozen copy of the first version's augmentations (contrastive/modalities/image/augment.py before grayscale/blur/solarize) ----
def _old_uniform(low, high, size, generator):
    return low + (high - low) * torch.rand(size, generator=generator)


def _old_random_resized_crop(*, images, scale, ratio, hflip, generator):
    batch = images.shape[0]
    area = _old_uniform(scale[0], scale[1], batch, generator)
    log_ratio = _old_uniform(math.log(ratio[0]), math.log(ratio[1]), batch, generator)
    aspect = torch.exp(log_ratio)
    width = torch.sqrt(area * aspect).clamp(max=1.0)
    height = torch.sqrt(area / aspect).clamp(max=1.0)
    center_x = (torch.rand(batch, generator=generator) * 2 - 1) * (1 - width)
    center_y = (torch.rand(batch, generator=generator) * 2 - 1) * (1 - height)
    sign = torch.ones(batch)
    if hflip:
        sign = torch.where(torch.rand(batch, generator=generator) < 0.5, -1.0, 1.0)
    theta = torch.zeros(batch, 2, 3)
    theta[:, 0, 0] = width * sign
    theta[:, 0, 2] = center_x
    theta[:, 1, 1] = height
    theta[:, 1, 2] = center_y
    theta = theta.to(images.device, images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def _old_color_jitter(*, images, strength, generator):
    if strength <= 0:
        return images
    batch = images.shape[0]

    def factors():
        return _old_uniform(1 - strength, 1 + strength, batch, generator).to(images.device).view(-1, 1, 1, 1)

    images = images * factors()
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    images = (images - mean) * factors() + mean
    grey = images.mean(dim=1, keepdim=True)
    images = (images - grey) * factors() + grey
    return images.clamp(0, 1)


def _old_two_views(images_uint8, generator, *, crop_scale, crop_ratio, hflip, color_jitter):
    images = images_uint8.float().div_(255.0)

    def view():
        out = _old_random_resized_crop(images=images, scale=tuple(crop_scale), ratio=tuple(crop_ratio), hflip=hflip,
                                       generator=generator)
        return _old_color_jitter(images=out, strength=color_jitter, generator=generator)

    return view(), view()


def _batch(n=8, channels=3, side=16, seed=0):
    return torch.randint(0, 256, (n, channels, side, side), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)


ALL_ON = dict(crop_scale=(0.08, 1.0), crop_ratio=(0.75, 4 / 3), hflip=True, color_jitter=0.4, color_jitter_p=0.8,
              color_jitter_hue=0.1, grayscale_p=0.3, blur_p=(1.0, 0.5), blur_kernel_fraction=0.25,
              blur_sigma=(0.1, 2.0), solarize_p=(0.0, 0.5))


@pytest.mark.parametrize("overrides", [{}, {"hflip": True}, {"hflip": True, "color_jitter": 0.4},
                                       {"crop_scale": (0.08, 1.0), "color_jitter": 0.8}])
def test_default_pipeline_is_bitwise_the_first_versions(overrides):
    config = AugmentConfig(**overrides)
    images = _batch(channels=4 if overrides.get("color_jitter") == 0.8 else 3)
    new_gen, old_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    new = TwoViewAugment(**config.model_dump())(images, new_gen)
    old = _old_two_views(images, old_gen, **{k: getattr(config, k) for k in ("crop_scale", "crop_ratio", "hflip",
                                                                             "color_jitter")})
    for a, b in zip(new, old):
        assert torch.equal(a, b)
    assert torch.equal(new_gen.get_state(), old_gen.get_state())  # the same number of draws


@pytest.mark.parametrize("settings", [dict(crop_scale=(0.2, 1.0), crop_ratio=(0.75, 4 / 3), hflip=True,
                                           color_jitter=0.0), ALL_ON])
def test_a_global_batch_split_over_two_ranks_equals_one_process(settings):
    images = _batch(8, side=32)
    augment = TwoViewAugment(**settings)
    whole = augment(images, torch.Generator().manual_seed(3))
    parts, states = [], []
    for offset in (0, 4):
        gen = torch.Generator().manual_seed(3)  # every rank holds the same generator state
        parts.append(augment(images[offset:offset + 4], gen, global_batch=8, offset=offset))
        states.append(gen.get_state())
    for view in (0, 1):
        joined = torch.cat([parts[0][view], parts[1][view]])
        if settings is ALL_ON:  # the blur's grouped conv runs over different sample sets: allow the last bit
            torch.testing.assert_close(joined, whole[view], rtol=0, atol=1e-6)
        else:
            assert torch.equal(joined, whole[view])
    assert torch.equal(states[0], states[1])  # ranks stay in step
    with pytest.raises(ValueError, match="global batch"):
        augment(images[:4], torch.Generator(), global_batch=6, offset=4)


def test_all_ops_on_keep_range_shape_and_are_seeded():
    images = _batch(8, side=32)
    augment = TwoViewAugment(**AugmentConfig(**ALL_ON).model_dump())
    v1, v2 = augment(images, torch.Generator().manual_seed(0))
    w1, w2 = augment(images, torch.Generator().manual_seed(0))
    assert v1.shape == v2.shape == (8, 3, 32, 32) and torch.equal(v1, w1) and torch.equal(v2, w2)
    assert v1.min() >= 0 and v1.max() <= 1 and v2.min() >= 0 and v2.max() <= 1


def test_every_host_draw_goes_to_the_device_without_waiting(monkeypatch):
    """Each view's parameters are drawn on the host (keyed generators) and copied to the batch's device; a blocking
    copy to a GPU synchronises the stream, so every such copy is non_blocking (counted on CPU, where the same
    calls run), and no tensor is made on the device from a Python list."""
    copies, real_to = [], torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        if any(isinstance(a, torch.device) for a in args) or "device" in kwargs:
            copies.append(kwargs.get("non_blocking", False))
        return real_to(self, *args, **kwargs)

    real_tensor = torch.tensor
    made_on_device = []
    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made_on_device.append(k.get("device")) or real_tensor(*a, **k))
    augment = TwoViewAugment(**AugmentConfig(**ALL_ON).model_dump())
    augment(_batch(8, side=32), torch.Generator().manual_seed(0))
    assert len(copies) >= 8 and all(copies)
    assert all(device is None for device in made_on_device)


def _full(images, **kwargs):
    return {"images": images, "generator": torch.Generator().manual_seed(0), **kwargs}


def test_each_op_off_is_the_identity_and_draws_nothing():
    images = torch.rand(4, 3, 16, 16)
    ops = [lambda **k: color_jitter(strength=0.0, **k), lambda **k: color_jitter(strength=0.4, hue=0.1, p=0.0, **k),
           lambda **k: random_grayscale(p=0.0, **k), lambda **k: solarize(p=0.0, **k),
           lambda **k: gaussian_blur(p=0.0, kernel_fraction=0.2, sigma=(0.1, 2.0), **k)]
    for op in ops:
        gen = torch.Generator().manual_seed(0)
        assert torch.equal(op(images=images, generator=gen), images)
        assert torch.equal(gen.get_state(), torch.Generator().manual_seed(0).get_state())
    # The whole pipeline with a full-image crop and every op off.
    augment = TwoViewAugment(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip=False, color_jitter=0.0)
    uint8 = _batch(4)
    for view in augment(uint8, torch.Generator().manual_seed(0)):
        torch.testing.assert_close(view, uint8.float() / 255, rtol=0, atol=1e-5)


def test_grayscale_gives_equal_channels_of_luma():
    images = torch.rand(6, 3, 8, 8)
    out = random_grayscale(**_full(images, p=1.0))
    luma = 0.2989 * images[:, 0] + 0.587 * images[:, 1] + 0.114 * images[:, 2]
    for c in range(3):
        torch.testing.assert_close(out[:, c], luma)
    torch.testing.assert_close(out, TF.rgb_to_grayscale(images, num_output_channels=3))
    four = torch.rand(2, 4, 8, 8)  # CIFAR-MNIST: the channel mean
    torch.testing.assert_close(random_grayscale(**_full(four, p=1.0)), four.mean(dim=1, keepdim=True).expand_as(four))
    # p = 0.5: each sample is either untouched or grey.
    out = random_grayscale(**_full(torch.rand(64, 3, 4, 4), p=0.5))
    grey = (out[:, 0] == out[:, 1]).flatten(1).all(1) & (out[:, 1] == out[:, 2]).flatten(1).all(1)
    assert 10 < int(grey.sum()) < 54


def test_solarize_closed_form():
    images = torch.linspace(0, 1, 2 * 3 * 5 * 5).view(2, 3, 5, 5)
    out = solarize(**_full(images, p=1.0))
    assert torch.equal(out, torch.where(images >= 0.5, 1 - images, images))
    assert out.max() <= 0.5
    assert torch.equal(solarize(**_full(images, p=1.0)), TF.solarize(images, threshold=0.5))


def test_blur_of_a_constant_image_is_constant_and_of_an_impulse_is_the_kernel():
    constant = torch.full((3, 3, 32, 32), 0.3)
    torch.testing.assert_close(gaussian_blur(**_full(constant, p=1.0, kernel_fraction=0.5, sigma=(0.1, 2.0))),
                               constant)
    # One sample, sigma fixed: an impulse in the middle becomes the outer product of the 1-D kernel.
    impulse = torch.zeros(1, 1, 32, 32)
    impulse[0, 0, 16, 16] = 1.0
    out = gaussian_blur(**_full(impulse, p=1.0, kernel_fraction=0.25, sigma=(1.5, 1.5)))
    radius = blur_radius(side=32, kernel_fraction=0.25)
    assert radius == 4
    kernel = gaussian_kernels(torch.tensor([1.5], dtype=torch.float64), radius)[0].float()
    expected = torch.zeros(32, 32)
    expected[12:21, 12:21] = torch.outer(kernel, kernel)
    torch.testing.assert_close(out[0, 0], expected)
    torch.testing.assert_close(kernel, torch.exp(-torch.arange(-4, 5.0) ** 2 / (2 * 1.5 ** 2)) /
                               torch.exp(-torch.arange(-4, 5.0) ** 2 / (2 * 1.5 ** 2)).sum())
    # SimCLR's size: 10 % of the side, odd: 23 taps at 224 px, 3 at 32 px.
    assert 2 * blur_radius(side=224, kernel_fraction=0.1) + 1 == 23 and blur_radius(side=32, kernel_fraction=0.1) == 1


def test_blur_per_sample_sigma_and_probability():
    images = torch.rand(16, 3, 32, 32)
    gen = torch.Generator().manual_seed(5)
    out = gaussian_blur(images=images, p=0.5, kernel_fraction=0.2, sigma=(0.5, 2.0), generator=gen)
    replay = torch.Generator().manual_seed(5)
    applied = torch.rand(16, generator=replay) < 0.5
    sigmas = 0.5 + 1.5 * torch.rand(16, generator=replay)
    assert 0 < int(applied.sum()) < 16
    for i in range(16):
        if not applied[i]:
            assert torch.equal(out[i], images[i])
        else:  # torchvision's blur with this sample's sigma and the same taps
            taps = 2 * blur_radius(side=32, kernel_fraction=0.2) + 1
            reference = TF.gaussian_blur(images[i], kernel_size=[taps, taps], sigma=[float(sigmas[i])] * 2)
            torch.testing.assert_close(out[i], reference, rtol=1e-4, atol=1e-5)


def test_hue_matches_torchvision_per_sample():
    images = torch.rand(5, 3, 8, 8)
    shifts = torch.tensor([-0.5, -0.1, 0.0, 0.25, 0.5])
    out = adjust_hue(images, shifts)
    for i in range(5):
        torch.testing.assert_close(out[i], TF.adjust_hue(images[i], float(shifts[i])), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="color_jitter_hue=0"):
        adjust_hue(torch.rand(1, 4, 4, 4), torch.zeros(1))


def test_color_jitter_probability_leaves_the_other_samples_untouched():
    images = torch.rand(32, 3, 8, 8)
    out = color_jitter(**_full(images, strength=0.4, hue=0.1, p=0.5))
    untouched = (out == images).flatten(1).all(1)
    assert 5 < int(untouched.sum()) < 27
    # Hue alone (no brightness / contrast / saturation): brightness (value) and saturation are kept.
    hue_only = color_jitter(**_full(images, strength=0.0, hue=0.3))
    torch.testing.assert_close(hue_only.amax(dim=1), images.amax(dim=1), rtol=1e-5, atol=1e-5)


def test_augment_config_defaults_keep_the_content_key_and_bad_values_name_the_fix():
    assert AugmentConfig().content() == {"crop_scale": [0.25, 1.0], "crop_ratio": [0.75, 4 / 3], "hflip": False,
                                         "color_jitter": 0.0}
    assert AugmentConfig(blur_p=[0.5, 0.5]).blur_p == 0.5
    assert AugmentConfig(solarize_p=[0.0, 0.2]).content()["solarize_p"] == [0.0, 0.2]
    for override, fix in [("augment.blur_p=1.5", "probability in"), ("augment.blur_sigma=[2.0, 0.1]", "low <= high"),
                          ("augment.color_jitter_hue=0.7", "less than or equal to 0.5"),
                          ("augment.grayscale_p=-0.1", "greater than or equal to 0")]:
        with pytest.raises(ConfigError, match=fix):
            load_config("trifeature_tiny", [override])
