"""How HEX chooses, at each step, the threshold epsilon, the hierarchy sets H(i) and the weights Q.

HEX (local hierarchy exploitation) reweights the InfoNCE denominator (see :func:`contrastive.losses.hex_cross_entropy`):
negatives in H(i), the ones most similar to the anchor (or sharing its earlier-stage k-means cluster), count with
weight Q instead of 1. Everything here runs without gradient: H, epsilon and Q are choices, not learnt.

Schedules read ``progress`` = step / total_steps in [0, 1]. The training loop tells the method the run length
once through ``ContrastiveMethod.on_train_start(total_steps=...)`` (it knows the sampler's length), so the config
never carries a number derived from the data size and a resumed run sees the same schedule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from contrastive.errors import ConfigError

# The library's settings dataclasses are also the config schema's sections (one definition of each setting and
# rule): pydantic validates them field by field, rejects unknown keys with this, and runs their __post_init__.
STRICT = {"extra": "forbid"}

EPSILON_MODES = ("fixed", "step", "cosine", "adaptive")
Q_MODES = ("constant", "schedule", "similarity")
HIERARCHIES = ("threshold", "earlier_clusters")


# ---------------------------------------------------------------------------------------------------- schedules
def cosine_schedule(*, start: float, end: float, progress: float) -> float:
    """Half-cosine from ``start`` (progress 0) to ``end`` (progress 1): end + (start - end)(1 + cos(pi t)) / 2."""
    t = min(1.0, max(0.0, progress))
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * t))


def step_schedule(*, start: float, end: float, milestones: tuple[float, ...], progress: float) -> float:
    """Piecewise constant: ``start``, then after each of the M milestones (fractions of training) one equal jump
    towards ``end``; after the last milestone it is ``end``."""
    passed = sum(progress >= m for m in milestones)
    return start + (end - start) * passed / len(milestones)


@torch.no_grad()
def percentile(values: torch.Tensor, q: float) -> float:
    """The q-th percentile (0-100) of a 1-D tensor with numpy's default linear interpolation.

    Uses two ``kthvalue`` calls rather than ``torch.quantile``, which refuses inputs above 16M elements (a gathered
    (2BW)^2 cosine matrix gets there).
    """
    flat = values.detach().flatten().float()
    if flat.numel() == 0:
        return float("nan")
    position = q / 100.0 * (flat.numel() - 1)
    low, high = math.floor(position), math.ceil(position)
    v_low = flat.kthvalue(low + 1).values.item()
    v_high = v_low if high == low else flat.kthvalue(high + 1).values.item()
    return v_low + (v_high - v_low) * (position - low)


def progress_of(*, step: int, total_steps: int | None) -> float:
    if not total_steps:
        raise ConfigError("HEX epsilon/Q schedules need the run length: call method.on_train_start(total_steps=...) "
                          "before training_loss (the engine loop does, through the task's on_train_start), or use a fixed epsilon "
                          "and a constant Q")
    return min(1.0, step / total_steps)


# ---------------------------------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class EpsilonRule:
    """The cosine threshold above which a negative joins H(i).

    fixed: ``value``; step / cosine: from ``start`` to ``end`` over training (step jumps at ``milestones``);
    adaptive: the ``percentile``-th percentile of this batch's anchor-negative cosines (so H(i) holds about
    (100 - percentile)% of the negatives whatever the current anisotropy of the embedding).
    """

    __pydantic_config__ = STRICT
    mode: str = "adaptive"
    value: float = 0.5
    start: float = 0.8
    end: float = 0.4
    milestones: tuple[float, ...] = (0.5,)
    percentile: float = 90.0

    def __post_init__(self):
        if self.mode not in EPSILON_MODES:
            raise ConfigError(f"method.hex.epsilon.mode {self.mode!r} is unknown: use one of "
                              f"{', '.join(EPSILON_MODES)}")
        for name in ("value", "start", "end"):
            if not -1.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"method.hex.epsilon.{name}={getattr(self, name)} is not a cosine: use a value "
                                  f"in [-1, 1]")
        if not 0.0 < self.percentile < 100.0:
            raise ConfigError(f"method.hex.epsilon.percentile={self.percentile} must be in (0, 100), e.g. 90")
        if self.mode == "step" and (not self.milestones or any(not 0 < m < 1 for m in self.milestones)
                                    or list(self.milestones) != sorted(set(self.milestones))):
            raise ConfigError(f"method.hex.epsilon.milestones={list(self.milestones)} must be increasing fractions "
                              f"of training in (0, 1), e.g. [0.5]")

    @property
    def needs_progress(self) -> bool:
        return self.mode in ("step", "cosine")

    def __call__(self, *, progress: float, negative_cosines: torch.Tensor) -> float:
        """negative_cosines: the 1-D anchor-negative cosines of this batch (read only by ``adaptive``)."""
        if self.mode == "fixed":
            return self.value
        if self.mode == "step":
            return step_schedule(start=self.start, end=self.end, milestones=self.milestones, progress=progress)
        if self.mode == "cosine":
            return cosine_schedule(start=self.start, end=self.end, progress=progress)
        return percentile(negative_cosines, self.percentile)


@dataclass(frozen=True)
class QRule:
    """The weight of the hierarchy negatives.

    constant: ``value``; schedule: half-cosine from ``start`` to ``end`` over training; similarity: per pair
    Q_in = clip(value * (1 - cos_in), 0, max), so the closer a negative is to the anchor (the likelier a
    false negative), the less it counts.
    """

    __pydantic_config__ = STRICT
    mode: str = "constant"
    value: float = 0.5
    start: float = 1.0
    end: float = 0.5
    max: float = 1.0

    def __post_init__(self):
        if self.mode not in Q_MODES:
            raise ConfigError(f"method.hex.q.mode {self.mode!r} is unknown: use one of {', '.join(Q_MODES)}")
        for name in ("value", "start", "end", "max"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"method.hex.q.{name}={value} must be a finite weight >= 0 (0 removes the "
                                  f"hierarchy negatives, 1 counts them fully)")

    @property
    def needs_progress(self) -> bool:
        return self.mode == "schedule"

    def __call__(self, *, progress: float, cosines: torch.Tensor) -> float | torch.Tensor:
        """cosines: (N, M) anchor-candidate cosines (read only by ``similarity``). Returns a float or (N, M)."""
        if self.mode == "constant":
            return self.value
        if self.mode == "schedule":
            return cosine_schedule(start=self.start, end=self.end, progress=progress)
        return (self.value * (1.0 - cosines)).clamp(min=0.0, max=self.max)


@dataclass(frozen=True)
class HexSelection:
    """What one step's loss needs: H (N, M) bool, Q (float or (N, M)), the epsilon used (None with groups)."""

    hierarchy: torch.Tensor
    q: float | torch.Tensor
    epsilon: float | None
    from_groups: bool

    def stats(self) -> dict[str, float]:
        from contrastive.losses import hex_stats
        return {**hex_stats(epsilon=self.epsilon, hierarchy=self.hierarchy, q=self.q),
                "hex/from_groups": float(self.from_groups)}


