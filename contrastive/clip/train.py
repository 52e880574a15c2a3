"""The CLIP fine-tuning loop of one MCL stage: single process or DDP, resumable, ranks in lockstep.

Reads top to bottom like ``contrastive.train``: for every epoch, ask ``batches(epoch, start)`` for this rank's
batches (random batches for stage 0, cluster-pure ones afterwards), tokenize captions, compute the CLIP loss under
the configured precision, step AdamW with warmup + cosine/constant schedule, clamp the logit scale, checkpoint.

Lockstep: before every step the ranks agree (one all-reduce of an int) on the smallest local batch; a rank whose
reader ran dry reports 0 and every rank ends the epoch there. This keeps DDP from hanging when shards hold a few
samples more on one rank (stage 0), and when a broken sample shrank one rank's batch, all ranks trim to match
(all_gather needs equal sizes). Both cases are counted in the result.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from contrastive.checkpoint import load_checkpoint, save_checkpoint
from contrastive.clip.data import ClipBatch
from contrastive.clip.distributed import DistInfo, all_reduce_min, barrier
from contrastive.clip.loss import clip_loss
from contrastive.clip.model import (MAX_LOGIT_SCALE, ClipBundle, autocast_context, grad_scaler, load_trainable_state,
                                    trainable_state_dict)
from contrastive.errors import MclpipeError
from contrastive.train import TrainCallback, lr_multiplier

# The unimodal loop's hooks (on_step, on_epoch_end, on_checkpoint): one protocol, so the pipeline's progress and
# metric callbacks serve both loops.
ClipCallback = TrainCallback


@dataclass
class ClipTrainResult:
    steps: int
    epochs: int
    final_loss: float
    resumed_from_step: int | None
    seconds: float
    samples_per_second: float
    trimmed_samples: int = 0
    epochs_ended_early: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    keys_seen: list[list[str]] = field(default_factory=list)


class ClipTrainModule(nn.Module):
    """What DDP wraps: forward(images (B, 3, S, S), tokens (B, T)) -> (image features (B, D), text features (B, D),
    logit scale exp(t)), both feature sets L2-normalised. A fixed text tower runs under no_grad: no activations
    are kept for it, which is most of the memory saving of locking it."""

    def __init__(self, model: nn.Module, *, text_frozen: bool):
        super().__init__()
        self.model = model
        self.text_frozen = text_frozen

    def forward(self, images: torch.Tensor, tokens: torch.Tensor):
        image_features = self.model.encode_image(images, normalize=True)
        if self.text_frozen:
            with torch.no_grad():
                text_features = self.model.encode_text(tokens, normalize=True)
        else:
            text_features = self.model.encode_text(tokens, normalize=True)
        return image_features, text_features, self.model.logit_scale.exp()


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on matrices, none on gains, biases, embeddings and the logit scale (as open_clip)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exclude = param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name \
            or "embedding" in name
        (no_decay if exclude else decay).append(param)
    if not decay and not no_decay:
        raise MclpipeError("no trainable parameters: set model.trainable_image_blocks >= 1 or unlock the text tower")
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def text_tower_frozen(model: nn.Module) -> bool:
    """True when no parameter outside the image tower (and the logit scale/bias) trains."""
    return not any(p.requires_grad for n, p in model.named_parameters()
                   if not n.startswith(("visual.", "logit_scale", "logit_bias")))


def compute_loss(*, module: nn.Module, batch: ClipBatch, tokenizer: Callable, precision: str,
                 device: torch.device, local_loss: bool) -> torch.Tensor:
    """CLIP loss of one batch on this rank (features gathered over ranks inside clip_loss)."""
    images = batch.images.to(device, non_blocking=True)
    tokens = tokenizer(batch.texts).to(device, non_blocking=True)
    with autocast_context(precision=precision, device=device):
        image_features, text_features, scale = module(images, tokens)
        return clip_loss(image_features=image_features.float(), text_features=text_features.float(),
                         logit_scale=scale.float(), local_loss=local_loss)


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def train_clip(*, bundle: ClipBundle, batches: Callable[[int, int], Iterator[ClipBatch]], steps_per_epoch: int,
               epochs: int, lr: float, weight_decay: float, warmup_fraction: float, schedule: str, precision: str,
               device: torch.device, checkpoint_path: Path, checkpoint_every_steps: int, log_every_steps: int,
               info: DistInfo = DistInfo(), local_loss: bool = False, grad_clip_norm: float | None = None,
               betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-6, max_steps_per_epoch: int | None = None,
               callbacks: list[ClipCallback] = (), stop_after_steps: int | None = None,
               record_keys: bool = False) -> ClipTrainResult:
    """Fine-tune ``bundle.model`` (already frozen as configured) for ``epochs``.

    batches(epoch, start): this rank's batches of ``epoch`` from batch ``start`` on (resumption).
    steps_per_epoch: planned steps per epoch (for the schedule; warmup = warmup_fraction of all planned steps).
    Checkpoints (rank 0 writes, every rank reads) hold the trainable parameters, optimizer, scheduler, scaler,
    RNG states and the position in the epoch. ``stop_after_steps`` stops as a crash would (tests).
    """
    model = bundle.model.to(device)
    module: nn.Module = ClipTrainModule(model, text_frozen=text_tower_frozen(model))
    if info.is_distributed:
        module = nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    opt = torch.optim.AdamW(param_groups(model, weight_decay=weight_decay), lr=lr, betas=betas, eps=eps)
    if max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, max_steps_per_epoch)
    total_steps = max(1, steps_per_epoch * epochs)
    warmup_steps = int(warmup_fraction * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_multiplier(step=s, total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule))
    scaler = grad_scaler(precision=precision, device=device)

    start_epoch, consumed, step, resumed_from = 0, 0, 0, None
    checkpoint = load_checkpoint(checkpoint_path, map_location="cpu")
    if checkpoint is not None:
        load_trainable_state(model, checkpoint["trainable_state"])
        opt.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        _restore_rng(checkpoint["rng"])
        start_epoch, consumed = checkpoint["epoch"], checkpoint["batches_consumed"]
        step = resumed_from = checkpoint["step"]

    last_saved = {"step": None}

    def save(epoch: int, position: int) -> None:
        # Saving the same step twice would make the ".prev" fallback a copy of the newest checkpoint.
        if last_saved["step"] == step and position != 0:
            return
        last_saved["step"] = step
        if info.is_main:
            save_checkpoint({"trainable_state": trainable_state_dict(model), "optimizer": opt.state_dict(),
                             "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                             "rng": _rng_state(), "epoch": epoch, "batches_consumed": position, "step": step},
                            checkpoint_path)
            for callback in callbacks:
                callback.on_checkpoint(path=checkpoint_path, step=step)
        barrier()

    result = ClipTrainResult(steps=step, epochs=start_epoch, final_loss=float("nan"), resumed_from_step=resumed_from,
                             seconds=0.0, samples_per_second=0.0)
    started, samples = time.perf_counter(), 0
    model.train()
    for epoch in range(start_epoch, epochs):
        position = consumed if epoch == start_epoch else 0
        iterator = iter(batches(epoch, position))
        epoch_losses, window_start, window_samples = [], time.perf_counter(), 0
        while max_steps_per_epoch is None or position < max_steps_per_epoch:
            batch = next(iterator, None)
            local = len(batch) if batch is not None else 0
            size = all_reduce_min(local, device=device)
            if size < 2:  # some rank ran dry (or a batch of 1 has no negatives): the epoch ends for all ranks
                if local > 0:  # this rank still had data: count what the early end left unread in this batch
                    result.epochs_ended_early += 1
                    result.trimmed_samples += local
                break
            if size < local:
                result.trimmed_samples += local - size
                batch = batch.take(size)
            loss = compute_loss(module=module, batch=batch, tokenizer=bundle.tokenizer, precision=precision,
                                device=device, local_loss=local_loss)
            if not torch.isfinite(loss):
                raise MclpipeError(f"CLIP training diverged at step {step} (loss {loss.item()}): lower train.lr or "
                                   f"use precision fp32/bf16; the last good checkpoint is {checkpoint_path}")
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if grad_clip_norm:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], grad_clip_norm)
            scaler.step(opt)
            scaler.update()
            scheduler.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0, math.log(MAX_LOGIT_SCALE))
            step += 1
            position += 1
            result.final_loss = loss.item()
            epoch_losses.append(result.final_loss)
            samples += size * info.world_size
            window_samples += size * info.world_size
            if record_keys:
                result.keys_seen.append(list(batch.keys))
            if step % log_every_steps == 0:
                elapsed = time.perf_counter() - window_start
                metrics = {"train/loss": result.final_loss, "train/lr": scheduler.get_last_lr()[0],
                           "train/logit_scale": float(model.logit_scale.detach().exp()),
                           "train/samples_per_s": window_samples / max(elapsed, 1e-9), "train/epoch": float(epoch)}
                result.history.append({"step": float(step), **metrics})
                if info.is_main:
                    for callback in callbacks:
                        callback.on_step(step=step, epoch=epoch, metrics=metrics)
                window_start, window_samples = time.perf_counter(), 0
            if step % checkpoint_every_steps == 0:
                save(epoch, position)
            if stop_after_steps is not None and step >= stop_after_steps:
                save(epoch, position)
                return _finish(result, step=step, epoch=epoch, started=started, samples=samples)
        save(epoch + 1, 0)
        if info.is_main:
            for callback in callbacks:
                callback.on_epoch_end(epoch=epoch, metrics={
                    "train/epoch_loss": float(np.mean(epoch_losses)) if epoch_losses else float("nan")})
    return _finish(result, step=step, epoch=epochs, started=started, samples=samples)


def _finish(result: ClipTrainResult, *, step: int, epoch: int, started: float, samples: int) -> ClipTrainResult:
    result.steps, result.epochs = step, epoch
    result.seconds = time.perf_counter() - started
    result.samples_per_second = samples / max(result.seconds, 1e-9)
    return result
