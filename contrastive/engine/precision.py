"""Mixed precision: the autocast region of a forward pass and the loss scaler, one definition for every stage.

- ``fp32``: no autocast.
- ``bf16``: bfloat16 autocast on CUDA and on CPU; no scaler (bf16 has fp32's exponent range).
- ``fp16`` (alias ``amp``, the CLIP configs' historical name): float16 autocast with a GradScaler on CUDA; on CPU
  it runs in fp32, because CPU float16 autocast is slow and unsupported for many ops.
"""
from __future__ import annotations

import contextlib

import torch

from contrastive.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16", "amp")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")


def _is_fp16(precision: str) -> bool:
    return precision in ("fp16", "amp")


def autocast_context(*, precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast region for a forward pass (see the module docstring)."""
    check_precision(precision)
    if _is_fp16(precision) and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def grad_scaler(*, precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A loss scaler that is active only for float16 autocast on CUDA; a disabled no-op otherwise."""
    return torch.amp.GradScaler("cuda", enabled=_is_fp16(precision) and device.type == "cuda")
