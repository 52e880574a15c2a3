"""The one training loop of every stage, method and modality; it reads top to bottom.

For every epoch: ask the batch source for this rank's batches from the saved position; agree with the other ranks
on the batch size (lockstep); turn the batch into forward inputs (the task; augmentation happens there); forward
under the configured precision; accumulate gradients over ``grad_accumulation`` micro-batches; clip; step the
optimizer, the scaler and the schedule; let the task update what follows a step; log every ``log_every_steps``;
checkpoint every ``checkpoint_every_steps`` and at the end of every epoch.

A checkpoint holds the task's state (model, queues), optimizer, scheduler, scaler, every RNG (python, numpy,
torch, CUDA and the task's own generators), the epoch and the number of batches consumed in it, so a stage killed
mid-way resumes on exactly the batches and augmentations an uninterrupted run would have seen. Rank 0 writes it,
every rank reads it.

Stopping: SIGINT (Ctrl-C) or SIGTERM during training lets the step in progress finish, writes a checkpoint and
raises ``StageInterrupted`` (``engine.signals``); under torchrun the ranks agree on it after every step. A second
signal stops at once, keeping the last periodic checkpoint.

Lockstep: before every micro-batch the ranks agree (one all-reduce of an int) on the smallest local batch; a rank
whose source ran dry reports 0 and every rank ends the epoch there, so DDP never hangs on uneven data; a shorter
batch on one rank (an unreadable image skipped) trims the others to match. Both are counted in the result.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from contrastive.engine.checkpoint import load_checkpoint, save_checkpoint
from contrastive.engine.device import device_report
from contrastive.engine.feed import watched
from contrastive.engine.distributed import (DistInfo, all_reduce_max, all_reduce_min, any_rank, barrier, current_info,
                                            gather_objects, sync_batch_norms)
from contrastive.engine.optim import build_optimizer, lr_multiplier
from contrastive.engine.precision import (autocast_context, check_precision, configure_cuda_numerics, grad_scaler,
                                          load_scaler_state, resolve_precision)
from contrastive.engine.rng import capture_rng, restore_rng, rng_of_rank
from contrastive.engine.signals import consume, graceful_stop, stop_requested
from contrastive.engine.task import BatchSource, LoopSpec, OptimSpec, StageTask
from contrastive.errors import ConfigError, DataError, MclpipeError, StageInterrupted

log = logging.getLogger(__name__)


class TrainCallback(Protocol):
    def on_step(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None: ...

    def on_epoch_end(self, *, epoch: int, metrics: dict[str, float]) -> None: ...

    def on_checkpoint(self, *, path: Path, step: int) -> None: ...


@dataclass
class TrainResult:
    steps: int
    epochs: int
    final_loss: float
    resumed_from_step: int | None
    seconds: float
    samples_per_second: float
    trimmed_samples: int = 0
    epochs_ended_early: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    rollbacks: int = 0
    skipped_batches: int = 0
    environment: dict[str, str] = field(default_factory=dict)  # contrastive.engine.device.device_report
    data_wait_seconds: float = 0.0  # blocked on the batch source, waiting for the next batch
    checkpoint_seconds: float = 0.0  # writing checkpoints (rank 0; the other ranks wait as long at the next step)

    def summary(self) -> dict:
        """What every stage's ``train_summary.json`` starts with (each modality adds its own keys)."""
        return {"steps": self.steps, "epochs": self.epochs, "final_loss": self.final_loss,
                "resumed_from_step": self.resumed_from_step, "seconds": self.seconds,
                "samples_per_second": self.samples_per_second, "trimmed_samples": self.trimmed_samples,
                "epochs_ended_early": self.epochs_ended_early, "rollbacks": self.rollbacks,
                "skipped_batches": self.skipped_batches, "environment": self.environment,
                "data_wait_share": self.data_wait_seconds / self.seconds if self.seconds > 0 else 0.0,
                "checkpoint_seconds": self.checkpoint_seconds}