@dataclass(frozen=True)
class HexSettings:
    """The ``method.hex`` section: HEX on or off, where H(i) comes from (``threshold``: cosine > epsilon;
    ``earlier_clusters``: same pseudo-label of the earlier MCL stages, stage 0 falling back to the threshold), the
    epsilon rule and the Q rule. A HEX pipeline's control run is the same method with HEX off."""

    __pydantic_config__ = STRICT
    enabled: bool = False
    hierarchy: str = "threshold"
    epsilon: EpsilonRule = EpsilonRule()
    q: QRule = QRule()

    def __post_init__(self):
        HexRule(epsilon=self.epsilon, q=self.q, hierarchy=self.hierarchy)  # the rule's own checks

    def rule(self) -> "HexRule | None":
        return HexRule(epsilon=self.epsilon, q=self.q, hierarchy=self.hierarchy) if self.enabled else None


@dataclass(frozen=True)
class HexRule:
    """epsilon rule + Q rule + where H(i) comes from: ``threshold`` (cosine > epsilon) or ``earlier_clusters``
    (same pseudo-label of the earlier MCL stages; falls back to the threshold when a batch comes without group ids,
    as on stage 0, and logs ``hex/from_groups`` = 0)."""

    epsilon: EpsilonRule = EpsilonRule()
    q: QRule = QRule()
    hierarchy: str = "threshold"

    def __post_init__(self):
        if self.hierarchy not in HIERARCHIES:
            raise ConfigError(f"method.hex.hierarchy {self.hierarchy!r} is unknown: use one of "
                              f"{', '.join(HIERARCHIES)}")

    @classmethod
    def from_config(cls, config: dict | None) -> "HexRule | None":
        """The ``method.hex`` section as a JSON dict (``HexSettings``) -> a rule, or None when HEX is off."""
        if not config or not config.get("enabled", False):
            return None
        epsilon = dict(config.get("epsilon", {}))
        if "milestones" in epsilon:
            epsilon["milestones"] = tuple(epsilon["milestones"])
        return HexSettings(enabled=True, hierarchy=config.get("hierarchy", "threshold"),
                           epsilon=EpsilonRule(**epsilon), q=QRule(**config.get("q", {}))).rule()

    @property
    def wants_groups(self) -> bool:
        return self.hierarchy == "earlier_clusters"

    @property
    def needs_progress(self) -> bool:
        return self.epsilon.needs_progress or self.q.needs_progress

    @torch.no_grad()
    def select(self, *, cosines: torch.Tensor, negatives: torch.Tensor, step: int, total_steps: int | None,
               anchor_groups: torch.Tensor | None = None, candidate_groups: torch.Tensor | None = None
               ) -> HexSelection:
        """Choose H(i) and Q for one step.

        cosines: (N, M) anchor-candidate cosines (no grad); negatives: (N, M) bool, which candidates are negatives
        of each anchor; anchor_groups (N,), candidate_groups (M,): int group ids (-1 = unknown, never in H).
        """
        progress = progress_of(step=step, total_steps=total_steps) if self.needs_progress else 0.0
        q = self.q(progress=progress, cosines=cosines)
        if self.wants_groups and anchor_groups is not None and candidate_groups is not None:
            anchor_groups, candidate_groups = anchor_groups.to(cosines.device), candidate_groups.to(cosines.device)
            same = (anchor_groups[:, None] == candidate_groups[None, :]) & (anchor_groups[:, None] >= 0)
            return HexSelection(hierarchy=same & negatives, q=q, epsilon=None, from_groups=True)
        epsilon = self.epsilon(progress=progress, negative_cosines=cosines[negatives])
        return HexSelection(hierarchy=(cosines > epsilon) & negatives, q=q, epsilon=epsilon, from_groups=False)
