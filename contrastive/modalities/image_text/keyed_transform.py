"""Training transforms whose randomness is a function of (seed, epoch, sample key) only.

open_clip's train transform draws its crop (and any colour jitter or grayscale) from torch's and Python's global
generators, so which augmentation a sample gets depends on how many processes read the data, how many decode
threads run and in which order they finish. Drawing per sample from ``(seed, epoch, key)`` makes a stage's batches
the same whatever the number of processes (a 2-rank run equals a 1-process run with the same global batch) and
makes decode workers (``data.decode_workers``) and resumption exact.

Every random op draws its parameters from a per-sample counter-based generator and applies them through
torchvision's functional API, so decoders run in parallel and never touch the global generators (which the
training thread keeps drawing from). The random ops known here are torchvision's RandomResizedCrop, flips,
ColorJitter, RandomGrayscale, GaussianBlur, RandomSolarize and RandomApply, and open_clip's ``color_jitter`` and
``gray_scale``; a composition holding any other random op is refused when the transform is built.
"""
from __future__ import annotations

import math
import zlib
from typing import Callable

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as F

from contrastive.errors import ConfigError

# Ops whose output depends only on their input: torchvision's and open_clip's deterministic ones.
_DETERMINISTIC = (T.ToTensor, T.Normalize, T.Resize, T.CenterCrop, T.PILToTensor, T.ConvertImageDtype, T.Lambda,
                  T.Grayscale)
_DETERMINISTIC_NAMES = {"_convert_to_rgb", "MaybeConvertMode", "MaybeToTensor", "ResizeKeepRatio",
                        "CenterCropOrPad"}
# open_clip's random ops (open_clip/transform.py): ``p`` and the torchvision op ``transf`` they apply with it.
_OPEN_CLIP_RANDOM = {"color_jitter", "gray_scale"}
_RANDOM = (T.RandomResizedCrop, T.RandomHorizontalFlip, T.RandomVerticalFlip, T.RandomGrayscale, T.ColorJitter,
           T.GaussianBlur, T.RandomSolarize, T.RandomApply, T.Compose)


def _name(op) -> str:
    return getattr(op, "__name__", None) or type(op).__name__


def _is_deterministic(op) -> bool:
    return isinstance(op, _DETERMINISTIC) or _name(op) in _DETERMINISTIC_NAMES


def check_ops(ops) -> None:
    """Raise ConfigError naming the first op whose randomness this module cannot draw per sample."""
    for op in ops:
        if isinstance(op, (T.RandomApply, T.Compose)):
            check_ops(op.transforms)
        elif not (_is_deterministic(op) or isinstance(op, _RANDOM) or _name(op) in _OPEN_CLIP_RANDOM):
            raise ConfigError(
                f"the CLIP training transform holds {_name(op)}, whose random draws cannot be keyed per sample (it "
                "would draw from torch's global generator, in decode workers, in any order): use the augmentations "
                "open_clip's aug_cfg offers (crop scale, colour jitter, grayscale) or add the op to "
                "contrastive/modalities/image_text/keyed_transform.py")


def sample_generator(*, seed: int, epoch: int, key: str) -> np.random.Generator:
    """A counter-based (Philox) generator keyed by (seed, epoch, crc32(key)): an independent stream per sample and
    epoch, made in microseconds (no seed hashing), the same on every process and thread."""
    crc = zlib.crc32(key.encode("utf-8"))
    return np.random.Generator(np.random.Philox(key=[seed % 2**64, ((epoch % 2**32) << 32) | crc]))


