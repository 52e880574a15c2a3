"""The image-text modality of the engine: CLIP fine-tuning of one MCL stage.

A batch (``ClipBatch``: transformed images, captions, keys) becomes (images, tokens) on the device; the forward
module encodes both towers and returns the CLIP loss over the features of all ranks (``contrastive.modalities.image_text.loss``).
Only the trainable parameters (the unlocked image blocks, the logit scale) are checkpointed: the rest equals the
shared pretrained init. After every optimizer step the logit scale is clamped to at most 100 (CLIP, Sec. 2.5).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from contrastive.modalities.image_text.data import ClipBatch
from contrastive.modalities.image_text.keyed_transform import normalize_batch
from contrastive.modalities.image_text.loss import clip_loss
from contrastive.modalities.image_text.model import MAX_LOGIT_SCALE, ClipBundle, load_trainable_state, trainable_state_dict
from contrastive.engine.optim import param_groups
from contrastive.engine.task import StageTask
from contrastive.errors import MclpipeError


class ClipTrainModule(nn.Module):
    """What DDP wraps: forward(images (B, 3, S, S), tokens (B, T)) -> (CLIP loss, {}), the features L2-normalised
    and gathered over ranks inside the loss. A fixed text tower runs under no_grad: no activations are kept for
    it, which is most of the memory saving of locking it. ``local_loss``: see ``contrastive.modalities.image_text.loss``."""

    def __init__(self, model: nn.Module, *, text_frozen: bool, local_loss: bool = False):
        super().__init__()
        self.model = model
        self.text_frozen = text_frozen
        self.local_loss = local_loss

    def features(self, images: torch.Tensor, tokens: torch.Tensor):
        """(image features (B, D), text features (B, D), logit scale exp(t))."""
        image_features = self.model.encode_image(images, normalize=True)
        if self.text_frozen:
            with torch.no_grad():
                text_features = self.model.encode_text(tokens, normalize=True)
        else:
            text_features = self.model.encode_text(tokens, normalize=True)
        return image_features, text_features, self.model.logit_scale.exp()

    def forward(self, images: torch.Tensor, tokens: torch.Tensor):
        image_features, text_features, scale = self.features(images, tokens)
        loss = clip_loss(image_features=image_features.float(), text_features=text_features.float(),
                         logit_scale=scale.float(), local_loss=self.local_loss)
        return loss, {}


def text_tower_frozen(model: nn.Module) -> bool:
    """True when no parameter outside the image tower (and the logit scale/bias) trains."""
    return not any(p.requires_grad for n, p in model.named_parameters()
                   if not n.startswith(("visual.", "logit_scale", "logit_bias")))


class ClipTask(StageTask):
    """Fine-tune ``bundle.model`` (already frozen as configured) with the CLIP loss."""

    def __init__(self, *, bundle: ClipBundle, local_loss: bool = False):
        self.bundle = bundle
        self.model = bundle.model
        self.tokenizer: Callable = bundle.tokenizer
        self.local_loss = local_loss

    def forward_module(self) -> nn.Module:
        return ClipTrainModule(self.model, text_frozen=text_tower_frozen(self.model), local_loss=self.local_loss)

    def inputs(self, batch: ClipBatch, *, device: torch.device, step: int) -> dict:
        tokens = self.tokenizer(batch.texts) if batch.tokens is None else batch.tokens  # the reader's, when it did
        images = batch.images.to(device, non_blocking=True)
        if batch.normalization is not None:  # uint8 on the way in (4x less to copy), normalised on the device
            images = normalize_batch(images, batch.normalization)
        return {"images": images, "tokens": tokens.to(device, non_blocking=True)}

    def param_groups(self, *, weight_decay: float) -> list[dict]:
        groups = param_groups(self.model, weight_decay=weight_decay)
        if not any(group["params"] for group in groups):
            raise MclpipeError("no trainable parameters: set model.trainable_image_blocks >= 1 or unlock the text "
                               "tower")
        return groups

    def after_step(self, *, step: int) -> None:
        with torch.no_grad():
            self.model.logit_scale.clamp_(0, math.log(MAX_LOGIT_SCALE))

    def log_metrics(self) -> dict[str, float]:
        return {"train/logit_scale": float(self.model.logit_scale.detach().exp())}

    def state_dict(self) -> dict:
        return trainable_state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        load_trainable_state(self.model, state)
