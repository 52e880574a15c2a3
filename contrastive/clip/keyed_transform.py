"""Training transforms whose randomness is a function of (seed, epoch, sample key) only.

open_clip's train transform draws its crop (and any colour jitter or grayscale) from torch's global generator, so
which augmentation a sample gets depends on how many processes read the data, how many decode threads run and in
which order they finish. Drawing per sample from ``(seed, epoch, key)`` makes a stage's batches the same whatever
the number of processes (a 2-rank run equals a 1-process run with the same global batch) and makes decode threads
(``data.decode_workers``) and resumption exact.

The expensive random op, ``RandomResizedCrop`` (it resizes the full-size image), draws from a per-sample
counter-based generator and runs in parallel on the decode threads. Any other random op of the composition (colour
jitter, grayscale, flips: cheap, on the already-small crop) runs under one lock with the global generator seeded
from the same per-sample stream, because torchvision offers them no generator argument.
"""
from __future__ import annotations

import math
import random
import threading
import zlib
from typing import Callable

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import functional as F

# Ops whose output depends only on their input run unlocked: torchvision's and open_clip's deterministic ones.
# Any other op may draw random numbers (torchvision's from torch, open_clip's jitter and grayscale from Python's
# random module), so it runs locked with both generators seeded per sample.
_DETERMINISTIC = (T.ToTensor, T.Normalize, T.Resize, T.CenterCrop, T.PILToTensor, T.ConvertImageDtype, T.Lambda)
_DETERMINISTIC_NAMES = {"_convert_to_rgb", "MaybeConvertMode", "MaybeToTensor", "ResizeKeepRatio",
                        "CenterCropOrPad"}
_GLOBAL_RNG_LOCK = threading.Lock()


def _is_deterministic(op) -> bool:
    name = getattr(op, "__name__", None) or type(op).__name__
    return isinstance(op, _DETERMINISTIC) or name in _DETERMINISTIC_NAMES


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

    transform: a ``torchvision.transforms.Compose`` (open_clip's train transform) or any callable; a callable that
    is not a composition runs whole under the lock with the seeded global generator.
    """

    def __init__(self, transform: Callable, *, seed: int, epoch: int):
        self.ops = list(transform.transforms) if isinstance(transform, T.Compose) else [transform]
        self.seed, self.epoch = seed, epoch

    def __call__(self, image: Image.Image, key: str):
        generator = sample_generator(seed=self.seed, epoch=self.epoch, key=key)
        out = image
        for op in self.ops:
            if isinstance(op, T.RandomResizedCrop):
                width, height = F.get_image_size(out)
                top, left, h, w = crop_box(height=height, width=width, scale=op.scale, ratio=op.ratio,
                                           generator=generator)
                out = F.resized_crop(out, top, left, h, w, op.size, op.interpolation, antialias=op.antialias)
            elif _is_deterministic(op):
                out = op(out)
            else:
                out = _seeded_call(op, out, seed=int(generator.integers(0, 2**62)))
        return out


def _seeded_call(op: Callable, image, *, seed: int):
    """op(image) with torch's and Python's global generators seeded, then restored (one thread at a time)."""
    with _GLOBAL_RNG_LOCK:
        torch_state, python_state = torch.get_rng_state(), random.getstate()
        torch.manual_seed(seed)
        random.seed(seed)
        try:
            return op(image)
        finally:
            torch.set_rng_state(torch_state)
            random.setstate(python_state)