def crop_box(*, height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
             generator: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random resized crop: area fraction ~ U(scale), log aspect ratio ~ U(log ratio),
    10 tries, then the largest centre crop within ``ratio`` (the algorithm of Szegedy et al. / torchvision)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * generator.uniform(scale[0], scale[1])
        aspect = math.exp(generator.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(generator.integers(0, height - h + 1)), int(generator.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class KeyedTransform:
    """``transform(image, key)``: the composition ``transform`` with per-sample randomness (see the module doc).

    transform: a ``torchvision.transforms.Compose`` (open_clip's train transform) or one op.
    uint8: when the composition ends with ToTensor + Normalize (open_clip's does), stop before them and return the
        uint8 (C, H, W) image; :attr:`normalization` then holds (mean, std) for :func:`normalize_batch`, which gives
        the same floats bit for bit for a whole batch (on the GPU, in the step). Otherwise the float image, and
        :attr:`normalization` is None.

    Raises:
        ConfigError: the composition holds a random op whose draws this module does not know.
    """

    def __init__(self, transform: Callable, *, seed: int, epoch: int, uint8: bool = False):
        self.ops = list(transform.transforms) if isinstance(transform, T.Compose) else [transform]
        check_ops(self.ops)
        self.seed, self.epoch = seed, epoch
        self.normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None
        if uint8 and _ends_with_normalized_tensor(self.ops):
            normalize = self.ops[-1]
            self.normalization = (tuple(float(m) for m in normalize.mean), tuple(float(s) for s in normalize.std))
            self.ops = self.ops[:-2]

    def __call__(self, image: Image.Image, key: str):
        generator = sample_generator(seed=self.seed, epoch=self.epoch, key=key)
        out = apply_keyed(self.ops, image, generator=generator)
        return out if self.normalization is None else _uint8_chw(out)


def _ends_with_normalized_tensor(ops) -> bool:
    """The last two ops are ToTensor (torchvision's or open_clip's MaybeToTensor) and an out-of-place Normalize."""
    return (len(ops) >= 2 and (isinstance(ops[-2], T.ToTensor) or _name(ops[-2]) == "MaybeToTensor")
            and isinstance(ops[-1], T.Normalize) and not ops[-1].inplace)


def _uint8_chw(image) -> torch.Tensor:
    """A PIL image (what the ops before ToTensor leave) as uint8 (C, H, W), the values ToTensor would scale."""
    if not isinstance(image, Image.Image):
        raise ConfigError(f"the CLIP training transform gives {type(image).__name__} before ToTensor, not a PIL "
                          "image: its uint8 batches need PIL ops first")
    array = np.array(image, dtype=np.uint8)
    return torch.from_numpy(array[:, :, None] if array.ndim == 2 else array).permute(2, 0, 1)


def normalize_batch(images: torch.Tensor, normalization: tuple[tuple[float, ...], tuple[float, ...]]) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float32 ``(x / 255 - mean) / std`` per channel: torchvision's ToTensor then Normalize,
    the same operations in the same order, so the same floats as the per-sample transform, on any device."""
    # built on the host and copied without waiting: a tensor made on the GPU from a list is a blocking copy
    mean, std = (torch.as_tensor(v, dtype=torch.float32).to(images.device, non_blocking=True).view(1, -1, 1, 1)
                 for v in normalization)
    return images.to(torch.float32).div_(255).sub_(mean).div_(std)


def apply_keyed(ops, image, *, generator: np.random.Generator):
    """Apply ``ops`` in order, every random parameter drawn from ``generator`` (draw order = op order)."""
    out = image
    for op in ops:
        out = _apply_op(op, out, generator=generator)
    return out


def _apply_op(op, image, *, generator: np.random.Generator):
    """One op with its random parameters drawn from ``generator``: torchvision's distributions and order of
    application, its functional ops."""
    if _is_deterministic(op):
        return op(image)
    if isinstance(op, T.Compose):
        return apply_keyed(op.transforms, image, generator=generator)
    if isinstance(op, T.RandomResizedCrop):
        width, height = F.get_image_size(image)
        top, left, h, w = crop_box(height=height, width=width, scale=op.scale, ratio=op.ratio, generator=generator)
        return F.resized_crop(image, top, left, h, w, op.size, op.interpolation, antialias=op.antialias)
    if isinstance(op, T.ColorJitter):
        return color_jitter(image, op=op, generator=generator)
    if isinstance(op, T.GaussianBlur):
        sigma = float(generator.uniform(op.sigma[0], op.sigma[1]))
        return F.gaussian_blur(image, op.kernel_size, [sigma, sigma])
    # The rest apply with a probability: one uniform draw each, whether it fires or not.
    fires = bool(generator.random() < op.p)
    if isinstance(op, T.RandomApply):
        return apply_keyed(op.transforms, image, generator=generator) if fires else image
    if not fires:
        return image
    if isinstance(op, T.RandomHorizontalFlip):
        return F.hflip(image)
    if isinstance(op, T.RandomVerticalFlip):
        return F.vflip(image)
    if isinstance(op, T.RandomGrayscale):
        channels, _, _ = F.get_dimensions(image)
        return F.rgb_to_grayscale(image, num_output_channels=channels)
    if isinstance(op, T.RandomSolarize):
        return F.solarize(image, op.threshold)
    if _name(op) == "color_jitter":  # open_clip: ColorJitter with probability p
        return color_jitter(image, op=op.transf, generator=generator)
    if _name(op) == "gray_scale":  # open_clip: Grayscale(3) with probability p
        return op.transf(image)
    raise ConfigError(f"no keyed draw for {_name(op)}")  # check_ops refused it already


def color_jitter(image, *, op: T.ColorJitter, generator: np.random.Generator):
    """torchvision's ColorJitter: the four adjustments in a random order, each factor ~ U(its range)."""
    factors = [None if bounds is None else float(generator.uniform(bounds[0], bounds[1]))
               for bounds in (op.brightness, op.contrast, op.saturation, op.hue)]
    adjust = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    for index in generator.permutation(4):
        if factors[index] is not None:
            image = adjust[index](image, factors[index])
    return image
