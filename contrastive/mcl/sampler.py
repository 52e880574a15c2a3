"""The torch batch sampler of MCL stages: ``ClusterBatchSampler`` yields one epoch's ``plan_batches`` plan
batch by batch and keeps the epoch and the number of batches consumed, so a resumed run continues at the
next unconsumed batch of the same deterministic plan.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
from torch.utils.data import Sampler

from contrastive.errors import ConfigError, DataError
from contrastive.mcl.batch_plan import BatchPlan, _check_plan_args, _prepare_groups, plan_batches

__all__ = ["ClusterBatchSampler"]


class ClusterBatchSampler(Sampler[list[int]]):
    """A resumable, distributed-safe batch sampler yielding cluster-pure batches (plan_batches).

    Use as ``DataLoader(dataset, batch_sampler=sampler)``; call ``set_epoch(e)`` before each epoch.
    groups=None gives ordinary random batches (the control run) and needs num_samples.

    Resuming: ``state_dict()`` is {"epoch", "batches_consumed"}; after ``load_state_dict`` iteration
    continues at the next unconsumed batch of the same (deterministic) plan. The sampler counts the
    batches it has *yielded*; a DataLoader with workers prefetches ahead of the training step, so a
    trainer should save the number of batches it actually trained on as "batches_consumed".
    ``set_epoch`` with the epoch already set keeps the position (so resume + set_epoch works). The
    first iteration after ``load_state_dict`` yields exactly the unconsumed batches (none if the saved
    epoch was complete); otherwise iterating an epoch that was fully iterated starts it again.
    """

    def __init__(
        self,
        *,
        groups: np.ndarray | None,
        batch_size: int,
        seed: int,
        num_samples: int | None = None,
        world_size: int = 1,
        rank: int = 0,
        remainder_policy: str = "partial",
    ) -> None:
        super().__init__()
        _check_plan_args(
            batch_size=batch_size, seed=seed, epoch=0, world_size=world_size, rank=rank,
            remainder_policy=remainder_policy,
        )
        # Densify once: every epoch's plan_batches call then takes the cheap already-dense path.
        self._groups = None if groups is None else _prepare_groups(groups)[0]
        self._num_samples = num_samples
        if groups is None and not num_samples:
            raise ConfigError("groups=None (random batches) needs num_samples = len(dataset) > 0.")
        self.batch_size = batch_size
        self.seed = seed
        self.world_size = world_size
        self.rank = rank
        self.remainder_policy = remainder_policy
        self.epoch = 0
        self.batches_consumed = 0
        self._plan: BatchPlan | None = None
        self._plan_epoch = -1
        self._resuming = False

    def _current_plan(self) -> BatchPlan:
        if self._plan is None or self._plan_epoch != self.epoch:
            self._plan = plan_batches(
                groups=self._groups, num_samples=self._num_samples, batch_size=self.batch_size,
                seed=self.seed, epoch=self.epoch, world_size=self.world_size, rank=self.rank,
                remainder_policy=self.remainder_policy,
            )
            self._plan_epoch = self.epoch
        return self._plan

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}.")
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches_consumed = 0
            self._resuming = False

    @property
    def stats(self) -> dict:
        """The current epoch plan's stats (see BatchPlan)."""
        return dict(self._current_plan().stats)

    def __len__(self) -> int:
        """Batches in a full epoch (not only the ones left after a resume)."""
        return len(self._current_plan())

    def __iter__(self) -> Iterator[list[int]]:
        plan = self._current_plan()
        if self.batches_consumed >= len(plan) and not self._resuming:
            self.batches_consumed = 0
        self._resuming = False
        while self.batches_consumed < len(plan):
            batch = plan.batch(self.batches_consumed)
            self.batches_consumed += 1
            yield batch.tolist()

    def planned_rows(self, *, epoch: int, start: int) -> Iterator[np.ndarray]:
        """int64 (b,) rows of every batch of ``epoch`` from batch ``start`` on: what a ``BatchSource`` of the
        engine yields its batches from (``contrastive.engine.task``)."""
        self.load_state_dict({"epoch": epoch, "batches_consumed": start})
        for planned in self:
            yield np.asarray(planned, dtype=np.int64)

    def state_dict(self) -> dict:
        return {"epoch": int(self.epoch), "batches_consumed": int(self.batches_consumed)}

    def load_state_dict(self, state: dict) -> None:
        try:
            epoch, consumed = int(state["epoch"]), int(state["batches_consumed"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(
                f"sampler state {state!r} is not a ClusterBatchSampler state_dict "
                "(needs int 'epoch' and 'batches_consumed'); the checkpoint may be from another sampler."
            ) from exc
        if epoch < 0 or consumed < 0:
            raise DataError(f"sampler state has negative values {state!r}; the checkpoint is corrupt.")
        self.epoch = epoch
        self.batches_consumed = consumed
        self._resuming = True
        if consumed > len(self._current_plan()):
            raise DataError(
                f"sampler state says {consumed} batches were consumed but epoch {epoch} has only "
                f"{len(self._plan)}; the groups, batch size or world size changed since the checkpoint: "
                "resume with the same settings or start the stage afresh."
            )