@dataclass
class NonFiniteGuard:
    """What ``on_nonfinite: rollback`` has done so far, checkpointed with the stage so a resumed stage skips the
    same batches at the same learning rate: ``skipped`` [(epoch, batch position)] of the batches that diverged,
    ``lr_scale`` the product of the rollback factors, ``rollbacks`` their count."""
    skipped: set[tuple[int, int]] = field(default_factory=set)
    lr_scale: float = 1.0
    rollbacks: int = 0

    def state_dict(self) -> dict:
        return {"skipped": sorted(self.skipped), "lr_scale": self.lr_scale, "rollbacks": self.rollbacks}

    @classmethod
    def from_state(cls, state: dict | None) -> "NonFiniteGuard":
        state = state or {}  # checkpoints written before rollback existed
        return cls(skipped={tuple(x) for x in state.get("skipped", [])}, lr_scale=float(state.get("lr_scale", 1.0)),
                   rollbacks=int(state.get("rollbacks", 0)))


class _Diverged(Exception):
    """A non-finite loss at step ``step``, from the micro-batches at ``positions`` of ``epoch``: handled by
    :func:`train` (stop or roll back)."""

    def __init__(self, *, step: int, epoch: int, positions: list[int], loss: float):
        super().__init__(f"non-finite loss {loss} at step {step}")
        self.step, self.epoch, self.positions, self.loss = step, epoch, positions, loss


