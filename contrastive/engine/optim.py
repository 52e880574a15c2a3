"""Optimizers, parameter groups and the learning-rate schedule of every stage.

- :func:`param_groups`: decay / no-decay groups (one rule, :func:`excluded_from_decay`, for every modality).
- :class:`LARS`: SGD with momentum and a per-layer trust ratio (You et al. 2017; SimCLR's large-batch optimizer).
- :func:`build_optimizer`: adam, adamw, sgd, lars by name.
- :func:`lr_multiplier`: linear warmup then cosine or constant; :func:`scaled_lr`: the batch-size scaling rules.
"""
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
    """True for the parameters that get no weight decay (and no LARS adaptation): 0-D and 1-D tensors (biases,
    norm gains), batch / layer norms by name (bn, ln), biases, CLIP's logit scale, embeddings (token, positional,
    class: open_clip's class_embedding, torchvision ViT's pos_embedding) and torchvision ViT's class_token."""
    return param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name \
        or "embedding" in name or "class_token" in name


def lars_excluded(name: str | None, param: torch.Tensor) -> bool:
    """LARS's default ``exclude`` predicate: :func:`excluded_from_decay` when the optimizer was given parameter
    names (``model.named_parameters()``), else by shape alone (ndim < 2: biases and norm gains)."""
    return param.ndim < 2 if name is None else excluded_from_decay(name, param)


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You, Gitman & Ginsburg 2017), as SimCLR trains with it.

    For each parameter tensor w with gradient g, unless ``exclude(name, w)``:

        trust = eta * ||w|| / (||g|| + weight_decay * ||w||)      (1 when ||w|| = 0 or ||g|| = 0)
        d     = trust * (g + weight_decay * w)

    and for an excluded tensor (biases, norm layers: no weight decay, no adaptation) d = g. Then, with the
    learning rate inside the momentum as in the paper and SimCLR's implementation:

        v <- momentum * v + lr * d          w <- w - v           (nesterov: w <- w - (momentum * v + lr * d))

    ``params``: tensors, ``named_parameters()`` pairs or groups of either (groups may set their own lr,
    weight_decay, momentum, eta). ``exclude(name, param)`` is called with name None when no names were given; the
    default :func:`lars_excluded` then excludes by ndim < 2. State: one momentum buffer per tensor
    (``state_dict`` / ``load_state_dict`` round-trip as for every torch optimizer).
    """

    def __init__(self, params, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 1e-3,
                 nesterov: bool = False, exclude=lars_excluded):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError(f"LARS needs lr, momentum, weight_decay >= 0 and eta > 0 (got lr={lr}, "
                             f"momentum={momentum}, weight_decay={weight_decay}, eta={eta})")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta,
                                  "nesterov": nesterov})
        self.exclude = exclude

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
            names = group.get("param_names") or [None] * len(group["params"])
            for name, param in zip(names, group["params"]):
                if param.grad is None:
                    continue
                grad = param.grad
                if self.exclude(name, param):
                    update = grad.clone()
                else:
                    w_norm = torch.linalg.vector_norm(param)
                    g_norm = torch.linalg.vector_norm(grad)
                    trust = torch.where((w_norm > 0) & (g_norm > 0),
                                        group["eta"] * w_norm / (g_norm + weight_decay * w_norm),
                                        torch.ones_like(w_norm))
                    update = grad.add(param, alpha=weight_decay).mul_(trust)
                update.mul_(lr)
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param)
                buffer = state["momentum_buffer"]
                buffer.mul_(momentum).add_(update)
                param.sub_(buffer.mul(momentum).add_(update) if group["nesterov"] else buffer)
        return loss


def build_optimizer(*, params, name: str, lr: float, weight_decay: float, momentum: float = 0.9,
                    betas: tuple[float, float] | None = None, eps: float | None = None) -> torch.optim.Optimizer:
    """adam / adamw (betas, eps when given), sgd (Nesterov momentum), lars (:class:`LARS`, momentum; biases and
    1-D parameters, or by name when ``params`` carries names, excluded from decay and adaptation)."""
    adam_options = {**({"betas": tuple(betas)} if betas else {}), **({"eps": eps} if eps else {})}
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **adam_options)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **adam_options)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=momentum > 0)
    if name == "lars":
        return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}: use adam, adamw, sgd or lars")


def lr_multiplier(*, step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Linear warmup to 1, then constant or half-cosine decay to 0 at ``total_steps``:

        step < W:  (step + 1) / W
        constant:  1
        cosine:    0.5 * (1 + cos(pi * min(1, (step - W) / max(1, T - W))))
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def scaled_lr(*, base_lr: float, global_batch_size: int, rule: str) -> float:
    """The learning rate used at a global batch B:

        none:   lr = base_lr
        linear: lr = base_lr * B / 256        (Goyal et al. 2017; SimCLR: 0.3 * B / 256 with LARS)
        sqrt:   lr = base_lr * sqrt(B)        (SimCLR appendix B.1: 0.075 * sqrt(B), better at small B / long runs)
    """
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * global_batch_size / 256
    if rule == "sqrt":
        return base_lr * math.sqrt(global_batch_size)
    raise ValueError(f"unknown lr scaling rule {rule!r}: use none, linear or sqrt")
