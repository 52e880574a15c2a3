"""Optimizers, parameter groups and the learning-rate schedule of every stage."""
from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict]:
    """Two groups of the trainable parameters: decay on weight matrices / kernels, none on biases, norm gains,
    embeddings and CLIP's logit scale (as open_clip and SimCLR's LARS do)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if excluded_from_decay(name, param) else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def excluded_from_decay(name: str, param: torch.Tensor) -> bool:
    return param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name \
        or "embedding" in name


def build_optimizer(*, params, name: str, lr: float, weight_decay: float, momentum: float = 0.9,
                    betas: tuple[float, float] | None = None, eps: float | None = None) -> torch.optim.Optimizer:
    """adam / adamw (betas, eps when given), sgd (Nesterov momentum)."""
    adam_options = {**({"betas": tuple(betas)} if betas else {}), **({"eps": eps} if eps else {})}
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **adam_options)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **adam_options)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=momentum > 0)
    raise ValueError(f"unknown optimizer {name!r}")


def lr_multiplier(*, step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Linear warmup to 1, then constant or half-cosine decay to 0 at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def scaled_lr(*, base_lr: float, global_batch_size: int, rule: str) -> float:
    """The learning rate used at a global batch B: none -> base; linear -> base * B / 256 (Goyal et al.; SimCLR);
    sqrt -> base * sqrt(B) (SimCLR's LARS rule for large batches, Chen et al. 2020, appendix B.1)."""
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * global_batch_size / 256
    if rule == "sqrt":
        return base_lr * math.sqrt(global_batch_size)
    raise ValueError(f"unknown lr scaling rule {rule!r}: use none, linear or sqrt")