class _Forward:
    """The forward a micro-batch runs through: the module on the device (global batch norm and DDP across ranks,
    channels_last) and, with ``train.compile``, its compiled form for the stage's full batch size.

    DDP first, compile second, as PyTorch documents for DDP: compiling the DDP-wrapped module lets TorchDynamo's
    DDPOptimizer split the graph at DDP's bucket boundaries, so each bucket's gradient all-reduce overlaps the rest
    of the backward (a compiled module inside DDP gives DDP one opaque backward).

    One static-shape graph, for the largest batch size seen so far (the full batch: nearly every step); a smaller
    batch runs the same module eagerly. A stage's batches differ in size by design, not only at an epoch's end:
    MCL's cluster-pure batches end each group with a partial batch (``remainder_policy: partial``) and lockstep trims
    a batch to the smallest rank's; dropping or padding them would change what trains (padded rows would be
    negatives). A graph with a dynamic batch dimension serves every size but ran ResNet-50 SimCLR at 0.73x a plain
    loop's static graph on an H200 (``make gpu-check``, 2026-11-26: the static graph gained 41% over eager, the
    dynamic one 4%); recompiling per size would stall at each new size, then fall back to eager at TorchDynamo's
    recompile limit. The batch dimension is marked static, so a larger batch (a stage whose first
    batch was partial) compiles one more static graph instead of TorchDynamo's automatic dynamic one. Every rank
    of a launch sees the same (lockstep) size, so all ranks take the same path."""

    def __init__(self, *, task: StageTask, spec: LoopSpec, device: torch.device, info: DistInfo):
        module = task.forward_module()
        module = sync_batch_norms(module, device=device) if info.is_distributed else module
        module.to(device, memory_format=torch.channels_last if spec.channels_last else torch.preserve_format)
        if info.is_distributed:
            module = nn.parallel.DistributedDataParallel(
                module, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
        self.module = module
        self.compiled = torch.compile(module) if spec.compile else None
        self.compiled_size = 0

    def for_batch(self, inputs: dict, *, size: int) -> nn.Module:
        """The module to call on ``inputs``, a micro-batch of ``size`` samples (marking its batch dimension static
        when it goes to the compiled graph)."""
        if self.compiled is None or size < self.compiled_size:
            return self.module
        self.compiled_size = size
        for value in inputs.values():
            if isinstance(value, torch.Tensor) and value.ndim > 0:  # a 0-dim tensor (the step) has no batch dim
                torch._dynamo.mark_static(value, 0)
        return self.compiled


def read_metrics(metrics: dict) -> dict[str, float]:
    """A forward's metrics as floats, read at a logging step: its tensors (detached scalars, left on the device so
    the step never waits for them) in one host read, its floats as they are."""
    tensors = {name: value for name, value in metrics.items() if isinstance(value, torch.Tensor)}
    floats = {name: float(value) for name, value in metrics.items() if name not in tensors}
    if not tensors:
        return floats
    on = next(iter(tensors.values())).device
    read = torch.stack([value.detach().float().reshape(()).to(on) for value in tensors.values()]).tolist()
    return {**floats, **dict(zip(tensors, read))}


def _plan_steps(*, source: BatchSource, spec: LoopSpec) -> int:
    if len(source) == 0:
        raise DataError(f"the batch source ({type(source).__name__}) plans no batch: the data left after its split and "
                        "filters holds fewer samples than one batch (or none); check the data section and the batch "
                        "size")
    steps = max(1, len(source) // spec.grad_accumulation)
    return min(steps, spec.max_steps_per_epoch) if spec.max_steps_per_epoch else steps


def train(*, task: StageTask, source: BatchSource, optim: OptimSpec, loop: LoopSpec, device: torch.device,
          checkpoint_path: Path, callbacks: list[TrainCallback] = (), info: DistInfo | None = None,
          stop_after_steps: int | None = None) -> TrainResult:
    """Train ``task`` on ``source`` for ``loop.epochs``; resumes from ``checkpoint_path`` when it holds a
    checkpoint. ``stop_after_steps`` stops after that many optimizer steps, as a crash would (tests of resumption).
    Callbacks run on rank 0; one with an ``on_batch(step=, batch=)`` method sees every micro-batch on every rank,
    one with an ``on_train_start(total_steps=, step=)`` method hears the planned steps and the step it starts at
    (above 0 when resumed) before the first batch.
    """
    info = info or current_info()
    check_precision(loop.precision)
    if loop.grad_accumulation < 1:
        raise ConfigError(f"train.grad_accumulation must be >= 1, got {loop.grad_accumulation}")
    checkpoint_path = Path(checkpoint_path)
    configure_cuda_numerics(device=device, tf32=loop.tf32, cudnn_benchmark=loop.cudnn_benchmark)
    forward = _Forward(task=task, spec=loop, device=device, info=info)
    module = forward.module
    opt = build_optimizer(params=task.param_groups(weight_decay=optim.weight_decay), name=optim.name, lr=optim.lr,
                          weight_decay=optim.weight_decay, momentum=optim.momentum, betas=optim.betas, eps=optim.eps)
    steps_per_epoch = _plan_steps(source=source, spec=loop)
    total_steps = steps_per_epoch * loop.epochs
    warmup_steps = int(optim.warmup_fraction * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(
        step=s, total_steps=total_steps, warmup_steps=warmup_steps, schedule=optim.schedule))
    scaler = grad_scaler(precision=loop.precision, device=device)
    task.on_train_start(total_steps=total_steps)

    if loop.on_nonfinite not in ("stop", "rollback"):
        raise ConfigError(f"train.on_nonfinite must be stop or rollback, got {loop.on_nonfinite!r}")
    base_lrs = list(scheduler.base_lrs)
    guard = NonFiniteGuard()
    # The last trained step's loss, kept in each checkpoint: a stage stopped after its last checkpoint but before
    # its summary resumes into a loop with no step left, and reports this as its final loss instead of NaN.
    last_loss: dict = {"value": float("nan"), "tensor": None}

    def last_loss_value() -> float:
        return float(last_loss["tensor"]) if last_loss["tensor"] is not None else last_loss["value"]

    def restore(checkpoint: dict) -> tuple[int, int, int]:
        """Load a checkpoint into every stateful part; returns (epoch, batches consumed in it, step)."""
        nonlocal guard
        task.load_state_dict(checkpoint["model"])
        load_optimizer_state(opt, checkpoint["optimizer"], checkpoint_path=Path(checkpoint_path))
        scheduler.load_state_dict(checkpoint["scheduler"])
        load_scaler_state(scaler, checkpoint["scaler"])
        restore_rng(rng_of_rank(checkpoint, rank=info.rank, world_size=info.world_size), task.generators)
        guard = NonFiniteGuard.from_state(checkpoint.get("nonfinite"))
        last_loss["value"], last_loss["tensor"] = float(checkpoint.get("last_loss", float("nan"))), None
        return checkpoint["epoch"], checkpoint["batches_consumed"], checkpoint["step"]

    def scale_learning_rate() -> None:
        # The schedule's multiplier stays; its base rates carry the rollbacks' factors.
        scheduler.base_lrs = [lr * guard.lr_scale for lr in base_lrs]
        for group, base, multiplier in zip(opt.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * multiplier(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in opt.param_groups]

    start_epoch, consumed, step, resumed_from = 0, 0, 0, None
    checkpoint = load_checkpoint(checkpoint_path, map_location="cpu")
    if checkpoint is not None:
        start_epoch, consumed, step = restore(checkpoint)
        resumed_from = step
        if guard.lr_scale != 1.0:
            scale_learning_rate()

    last_saved: dict = {"at": None}

    def save(epoch: int, position: int) -> None:
        # Saving the same place twice would make the ".prev" fallback a copy of the newest checkpoint.
        if last_saved["at"] == (step, epoch, position):
            return
        last_saved["at"] = (step, epoch, position)
        rngs = gather_objects(capture_rng(task.generators))  # each rank resumes its own draws (CUDA's included)
        if info.is_main:
            started_saving = time.perf_counter()
            save_checkpoint({"model": task.state_dict(), "optimizer": opt.state_dict(),
                             "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                             "rng": rngs[0], "rng_by_rank": rngs, "epoch": epoch, "batches_consumed": position,
                             "step": step, "nonfinite": guard.state_dict(), "last_loss": last_loss_value()},
                            checkpoint_path)
            result.checkpoint_seconds += time.perf_counter() - started_saving
            for callback in callbacks:
                callback.on_checkpoint(path=checkpoint_path, step=step)
        # No barrier here: the other ranks go on to the next step (its first collective meets rank 0 when it is
        # done); only reading the checkpoint back (a rollback) waits for the write, there.

    trained = [p for group in opt.param_groups for p in group["params"]]
    batch_hooks = [c for c in callbacks if hasattr(c, "on_batch")]
    rollback_hooks = [c for c in callbacks if hasattr(c, "on_rollback")]

    def roll_back(bad: _Diverged) -> tuple[int, int]:
        """``on_nonfinite``: stop with the one line, or restore the last checkpoint, skip the batch that diverged
        and scale the learning rate; returns where training continues (epoch, batches consumed)."""
        nonlocal step
        fix = "lower train.lr, or use precision fp32 or bf16"
        if loop.on_nonfinite != "rollback":
            raise MclpipeError(f"training diverged at step {bad.step} (loss {bad.loss}): {fix}, or set "
                               f"train.on_nonfinite=rollback; the last good checkpoint is kept at {checkpoint_path}")
        if guard.rollbacks >= loop.max_rollbacks:
            raise MclpipeError(
                f"training diverged at step {bad.step} (loss {bad.loss}) after {guard.rollbacks} rollbacks (each "
                f"restored the last checkpoint, skipped the batch that diverged and scaled the learning rate by "
                f"{loop.rollback_lr_factor}): {fix}, or raise train.max_rollbacks; the last good checkpoint is kept "
                f"at {checkpoint_path}")
        newest = guard
        barrier()  # every rank reads what rank 0 wrote: only once it is written
        epoch, position, step = restore(load_checkpoint(checkpoint_path, map_location="cpu"))
        guard.skipped = newest.skipped | {(bad.epoch, position) for position in bad.positions}
        guard.rollbacks = newest.rollbacks + 1
        guard.lr_scale = newest.lr_scale * loop.rollback_lr_factor
        scale_learning_rate()
        opt.zero_grad(set_to_none=True)
        log.warning("training diverged at step %d (loss %s): rollback %d of %d to step %d, skipping batch %s of "
                    "epoch %d, learning rate x %g", bad.step, bad.loss, guard.rollbacks, loop.max_rollbacks, step,
                    ", ".join(map(str, bad.positions)), bad.epoch, guard.lr_scale)
        if info.is_main:
            for callback in rollback_hooks:
                callback.on_rollback(step=bad.step, restored_step=step, epoch=bad.epoch, batch=bad.positions[0],
                                     loss=bad.loss, lr_scale=guard.lr_scale, rollbacks=guard.rollbacks)
        return epoch, position

    result = TrainResult(steps=step, epochs=start_epoch, final_loss=last_loss["value"], resumed_from_step=resumed_from,
                         seconds=0.0, samples_per_second=0.0, environment={
                             **device_report(device, backend=dist.get_backend() if info.is_distributed else None,
                                             world_size=info.world_size),
                             "precision": resolve_precision(loop.precision, device=device)})
    if loop.on_nonfinite == "rollback" and checkpoint is None:
        save(start_epoch, consumed)  # somewhere to return to before the first periodic checkpoint
    log.info("training on %s", ", ".join(f"{k} {v}" for k, v in result.environment.items()))
    if info.is_main:  # the planned steps from the source itself (cluster-pure batches: more than N / batch size)
        for callback in callbacks:
            if hasattr(callback, "on_train_start"):
                callback.on_train_start(total_steps=total_steps, step=step)
    started, samples = time.perf_counter(), 0
    module.train()

    def name_last_checkpoint(exc: StageInterrupted) -> None:
        # A second signal stops mid-step: what survives is the last checkpoint written.
        if exc.checkpoint is None and checkpoint_path.exists():
            exc.checkpoint = str(checkpoint_path)
            exc.step = last_saved["at"][0] if last_saved["at"] else resumed_from

    data_wait_warned: list[int] = []

    def run_epochs(start_epoch: int, consumed: int) -> TrainResult:
        nonlocal step, samples
        for epoch in range(start_epoch, loop.epochs):
            position = consumed if epoch == start_epoch else 0
            iterator = watched(iter(source.batches(epoch=epoch, start=position)), seconds=loop.stall_seconds,
                               first_seconds=3 * loop.stall_seconds if loop.stall_seconds else None,
                               describe=lambda: describe_source(source, epoch=epoch, position=position))
            epoch_losses, window_start, window_samples, window_wait = [], time.perf_counter(), 0, 0.0
            metrics: dict[str, float] = {}
            while loop.max_steps_per_epoch is None or position < loop.max_steps_per_epoch * loop.grad_accumulation:
                # The loss stays on the device: read at logging steps, epoch ends and the end (host syncs).
                step_loss, step_samples, dry, positions = torch.zeros((), device=device), 0, False, []
                for micro in range(loop.grad_accumulation):
                    waited = time.perf_counter()
                    batch = next(iterator, None)
                    while batch is not None and (epoch, position) in guard.skipped:  # diverged once: rolled back
                        position += 1
                        batch = next(iterator, None)
                    waited = time.perf_counter() - waited
                    window_wait += waited
                    result.data_wait_seconds += waited
                    local = len(batch) if batch is not None else 0
                    size = all_reduce_min(local, device=device)
                    # some rank ran dry (or a batch of 1 has no negatives): the epoch ends for all ranks
                    if size < 2:
                        if local > 0:  # this rank still had data: count what the early end left unread in it
                            result.epochs_ended_early += 1
                            result.trimmed_samples += local
                        dry = True
                        break
                    if size < local:
                        result.trimmed_samples += local - size
                        batch = batch.take(size)
                    for hook in batch_hooks:
                        hook.on_batch(step=step, batch=batch)
                    inputs = task.inputs(batch, device=device, step=step)
                    last_micro = micro == loop.grad_accumulation - 1
                    sync = contextlib.nullcontext() if last_micro or not info.is_distributed else module.no_sync()
                    with sync:
                        with autocast_context(precision=loop.precision, device=device):
                            loss, metrics = forward.for_batch(inputs, size=size)(**inputs)
                        scaler.scale(loss / loop.grad_accumulation).backward()
                    step_loss = step_loss + loss.detach().float() / loop.grad_accumulation
                    step_samples += size * info.world_size
                    positions.append(position)
                    position += 1
                if dry:
                    # A partial accumulation ran its backward without the gradient all-reduce: drop it.
                    opt.zero_grad(set_to_none=True)
                    break
                # Checked before the optimizer step, so a non-finite loss never reaches the weights.
                if any_rank(~torch.isfinite(step_loss), device=device):
                    raise _Diverged(step=step, epoch=epoch, positions=positions, loss=float(step_loss))
                if loop.grad_clip_norm:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(trained, loop.grad_clip_norm)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                scheduler.step()
                task.after_step(step=step)
                step += 1
                epoch_losses.append(step_loss)
                last_loss["tensor"] = step_loss
                samples += step_samples
                window_samples += step_samples
                if step % loop.log_every_steps == 0:
                    elapsed = max(time.perf_counter() - window_start, 1e-9)
                    logged = {"train/loss": float(step_loss), "train/lr": scheduler.get_last_lr()[0],
                              "train/data_wait_share": window_wait / elapsed,
                              "train/samples_per_s": window_samples / elapsed,
                              "train/views_per_s": task.views_per_sample * window_samples / elapsed,
                              "train/epoch": float(epoch), **read_metrics(metrics), **task.log_metrics()}
                    result.history.append({"step": float(step), **logged})
                    if info.is_main:
                        for callback in callbacks:
                            callback.on_step(step=step, epoch=epoch, metrics=logged)
                    # Once a stage, and not for its first window (the input workers' start-up is in it).
                    warning = data_wait_warning(share=window_wait / elapsed, steps=loop.log_every_steps)
                    if warning and not data_wait_warned and step > loop.log_every_steps:
                        log.warning(warning)
                        data_wait_warned.append(step)
                    window_start, window_samples, window_wait = time.perf_counter(), 0, 0.0
                if step % loop.checkpoint_every_steps == 0:
                    save(epoch, position)
                signum = stop_requested() or 0
                if info.is_distributed:  # all ranks stop after the same step, or the rest would wait in a collective
                    signum = all_reduce_max(signum, device=device)
                if signum:  # SIGINT / SIGTERM arrived during this step: keep it, then stop
                    result.final_loss = float(step_loss)
                    save(epoch, position)
                    consume(signum)
                    raise StageInterrupted(signum=signum, checkpoint=str(checkpoint_path), step=step)
                if stop_after_steps is not None and step >= stop_after_steps:
                    result.final_loss = float(step_loss)
                    save(epoch, position)
                    return _finish(result, step=step, epoch=epoch, started=started, samples=samples, guard=guard)
            save(epoch + 1, 0)
            if epoch_losses:
                result.final_loss = float(epoch_losses[-1])
            if info.is_main:
                for callback in callbacks:
                    callback.on_epoch_end(epoch=epoch, metrics={
                        "train/epoch_loss": float(torch.stack(epoch_losses).mean()) if epoch_losses else float("nan")})
        return _finish(result, step=step, epoch=loop.epochs, started=started, samples=samples, guard=guard)

    with graceful_stop(on_interrupt=name_last_checkpoint):
        while True:
            try:
                return run_epochs(start_epoch, consumed)
            except _Diverged as bad:
                start_epoch, consumed = roll_back(bad)


def describe_source(source: BatchSource, *, epoch: int, position: int) -> str:
    """The reader and where it was, for the stall message: the source's own ``describe(epoch=, position=)`` (the
    file or shard it was on, what its filters dropped) when it has one."""
    where = f"epoch {epoch}, batch {position} of {len(source)}"
    own = getattr(source, "describe", None)
    return f"{own(epoch=epoch, position=position)} ({where})" if own else f"the {type(source).__name__} ({where})"


#: A logging window that spent more than this share of its time waiting for batches is reported, once a stage.
DATA_WAIT_WARN_SHARE = 0.3


def data_wait_warning(*, share: float, steps: int) -> str | None:
    """The warning for a logging window in which the input, not the model, set the pace (None when it did not)."""
    if share <= DATA_WAIT_WARN_SHARE:
        return None
    return (f"the stage waited for its input {100 * share:.0f}% of the last {steps} steps: the model is starved; "
            "raise the input workers (train.workers for image files, data.decode_workers for CLIP shards) or read "
            "from faster storage")


def _finish(result: TrainResult, *, step: int, epoch: int, started: float, samples: int,
            guard: NonFiniteGuard) -> TrainResult:
    result.steps, result.epochs = step, epoch
    result.rollbacks, result.skipped_batches = guard.rollbacks, len(guard.skipped)
    result.seconds = time.perf_counter() - started
    result.samples_per_second = samples / max(result.seconds, 1e-9)
    return result


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict, *, checkpoint_path: Path) -> None:
    """The checkpoint's optimizer state into ``opt``; a checkpoint whose parameter groups do not fit (written while
    other parameters were trainable, e.g. before an hf text encoder's unused pooler was frozen) names the fix."""
    try:
        opt.load_state_dict(state)
    except ValueError as exc:
        raise DataError(f"checkpoint {checkpoint_path} holds optimizer state for other trainable parameters than "
                        f"this stage's model ({exc}): it was written by a version that trained other parameters; "
                        f"delete {checkpoint_path.parent} to train the stage from its start") from exc


def release_device_memory(device: torch.device) -> None:
    """Return a finished stage's cached CUDA memory to the driver before the next stage starts in this process."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
