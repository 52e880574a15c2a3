"""Batched augmentations that run as a few tensor ops per batch (no per-image Python loop).

All randomness comes from an explicit ``torch.Generator`` so a resumed run draws exactly the crops an
uninterrupted run would have drawn (the generator state is part of the checkpoint). Parameters are drawn on the
CPU and applied as tensor ops to the batch on whatever device it is on.

Distributed training: each rank holds rows ``[offset, offset + b)`` of a global batch. With ``global_batch`` every
random draw is made for all ``global_batch`` samples and only this rank's rows are applied, so ranks that share the
generator state augment their slices exactly as one process would augment the whole batch.

Per view, in this order (SimCLR / BYOL): random resized crop (+ horizontal flip), colour jitter (brightness,
contrast, saturation, then hue; with probability ``color_jitter_p``), random grayscale, Gaussian blur, solarize.
An op that is off draws nothing, so adding ops that are off leaves every other draw where it was.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

SOLARIZE_THRESHOLD = 0.5
# ITU-R 601 luma, as torchvision's rgb_to_grayscale.
LUMA = (0.2989, 0.587, 0.114)


def _on_device(drawn: torch.Tensor, images: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A host-drawn parameter tensor on ``images``' device (in ``dtype``, if given) without waiting: a blocking
    host -> GPU copy synchronises the stream (the CPU waits for the previous step's kernels), ~10 times a view; a
    pageable source is staged before the call returns, so the draw may be freed at once."""
    return drawn.to(images.device, dtype, non_blocking=True)


