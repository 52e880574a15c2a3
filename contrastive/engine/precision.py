"""Mixed precision: the autocast region of a forward pass and the loss scaler, one definition for every stage.

- ``fp32``: no autocast.
- ``bf16``: bfloat16 autocast on CUDA and on CPU; no scaler (bf16 has fp32's exponent range).
- ``fp16`` (alias ``amp``, the CLIP configs' historical name): float16 autocast with a GradScaler on CUDA; on CPU
  it runs in fp32, because CPU float16 autocast is slow and unsupported for many ops.
- ``auto``: ``bf16`` where the device computes in bfloat16 natively (a CUDA GPU that supports it; a CPU with
  AMX or AVX512-BF16 units: Intel Sapphire Rapids and later, AMD Zen 4 and later), else ``fp32``. On such a CPU a
  small CNN trains about 1.3x faster (2 cores, 2026-11-27, the trifeature presets' stage: 729 against 556
  samples/s); elsewhere bf16 is emulated and slower than fp32, so ``auto`` keeps fp32 there.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, TypeVar

import torch

from contrastive.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16", "amp", "auto")
F = TypeVar("F", bound=Callable)


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively (see ``auto`` in the module docstring)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        # torch's own CPU feature probes (private, hence the getattr): AMX tiles or AVX512-BF16 instructions.
        probes = (getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
        return any(probe() for probe in probes if probe is not None)
    return False


def resolve_precision(precision: str, *, device: torch.device) -> str:
    """The precision a stage runs in on ``device``: ``auto`` resolved, any other name as it is."""
    check_precision(precision)
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def _is_fp16(precision: str) -> bool:
    return precision in ("fp16", "amp")


def autocast_context(*, precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast region for a forward pass (see the module docstring)."""
    precision = resolve_precision(precision, device=device)
    if _is_fp16(precision) and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def grad_scaler(*, precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A loss scaler that is active only for float16 autocast on CUDA; a disabled no-op otherwise."""
    return torch.amp.GradScaler("cuda", enabled=_is_fp16(precision) and device.type == "cuda")


def _as_fp32(value):
    """A half-precision tensor as float32; float32 / float64 and everything else as they are."""
    if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
        return value.float()
    return value


def fp32_logits(loss: F) -> F:
    """Run a contrastive loss in fp32 whatever the autocast region around it: its floating-point tensor arguments
    in half precision are cast to float32 and autocast is off inside, so the similarity matmul, the division by the temperature and
    the softmax are fp32 (the encoders still run in bf16 / fp16). Why: bf16 keeps 8 bits of mantissa, so a cosine
    near 1 moves in steps of 2^-8, which at SimCSE's tau = 0.05 is 0.08 in a logit. The cast is differentiable:
    the gradient flows back to the encoder in its own dtype."""
    @functools.wraps(loss)
    def in_fp32(*args, **kwargs):
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        device_type = tensors[0].device.type if tensors else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            return loss(*map(_as_fp32, args), **{key: _as_fp32(value) for key, value in kwargs.items()})
    return in_fp32


def configure_cuda_numerics(*, device: torch.device, tf32: bool, cudnn_benchmark: bool) -> None:
    """On a GPU: TF32 for fp32 matmuls and convolutions (Ampere and later: about 8x the fp32 matmul rate, 10 bits of
    mantissa in the products, fp32 accumulation) and cuDNN's autotuner (it picks the fastest convolution kernel
    for each input shape once). Neither changes results beyond float noise, so both are on by default and neither
    is part of a step's content key. Nothing on the CPU."""
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark


def load_scaler_state(scaler: torch.amp.GradScaler, state: dict) -> None:
    """Restore a loss scaler from a checkpoint; a checkpoint of a stage that ran without one (fp16 on the CPU, or
    another precision: an empty state) leaves a fresh scaler as it is, so a stage moves between CPU and GPU."""
    if state:
        scaler.load_state_dict(state)
