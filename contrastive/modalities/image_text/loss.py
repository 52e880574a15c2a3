"""The CLIP loss: symmetric InfoNCE over image-text pairs with a learnable temperature (Radford et al., 2021).

Shapes: B = samples on this rank, W = world size, D = embedding dimension.

Distributed training gathers the features of all ranks WITH gradient (``torch.distributed.nn.functional.all_gather``,
whose backward sends every rank the gradient of its own slot), so the loss sees all W*B negatives:

- global loss (default): every rank computes the same (WB x WB) loss; DDP's gradient averaging then yields
  exactly the gradient of the single-process loss on the concatenated batch.
- local loss (``local_loss=True``, open_clip's ``--local-loss``): rank r computes only its B rows of the
  (B x WB) logits in each direction, O(B * WB) memory instead of O((WB)^2); the average over ranks equals the
  global loss, so the gradient after DDP averaging is the same.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from contrastive.engine.distributed import gather_with_grad
from contrastive.engine.precision import fp32_logits


@fp32_logits
def clip_loss(*, image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor,
              local_loss: bool = False) -> torch.Tensor:
    """Symmetric cross entropy of image->text and text->image logits; returns a scalar.

    image_features, text_features: (B, D) L2-normalised; row i of each is a positive pair. logit_scale: scalar
    tensor, the multiplier exp(t) (not t). Loss = (CE(s * I T^T, diag) + CE(s * T I^T, diag)) / 2, computed over
    the features of all ranks when torch.distributed is initialised (see module docstring).
    """
    if image_features.shape != text_features.shape or image_features.ndim != 2:
        raise ValueError(f"image and text features must both be (B, D); got {tuple(image_features.shape)} and "
                         f"{tuple(text_features.shape)}")
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1
    batch = image_features.shape[0]
    if not distributed:
        logits = logit_scale * image_features @ text_features.T
        labels = torch.arange(batch, device=logits.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    all_images, all_texts = gather_with_grad(image_features), gather_with_grad(text_features)
    if local_loss:
        rank = torch.distributed.get_rank()
        labels = torch.arange(batch, device=image_features.device) + rank * batch
        per_image = logit_scale * image_features @ all_texts.T
        per_text = logit_scale * text_features @ all_images.T
        return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2
    logits = logit_scale * all_images @ all_texts.T
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