def _uniform(low: float, high: float, size: int, generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(size, generator=generator)


def _rows(draws: torch.Tensor, rows: slice | None) -> torch.Tensor:
    """This rank's rows of per-sample draws made for the whole global batch."""
    return draws if rows is None else draws[rows]


def _applied(p: float, batch: int, generator: torch.Generator, rows: slice | None) -> torch.Tensor | None:
    """Which of this rank's samples an op with probability ``p`` applies to (CPU bool, one draw per sample of the
    global batch); None when p >= 1 (all of them, and nothing is drawn)."""
    if p >= 1:
        return None
    return _rows(torch.rand(batch, generator=generator) < p, rows)


def _where(applied: torch.Tensor | None, changed: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    if applied is None:
        return changed
    return torch.where(_on_device(applied, images).view(-1, 1, 1, 1), changed, images)


def random_resized_crop(*, images: torch.Tensor, scale: tuple[float, float], ratio: tuple[float, float],
                        hflip: bool, generator: torch.Generator, global_batch: int | None = None,
                        rows: slice | None = None) -> torch.Tensor:
    """Inception-style random resized crop for a whole batch via one affine ``grid_sample``.

    images: (B, C, H, W) float. Each sample gets a crop covering a fraction ``scale`` of the image area with
    aspect ratio in ``ratio`` (log-uniform), resized back to (H, W) bilinearly; with ``hflip`` half are mirrored.
    Returns (B, C, H, W). With ``global_batch`` every draw is made for that many samples and ``rows`` of them are
    applied (DDP: each rank augments its slice of the global batch exactly as one process would).
    """
    batch = images.shape[0] if global_batch is None else global_batch
    area = _uniform(scale[0], scale[1], batch, generator)
    log_ratio = _uniform(math.log(ratio[0]), math.log(ratio[1]), batch, generator)
    aspect = torch.exp(log_ratio)
    # Width/height as fractions of the image side; clamp keeps the crop inside the image.
    width = torch.sqrt(area * aspect).clamp(max=1.0)
    height = torch.sqrt(area / aspect).clamp(max=1.0)
    # Normalised coordinates span [-1, 1]: a crop of fractional width w can be centred in [-(1 - w), 1 - w].
    center_x = (torch.rand(batch, generator=generator) * 2 - 1) * (1 - width)
    center_y = (torch.rand(batch, generator=generator) * 2 - 1) * (1 - height)
    sign = torch.ones(batch)
    if hflip:
        sign = torch.where(torch.rand(batch, generator=generator) < 0.5, -1.0, 1.0)
    width, height, center_x, center_y, sign = (_rows(v, rows) for v in (width, height, center_x, center_y, sign))
    theta = torch.zeros(images.shape[0], 2, 3)
    theta[:, 0, 0] = width * sign
    theta[:, 0, 2] = center_x
    theta[:, 1, 1] = height
    theta[:, 1, 2] = center_y
    theta = _on_device(theta, images, dtype=images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def rgb_to_hsv(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) RGB in [0, 1] -> HSV with hue in [0, 1) (torchvision's tensor algorithm, batched)."""
    r, g, b = images.unbind(dim=1)
    maxc, minc = images.amax(dim=1), images.amin(dim=1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eqc, ones, maxc)
    divisor = torch.where(eqc, ones, cr)
    rc, gc, bc = (maxc - r) / divisor, (maxc - g) / divisor, (maxc - b) / divisor
    h = (maxc == r) * (bc - gc) + ((maxc == g) & (maxc != r)) * (2.0 + rc - bc) \
        + ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    h = torch.fmod(h / 6.0 + 1.0, 1.0)
    return torch.stack((h, s, maxc), dim=1)


def hsv_to_rgb(images: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`: (B, 3, H, W) HSV -> RGB."""
    h, s, v = images.unbind(dim=1)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int32) % 6
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * f)).clamp(0.0, 1.0)
    t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0)
    sector = (i.unsqueeze(1) == torch.arange(6, device=i.device).view(1, -1, 1, 1)).to(images.dtype)  # (B,6,H,W)
    table = torch.stack((torch.stack((v, q, p, p, t, v), dim=1), torch.stack((t, v, v, q, p, p), dim=1),
                         torch.stack((p, p, t, v, v, q), dim=1)), dim=1)  # (B, 3, 6, H, W)
    return torch.einsum("bihw,bcihw->bchw", sector, table)


def adjust_hue(images: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate each sample's hue by ``shift`` (B,) turns (torchvision's hue factor, in [-0.5, 0.5]).
    images: (B, 3, H, W) RGB in [0, 1]."""
    if images.shape[1] != 3:
        raise ValueError(f"hue jitter needs RGB images (3 channels), got {images.shape[1]}: set "
                         "augment.color_jitter_hue=0")
    hsv = rgb_to_hsv(images)
    hue = torch.remainder(hsv[:, 0] + _on_device(shift, images, dtype=images.dtype).view(-1, 1, 1), 1.0)
    return hsv_to_rgb(torch.stack((hue, hsv[:, 1], hsv[:, 2]), dim=1))


def color_jitter(*, images: torch.Tensor, strength: float, generator: torch.Generator,
                 global_batch: int | None = None, rows: slice | None = None, hue: float = 0.0,
                 p: float = 1.0) -> torch.Tensor:
    """Per-sample brightness, contrast and saturation factors in [1 - strength, 1 + strength] (in that order),
    then with ``hue`` > 0 a hue rotation in [-hue, hue]; the whole jitter applies to a sample with probability p.

    images: (B, C, H, W) in [0, 1]; contrast and saturation blend towards the mean over all channels (and
    pixels), hue needs C = 3. Off by default: on Trifeature it destroys the colour attribute. Draws: the
    application mask (p < 1 only), the three factors (strength > 0), the hue shifts (hue > 0).
    """
    if (strength <= 0 and hue <= 0) or p <= 0:
        return images
    batch = images.shape[0] if global_batch is None else global_batch
    applied = _applied(p, batch, generator, rows)
    original = images

    def factors() -> torch.Tensor:
        drawn = _rows(_uniform(1 - strength, 1 + strength, batch, generator), rows)
        return _on_device(drawn, images).view(-1, 1, 1, 1)

    if strength > 0:
        images = images * factors()
        mean = images.mean(dim=(1, 2, 3), keepdim=True)
        images = (images - mean) * factors() + mean
        grey = images.mean(dim=1, keepdim=True)
        images = (images - grey) * factors() + grey
        images = images.clamp(0, 1)
    if hue > 0:
        images = adjust_hue(images, _rows(_uniform(-hue, hue, batch, generator), rows))
    return _where(applied, images, original)


def random_grayscale(*, images: torch.Tensor, p: float, generator: torch.Generator,
                     global_batch: int | None = None, rows: slice | None = None) -> torch.Tensor:
    """With probability p a sample becomes grey: every channel = luma 0.2989 R + 0.587 G + 0.114 B (3 channels)
    or the channel mean (other channel counts). images: (B, C, H, W); returns (B, C, H, W)."""
    if p <= 0:
        return images
    batch = images.shape[0] if global_batch is None else global_batch
    applied = _applied(p, batch, generator, rows)
    if images.shape[1] == 3:
        weights = _on_device(torch.tensor(LUMA), images, dtype=images.dtype).view(1, 3, 1, 1)
        grey = (images * weights).sum(dim=1, keepdim=True)
    else:
        grey = images.mean(dim=1, keepdim=True)
    return _where(applied, grey.expand_as(images), images)


def blur_radius(*, side: int, kernel_fraction: float) -> int:
    """SimCLR's kernel: size = kernel_fraction x image side (10 %), radius = size // 2, taps = 2 radius + 1
    (224 px: 23 taps; 32 px: 3 taps)."""
    return int(side * kernel_fraction) // 2


def gaussian_kernels(sigma: torch.Tensor, radius: int) -> torch.Tensor:
    """(n,) standard deviations in pixels -> (n, 2 radius + 1) normalised 1-D Gaussian kernels."""
    x = torch.arange(-radius, radius + 1, dtype=sigma.dtype)
    kernels = torch.exp(-x.square().view(1, -1) / (2 * sigma.view(-1, 1).square()))
    return kernels / kernels.sum(dim=1, keepdim=True)


def gaussian_blur(*, images: torch.Tensor, p: float, kernel_fraction: float, sigma: tuple[float, float],
                  generator: torch.Generator, global_batch: int | None = None,
                  rows: slice | None = None) -> torch.Tensor:
    """With probability p a sample is blurred by a Gaussian with its own sigma ~ U(sigma) pixels: a separable
    depthwise convolution (horizontal then vertical pass, reflect padding) over the chosen samples only.
    images: (B, C, H, W); returns (B, C, H, W). Draws: the mask (p < 1), then one sigma per sample."""
    if p <= 0:
        return images
    batch = images.shape[0] if global_batch is None else global_batch
    applied = _applied(p, batch, generator, rows)
    sigmas = _rows(_uniform(sigma[0], sigma[1], batch, generator), rows)
    n, channels, height, width = images.shape
    radius = blur_radius(side=min(height, width), kernel_fraction=kernel_fraction)
    if radius == 0:
        return images
    index = torch.arange(n) if applied is None else applied.nonzero().flatten()
    if index.numel() == 0:
        return images
    chosen = images if applied is None else images[_on_device(index, images)]
    kernels = _on_device(gaussian_kernels(sigmas[index].double(), radius), images, dtype=images.dtype)
    kernels = kernels.repeat_interleave(channels, dim=0)  # (m * C, taps): one per sample and channel
    planes = chosen.reshape(1, -1, height, width)
    groups = planes.shape[1]
    planes = F.conv2d(F.pad(planes, (radius, radius, 0, 0), mode="reflect"), kernels.view(groups, 1, 1, -1),
                      groups=groups)
    planes = F.conv2d(F.pad(planes, (0, 0, radius, radius), mode="reflect"), kernels.view(groups, 1, -1, 1),
                      groups=groups)
    blurred = planes.view(-1, channels, height, width)
    if applied is None:
        return blurred
    out = images.clone()
    out[_on_device(index, images)] = blurred
    return out


def solarize(*, images: torch.Tensor, p: float, generator: torch.Generator, global_batch: int | None = None,
             rows: slice | None = None, threshold: float = SOLARIZE_THRESHOLD) -> torch.Tensor:
    """With probability p a sample is solarized: x -> 1 - x where x >= threshold (0.5), x elsewhere."""
    if p <= 0:
        return images
    batch = images.shape[0] if global_batch is None else global_batch
    applied = _applied(p, batch, generator, rows)
    return _where(applied, torch.where(images >= threshold, 1.0 - images, images), images)


def _per_view(value: float | Sequence[float], name: str) -> tuple[float, float]:
    if isinstance(value, (int, float)):
        return float(value), float(value)
    pair = tuple(float(v) for v in value)
    if len(pair) != 2:
        raise ValueError(f"augment.{name} is one probability or one per view [view1, view2], got {value!r}")
    return pair


class TwoViewAugment:
    """Turns a uint8 batch (B, C, H, W) into two independently augmented float views, each (B, C, H, W).

    The keyword arguments are ``pipeline_config.schema.AugmentConfig``'s fields. ``blur_p`` and ``solarize_p``
    are one probability for both views or a pair (view 1, view 2), as BYOL's asymmetric views. Every op but the
    crop is off by default.

    Presets (values for the config's augment section):

    - SimCLR, ImageNet (Chen et al. 2020, appendix A; colour strength s = 0.5)::

        crop_scale: [0.08, 1.0]; crop_ratio: [0.75, 1.3333]; hflip: true
        color_jitter: 0.4; color_jitter_hue: 0.1; color_jitter_p: 0.8
        grayscale_p: 0.2; blur_p: 0.5; blur_kernel_fraction: 0.1; blur_sigma: [0.1, 2.0]; solarize_p: 0.0

    - BYOL (Grill et al. 2020, table 6): as SimCLR but asymmetric blur and solarize::

        blur_p: [1.0, 0.1]; solarize_p: [0.0, 0.2]

    - CIFAR-10 SimCLR: as the ImageNet set without blur (``blur_p: 0``), ``crop_scale: [0.08, 1.0]`` (or 0.2).

    Differences from torchvision's ColorJitter: the four jitter ops run in a fixed order (brightness, contrast,
    saturation, hue), the image is clamped once after the first three, and contrast / saturation blend towards
    the mean over all channels.
    """

    def __init__(self, *, crop_scale: tuple[float, float], crop_ratio: tuple[float, float], hflip: bool,
                 color_jitter: float, color_jitter_p: float = 1.0, color_jitter_hue: float = 0.0,
                 grayscale_p: float = 0.0, blur_p: float | Sequence[float] = 0.0, blur_kernel_fraction: float = 0.1,
                 blur_sigma: tuple[float, float] = (0.1, 2.0), solarize_p: float | Sequence[float] = 0.0):
        self.crop_scale = tuple(crop_scale)
        self.crop_ratio = tuple(crop_ratio)
        self.hflip = hflip
        self.color_jitter = color_jitter
        self.color_jitter_p = color_jitter_p
        self.color_jitter_hue = color_jitter_hue
        self.grayscale_p = grayscale_p
        self.blur_p = _per_view(blur_p, "blur_p")
        self.blur_kernel_fraction = blur_kernel_fraction
        self.blur_sigma = tuple(blur_sigma)
        self.solarize_p = _per_view(solarize_p, "solarize_p")

    def view(self, images: torch.Tensor, generator: torch.Generator, *, global_batch: int | None = None,
             rows: slice | None = None, index: int = 0) -> torch.Tensor:
        """One view (``index`` 0 or 1 picks the per-view probabilities) of float images (b, C, H, W)."""
        part = {"generator": generator, "global_batch": global_batch, "rows": rows}
        out = random_resized_crop(images=images, scale=self.crop_scale, ratio=self.crop_ratio, hflip=self.hflip,
                                  **part)
        out = color_jitter(images=out, strength=self.color_jitter, hue=self.color_jitter_hue, p=self.color_jitter_p,
                           **part)
        out = random_grayscale(images=out, p=self.grayscale_p, **part)
        out = gaussian_blur(images=out, p=self.blur_p[index], kernel_fraction=self.blur_kernel_fraction,
                            sigma=self.blur_sigma, **part)
        return solarize(images=out, p=self.solarize_p[index], **part)

    def __call__(self, images_uint8: torch.Tensor, generator: torch.Generator, *, global_batch: int | None = None,
                 offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 (b, C, H, W) -> two float views. global_batch / offset: these b samples are rows
        [offset, offset + b) of a global batch of ``global_batch`` (every rank draws for all of it)."""
        images = images_uint8.float().div_(255.0)
        if global_batch is not None and not 0 <= offset <= offset + images.shape[0] <= global_batch:
            raise ValueError(f"rows [{offset}, {offset + images.shape[0]}) are not inside the global batch of "
                             f"{global_batch}")
        rows = None if global_batch is None else slice(offset, offset + images.shape[0])
        return (self.view(images, generator, global_batch=global_batch, rows=rows, index=0),
                self.view(images, generator, global_batch=global_batch, rows=rows, index=1))
