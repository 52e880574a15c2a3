"""The image-text modality's registered model: the image tower of every stage, on the CPU, embedding the images a
user hands it the way the export embeds the shards (open_clip's eval transform, L2-normalised ``encode_image``).

A stage's ``model.pt`` keeps only its trained parameters and rebuilds the rest from the init weights, which live
in this machine's cache; the registered model instead ships :func:`write_serving_file`'s self-contained copy (the
full state dict and the spec with ``pretrained: None``), so it loads where those weights are not. Models named
``local-dir:/path`` still need that directory's model config where they load.

Accepted inputs: RGB uint8 images as :mod:`contrastive.modalities.image.serving` takes them ((n, H, W, 3),
(n, 3, H, W), one image, a list of arrays or PIL images); any size (the transform resizes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from contrastive.engine.checkpoint import save_torch
from contrastive.engine.safe_load import load_torch_file
from contrastive.modalities.image_text.model import ClipBundle, ClipSpec, create_clip, load_stage_model


def write_serving_file(model_path: str, *, out_dir: Path) -> str:
    """A self-contained copy of the stage model at ``model_path`` in ``out_dir``: {"spec", "state_dict"}."""
    bundle = load_stage_model(path=Path(model_path), device="cpu")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{Path(model_path).parent.parent.name or 'stage'}-{len(list(out_dir.iterdir()))}.pt"
    spec = {**bundle.spec.to_dict(), "pretrained": None, "cache_dir": None}
    save_torch({"spec": spec, "state_dict": bundle.model.state_dict()}, target, what="the serving model")
    return str(target)


def load_encoder(path: str) -> ClipBundle:
    """A stage's model for embedding: a serving file (full weights) or a stage ``model.pt`` (init + trained)."""
    saved = load_torch_file(path, what="serving model")
    if "state_dict" not in saved:
        return load_stage_model(path=Path(path), device="cpu")
    bundle = create_clip(spec=ClipSpec.from_dict(saved["spec"]), device="cpu")
    bundle.model.load_state_dict(saved["state_dict"])
    bundle.model.eval()
    return bundle


def embed(bundle: ClipBundle, inputs: Any, *, batch_size: int = 64) -> np.ndarray:
    """float32 (n, D) L2-normalised image embeddings of RGB images (see the module docstring)."""
    from PIL import Image

    from contrastive.modalities.image.serving import as_nchw
    from contrastive.modalities.image_text.evaluate import encode_images
    images = [Image.fromarray(image.transpose(1, 2, 0)) for image in as_nchw(inputs, channels=3)]
    return encode_images(model=bundle.model, images=images, transform=bundle.eval_transform,
                         device=torch.device("cpu"), batch_size=batch_size)
