"""The image modality's registered model: one stage's encoder on the CPU, and the images a user hands it.

What ``mlflow.pyfunc.load_model(...).predict(images)`` runs (through ``contrastive.modalities.image.modality``);
no Prefect or MLflow here. The images go through the export's own transform (pixels / 255 on the stage model's
``embed``: ``steps.embed_images``), so a served embedding equals the exported one of the same pixels.

Accepted inputs (uint8, C = the encoder's ``model.in_channels``: 1, 3 or 4):

* an array of images (n, H, W, C) or (n, C, H, W);
* one image (H, W, C) or (C, H, W), or (H, W) for a one-channel encoder;
* a list of such single images, or of PIL images (converted to L / RGB for one- / three-channel encoders), all of
  one size.

Which axis holds the channels is read from the shape: the one whose length is C. When both candidate axes are C
long (a 3 x 3 RGB image, say (n, 3, 3, 3)) the array is read as channels-last (n, H, W, C), the layout images come
in from PIL, OpenCV and imageio; pass a list of HWC images or transpose to be explicit.

Through ``mlflow.pyfunc``, MLflow checks the input against the model's signature (uint8, four axes) before this
code runs: there pass one array (n, H, W, C) or (n, C, H, W) (``numpy.stack(images)``, ``image[None]``), or a
one-axis object array of images (MLflow lets such "ragged" arrays through).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch



LAYOUTS = ("uint8 images (n, H, W, C) or (n, C, H, W), one image (H, W, C) or (C, H, W) ((H, W) for a one-channel "
           "encoder), or a list of such images or of PIL images, all of one size")

_PIL_MODES = {1: "L", 3: "RGB"}


@dataclass(frozen=True)
class ImageEncoder:
    """One stage's model (CPU, eval mode) and the number of channels its images have."""
    model: torch.nn.Module
    channels: int


def load_encoder(model_path: str) -> ImageEncoder:
    """The stage model in ``model_path`` (a ``model.pt`` written by training) on the CPU, ready for :func:`embed`."""
    from contrastive.modalities.image.steps import read_trained_model
    model, model_kwargs = read_trained_model(model_path=Path(model_path), device=torch.device("cpu"))
    return ImageEncoder(model=model, channels=int(model_kwargs.get("in_channels", 3)))


def embed(encoder: ImageEncoder, inputs: Any, *, batch_size: int = 256) -> np.ndarray:
    """float32 (n, D) embeddings of ``inputs`` (see the module docstring for what they may be)."""
    from contrastive.modalities.image.steps import embed_images
    images = as_nchw(inputs, channels=encoder.channels)
    return embed_images(encoder.model, torch.from_numpy(images), device=torch.device("cpu"), batch_size=batch_size)


def as_nchw(inputs: Any, *, channels: int) -> np.ndarray:
    """``inputs`` as a new uint8 array (n, C, H, W) in plain C order; ValueError naming the accepted layouts for
    anything else.

    Always a fresh array: an input's own strides (a transposed view, a read-only array from PIL, a size-1 axis with
    any stride) would otherwise reach torch, whose convolutions pick their kernels by memory layout, and the same
    pixels could embed differently in the last bits."""
    nchw = _as_nchw_view(inputs, channels=channels)
    out = np.empty(nchw.shape, dtype=np.uint8)
    out[...] = nchw
    return out


def _as_nchw_view(inputs: Any, *, channels: int) -> np.ndarray:
    if isinstance(inputs, np.ndarray) and inputs.dtype == object and inputs.ndim == 1:
        inputs = list(inputs)  # a "ragged" array of images: what MLflow's check lets through besides (n, ...) uint8
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise ValueError(f"no images to embed: pass {LAYOUTS}")
        images = [_one_image(image, channels=channels, position=i) for i, image in enumerate(inputs)]
        sizes = sorted({image.shape[1:] for image in images})
        if len(sizes) > 1:
            raise ValueError(f"the images differ in size ({', '.join(f'{h}x{w}' for h, w in sizes)}): resize them "
                             f"to one size; the encoder takes {LAYOUTS}")
        return np.stack(images)
    if _is_pil(inputs):
        return _one_image(inputs, channels=channels, position=None)[None]
    array = _uint8_array(inputs, what="the input")
    if array.ndim == 4:
        if array.shape[0] == 0:
            raise ValueError(f"no images to embed (shape {array.shape}): pass {LAYOUTS}")
        if array.shape[3] == channels:  # channels-last, also when shape[1] == channels too (module docstring)
            return array.transpose(0, 3, 1, 2)
        if array.shape[1] == channels:
            return array
        raise ValueError(_layout_error(array.shape, channels))
    if array.ndim in (2, 3):
        return _one_image(array, channels=channels, position=None)[None]
    raise ValueError(_layout_error(array.shape, channels))


def _one_image(image: Any, *, channels: int, position: int | None) -> np.ndarray:
    """One image (HWC, CHW, HW or PIL) as uint8 (C, H, W)."""
    what = "the input" if position is None else f"image {position} of the list"
    if _is_pil(image):
        if channels in _PIL_MODES:
            image = image.convert(_PIL_MODES[channels])
        elif len(image.getbands()) != channels:
            raise ValueError(f"{what} is a PIL image with bands {image.getbands()}, but the encoder takes "
                             f"{channels}-channel images: pass a uint8 array (H, W, {channels})")
        image = np.asarray(image)
    array = _uint8_array(image, what=what)
    if array.ndim == 2 and channels == 1:
        return array[None]
    if array.ndim == 3:
        if array.shape[2] == channels:  # channels-last, also when shape[0] == channels too
            return array.transpose(2, 0, 1)
        if array.shape[0] == channels:
            return array
    raise ValueError(_layout_error(array.shape, channels, what=what))


def _uint8_array(value: Any, *, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{what} is a {type(value).__name__}; the encoder takes {LAYOUTS}")
    if value.dtype != np.uint8:
        raise ValueError(f"{what} has dtype {value.dtype}; the encoder takes {LAYOUTS} (pixel values 0-255 as "
                         f"uint8: convert with array.astype(numpy.uint8) when they are in that range)")
    return value


def _layout_error(shape: tuple[int, ...], channels: int, *, what: str = "the input") -> str:
    return (f"{what} has shape {tuple(shape)}, which is no image layout of this {channels}-channel encoder: it "
            f"takes {LAYOUTS}, with C = {channels}")


def _is_pil(value: Any) -> bool:
    """A PIL image, without importing PIL where none was passed."""
    return any(cls.__module__.startswith("PIL.") and cls.__name__ == "Image" for cls in type(value).__mro__)
