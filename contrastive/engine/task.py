"""What a method or a modality supplies to the engine, and the typed specs the engine runs on.

The engine (:func:`contrastive.engine.loop.train`) owns everything every stage shares: optimizer, schedule,
precision, gradient accumulation and clipping, DDP, checkpoints, RNG, the position in the epoch, lockstep across
ranks, logging and the divergence check. A :class:`StageTask` supplies only what differs between methods and
modalities:

    host batch --inputs()--> forward inputs on the device --forward_module()(**inputs)--> (loss, metrics)

plus the extra state it checkpoints (its model's state and its own random generators) and what follows an
optimizer step (a momentum encoder's update, CLIP's logit-scale clamp). A :class:`BatchSource` yields this
rank's batches of an epoch from a given position, so a resumed stage sees exactly the batches an uninterrupted one
would have seen.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator, Protocol

import torch
from torch import nn


@dataclass(frozen=True)
class OptimSpec:
    """Optimizer and learning-rate schedule of one stage. ``lr`` is the rate actually used (any batch-size
    scaling rule is applied by the config when it builds the spec, see ``contrastive.engine.optim.scaled_lr``)."""
    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    schedule: str = "cosine"
    warmup_fraction: float = 0.0
    momentum: float = 0.9
    betas: tuple[float, float] | None = None
    eps: float | None = None


@dataclass(frozen=True)
class LoopSpec:
    """How the loop runs: length, cadence of checkpoints and logs, and the numerics of a step.

    grad_accumulation: micro-batches per optimizer step (each micro-batch is its own contrastive batch: its
    negatives are its own samples, so MCL's cluster-pure batches stay pure). max_steps_per_epoch caps an epoch
    (smoke runs). channels_last: memory format of 4-D inputs and conv weights (about 30 % faster on CPU's oneDNN
    and what cuDNN prefers). compile: torch.compile the forward module.
    """
    epochs: int
    checkpoint_every_steps: int = 500
    log_every_steps: int = 10
    precision: str = "fp32"
    grad_accumulation: int = 1
    grad_clip_norm: float | None = None
    compile: bool = False
    channels_last: bool = False
    max_steps_per_epoch: int | None = None
    #: A non-finite loss: "stop" the stage, or "rollback" (restore the last checkpoint, skip the batch that
    #: diverged, scale the learning rate by ``rollback_lr_factor``) at most ``max_rollbacks`` times.
    on_nonfinite: str = "stop"
    max_rollbacks: int = 3
    rollback_lr_factor: float = 0.5
    #: CUDA only: TF32 matmuls and convolutions, cuDNN's autotuner (results change only within float noise).
    tf32: bool = True
    cudnn_benchmark: bool = True
    #: Seconds the loop waits for a batch before it stops the stage (3x for an epoch's first); None: forever.
    stall_seconds: float | None = 300.0


@dataclass(frozen=True)
class StageSpec:
    """What every training stage reads besides its modality's own fields (subclasses add those). JSON-able, so a
    torchrun launch receives it as a file: ``to_json`` / ``from_json`` round-trip the nested specs."""
    stage_dir: str
    seed: int
    device: str
    optim: OptimSpec
    loop: LoopSpec
    threads: int = 0
    record_keys: bool = False  # write every batch's sample keys per rank (tests of the distributed split)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict) -> "StageSpec":
        return cls(**{**value, "optim": OptimSpec(**value["optim"]), "loop": LoopSpec(**value["loop"])})


class Batch(Protocol):
    """A host batch: its length, a prefix of it (lockstep trimming) and the sample keys it holds."""

    def __len__(self) -> int: ...

    def take(self, n: int) -> "Batch": ...

    @property
    def keys(self) -> list[str]: ...


class BatchSource(Protocol):
    """This rank's batches: ``len()`` planned batches per epoch; ``batches(epoch=, start=)`` from batch ``start``."""

    def __len__(self) -> int: ...

    def batches(self, *, epoch: int, start: int) -> Iterator[Batch]: ...


class StageTask:
    """The method/modality adapter. Subclasses set ``model`` and implement :meth:`forward_module` and
    :meth:`inputs`; the defaults of the rest fit a model whose whole state is trained and checkpointed."""

    model: nn.Module
    #: Explicit generators the task draws from (e.g. augmentations); checkpointed and restored by name.
    generators: dict[str, torch.Generator] = {}
    #: Views per sample that go through the encoder (two-view methods: 2), for the throughput metric.
    views_per_sample: int = 1

    def forward_module(self) -> nn.Module:
        """The module DDP wraps (and torch.compile, train.compile): ``forward(**inputs) -> (scalar loss, {name:
        metric})``; it owns every trained parameter (directly or through ``model``). A metric is a detached scalar
        tensor (left on the device; the loop reads them once per logging window) or a float; ``.item()`` or
        ``float()`` of a device tensor in the forward waits for the GPU every step and breaks a compiled graph."""
        raise NotImplementedError

    def inputs(self, batch: Batch, *, device: torch.device, step: int) -> dict:
        """Host batch -> keyword arguments of the forward module, on ``device`` (augmentation happens here). A
        forward that needs the step takes it as a 0-dim tensor (``contrastive.methods.base.step_input``), not an int: a compiled forward
        guards on the value of an int it reads and would recompile as it changes."""
        raise NotImplementedError

    def param_groups(self, *, weight_decay: float) -> list[dict]:
        from contrastive.engine.optim import param_groups
        return param_groups(self.model, weight_decay=weight_decay)

    def on_train_start(self, *, total_steps: int) -> None:
        """Called once before the first step (also after a resume) with the number of optimizer steps."""

    def after_step(self, *, step: int) -> None:
        """Runs after every optimizer step (momentum encoders, clamps)."""

    def log_metrics(self) -> dict[str, float]:
        """Extra numbers for the logging window (read only at log steps: may synchronise the device)."""
        return {}

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state)
