"""Batched augmentations that run as a few tensor ops per batch (no per-image Python loop).

All randomness comes from an explicit ``torch.Generator`` so a resumed run draws exactly the crops an
uninterrupted run would have drawn (the generator state is part of the checkpoint).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _uniform(low: float, high: float, size: int, generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(size, generator=generator)


def _rows(draws: torch.Tensor, rows: slice | None) -> torch.Tensor:
    """This rank's rows of per-sample draws made for the whole global batch."""
    return draws if rows is None else draws[rows]


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
    theta = theta.to(images.device, images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def color_jitter(*, images: torch.Tensor, strength: float, generator: torch.Generator,
                 global_batch: int | None = None, rows: slice | None = None) -> torch.Tensor:
    """Per-sample brightness, contrast and saturation factors in [1 - strength, 1 + strength].

    images: (B, 3, H, W) in [0, 1]. Off by default: on Trifeature it destroys the colour attribute.
    """
    if strength <= 0:
        return images
    batch = images.shape[0] if global_batch is None else global_batch

    def factors() -> torch.Tensor:
        drawn = _rows(_uniform(1 - strength, 1 + strength, batch, generator), rows)
        return drawn.to(images.device).view(-1, 1, 1, 1)

    images = images * factors()
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    images = (images - mean) * factors() + mean
    grey = images.mean(dim=1, keepdim=True)
    images = (images - grey) * factors() + grey
    return images.clamp(0, 1)


class TwoViewAugment:
    """Turns a uint8 batch (B, 3, H, W) into two independently augmented float views, each (B, 3, H, W)."""

    def __init__(self, *, crop_scale: tuple[float, float], crop_ratio: tuple[float, float], hflip: bool,
                 color_jitter: float):
        self.crop_scale = tuple(crop_scale)
        self.crop_ratio = tuple(crop_ratio)
        self.hflip = hflip
        self.color_jitter = color_jitter

    def view(self, images: torch.Tensor, generator: torch.Generator, *, global_batch: int | None = None,
             rows: slice | None = None) -> torch.Tensor:
        part = {"global_batch": global_batch, "rows": rows}
        out = random_resized_crop(images=images, scale=self.crop_scale, ratio=self.crop_ratio, hflip=self.hflip,
                                  generator=generator, **part)
        return color_jitter(images=out, strength=self.color_jitter, generator=generator, **part)

    def __call__(self, images_uint8: torch.Tensor, generator: torch.Generator, *, global_batch: int | None = None,
                 offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 (b, C, H, W) -> two float views. global_batch / offset: these b samples are rows
        [offset, offset + b) of a global batch of ``global_batch`` (every rank draws for all of it)."""
        images = images_uint8.float().div_(255.0)
        rows = None if global_batch is None else slice(offset, offset + images.shape[0])
        return (self.view(images, generator, global_batch=global_batch, rows=rows),
                self.view(images, generator, global_batch=global_batch, rows=rows))


def to_float(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float (B, 3, H, W) in [0, 1], the encoder's input range (evaluation path)."""
    return images_uint8.float().div_(255.0)
