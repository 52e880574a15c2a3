"""How HEX chooses, at each step, the threshold epsilon, the hierarchy sets H(i) and the weights Q.

HEX (local hierarchy exploitation) reweights the InfoNCE denominator (see :func:`contrastive.methods.losses.hex_cross_entropy`):
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
EPSILON_SCALES = ("cosine", "minmax")
ADAPTIVE_REDUCTIONS = ("pooled", "row_mean")
Q_MODES = ("constant", "schedule", "similarity")
HIERARCHIES = ("threshold", "earlier_clusters", "online_clusters")
WEIGHTINGS = ("q", "hard_negative")


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


@torch.no_grad()
def row_percentiles(values: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """(N,) the q-th percentile (numpy's linear interpolation) of each row's masked entries of ``values`` (N, M);
    NaN for a row with no entry. Rows may hold different numbers of entries."""
    counts = mask.sum(dim=1)
    ordered = values.float().masked_fill(~mask, float("inf")).sort(dim=1).values
    position = q / 100.0 * (counts - 1).clamp(min=0).float()
    low, high = position.floor().long(), position.ceil().long()
    v_low, v_high = ordered.gather(1, low[:, None])[:, 0], ordered.gather(1, high[:, None])[:, 0]
    result = v_low + (v_high - v_low).nan_to_num(0.0) * (position - low.float())
    return result.masked_fill(counts == 0, float("nan"))


@torch.no_grad()
def minmax_rows(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, M) each row's masked entries rescaled to [0, 1] by that row's masked min and max (the HEX authors'
    min-max normalised cosine): (c_in - min_n c_in) / (max_n c_in - min_n c_in). A row whose entries are all
    equal maps to 0; entries outside ``mask`` are 0."""
    values = values.float()
    low = values.masked_fill(~mask, float("inf")).min(dim=1, keepdim=True).values
    high = values.masked_fill(~mask, float("-inf")).max(dim=1, keepdim=True).values
    span = (high - low).nan_to_num(0.0)
    scaled = torch.where(span > 0, (values - low) / span.clamp(min=1e-12), torch.zeros_like(values))
    return scaled.masked_fill(~mask, 0.0)


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

    ``scale``: what epsilon is compared with. ``cosine``: the cosine itself. ``minmax`` (the HEX authors'): each
    anchor's cosines to its negatives rescaled to [0, 1] by the row's min and max,
        c~_in = (c_in - min_n c_in) / (max_n c_in - min_n c_in),
    so epsilon = 0.9 keeps the negatives in the top tenth of each anchor's own range. ``reduce`` (adaptive only):
    ``pooled`` = one percentile over every anchor-negative pair of the batch; ``row_mean`` (the authors') =
    the mean over anchors of each anchor's own percentile, eps = (1/N) sum_i P_q({c~_in : n negative of i}).
    """

    __pydantic_config__ = STRICT
    mode: str = "adaptive"
    value: float = 0.5
    start: float = 0.8
    end: float = 0.4
    milestones: tuple[float, ...] = (0.5,)
    percentile: float = 90.0
    scale: str = "cosine"
    reduce: str = "pooled"

    #: Fields added after the first version: left out of content keys while at their defaults.
    LATER = ("scale", "reduce")

    def __post_init__(self):
        if self.mode not in EPSILON_MODES:
            raise ConfigError(f"method.hex.epsilon.mode {self.mode!r} is unknown: use one of "
                              f"{', '.join(EPSILON_MODES)}")
        if self.scale not in EPSILON_SCALES:
            raise ConfigError(f"method.hex.epsilon.scale {self.scale!r} is unknown: use one of "
                              f"{', '.join(EPSILON_SCALES)}")
        if self.reduce not in ADAPTIVE_REDUCTIONS:
            raise ConfigError(f"method.hex.epsilon.reduce {self.reduce!r} is unknown: use one of "
                              f"{', '.join(ADAPTIVE_REDUCTIONS)}")
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

    def scores(self, *, cosines: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        """(N, M) what epsilon is compared with: the cosines, or their per-anchor min-max rescaling."""
        return minmax_rows(cosines, negatives) if self.scale == "minmax" else cosines

    def __call__(self, *, progress: float, scores: torch.Tensor, negatives: torch.Tensor) -> float:
        """scores: (N, M) from :meth:`scores`; negatives: (N, M) bool (both read only by ``adaptive``)."""
        if self.mode == "fixed":
            return self.value
        if self.mode == "step":
            return step_schedule(start=self.start, end=self.end, milestones=self.milestones, progress=progress)
        if self.mode == "cosine":
            return cosine_schedule(start=self.start, end=self.end, progress=progress)
        if self.reduce == "row_mean":
            per_row = row_percentiles(scores, negatives, self.percentile)
            return per_row[~per_row.isnan()].mean().item() if bool((~per_row.isnan()).any()) else float("nan")
        return percentile(scores[negatives], self.percentile)


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
class HardNegativeSettings:
    """The ``method.hex.hard`` section, read with ``weighting: hard_negative`` (the HEX authors' weighting): the
    class prior tau+ of the debiased estimate (Chuang et al., 2020) and the concentration beta of the hard-negative
    importance weights (Robinson et al., 2021). See :func:`contrastive.methods.losses.hard_negative_hierarchy_term`."""

    __pydantic_config__ = STRICT
    tau_plus: float = 0.1
    beta: float = 1.0

    def __post_init__(self):
        if not 0.0 <= self.tau_plus < 1.0:
            raise ConfigError(f"method.hex.hard.tau_plus={self.tau_plus} must be in [0, 1): the share of "
                              f"negatives that are truly positives (the HEX authors use 0.1)")
        if not (self.beta >= 0 and math.isfinite(self.beta)):
            raise ConfigError(f"method.hex.hard.beta={self.beta} must be a finite value >= 0 (0: uniform weights, "
                              f"the authors use 1)")


@dataclass(frozen=True)
class OnlineClusterSettings:
    """The ``method.hex.online`` section, read with ``hierarchy: online_clusters``: K centroids of the current
    stage's own projections, learnt by mini-batch spherical k-means while the stage trains
    (:class:`contrastive.methods.online_clusters.OnlineClusters`). ``min_rate`` keeps each centroid's step
    n_c / N_c from decaying below it, so the centroids follow an encoder that is still learning."""

    __pydantic_config__ = STRICT
    k: int = 8
    min_rate: float = 0.05

    def __post_init__(self):
        if self.k < 2:
            raise ConfigError(f"method.hex.online.k={self.k} must be >= 2: one online cluster cannot split a batch")
        if not 0.0 < self.min_rate <= 1.0:
            raise ConfigError(f"method.hex.online.min_rate={self.min_rate} must be in (0, 1], e.g. 0.05")


@dataclass(frozen=True)
class HexSelection:
    """What one step's loss needs: H (N, M) bool, Q (float, (N, M), or the hard-negative weighting), the epsilon
    used (None with groups or online clusters), whether HEX is still in its warm-up (then H is empty)."""

    hierarchy: torch.Tensor
    q: "float | torch.Tensor | HardNegativeWeighting"
    epsilon: float | None
    from_groups: bool
    warmup: bool = False

    def stats(self) -> dict[str, float]:
        from contrastive.methods.losses import hex_stats
        return {**hex_stats(epsilon=self.epsilon, hierarchy=self.hierarchy, q=self.q),
                "hex/from_groups": float(self.from_groups), "hex/warmup": float(self.warmup)}


@dataclass(frozen=True)
class HexSettings:
    """The ``method.hex`` section: HEX on or off, where H(i) comes from (``threshold``: score > epsilon;
    ``earlier_clusters``: same pseudo-label of the earlier MCL stages, stage 0 falling back to the threshold;
    ``online_clusters``: same online k-means cluster of the CURRENT stage's projections, intersected with the
    earlier stages' pseudo-label when the batch has one), the epsilon rule, how H(i) is weighted (``q``: by the Q
    rule; ``hard_negative``: the authors' debiased hard-negative estimate, ``hard``), and a warm-up of plain
    InfoNCE (``warmup_epochs``, the authors use 10). A HEX pipeline's control run is the same method with HEX off.
    :meth:`authors` gives the HEX authors' own settings."""

    __pydantic_config__ = STRICT
    enabled: bool = False
    hierarchy: str = "threshold"
    epsilon: EpsilonRule = EpsilonRule()
    q: QRule = QRule()
    weighting: str = "q"
    hard: HardNegativeSettings = HardNegativeSettings()
    warmup_epochs: float = 0.0
    online: OnlineClusterSettings = OnlineClusterSettings()

    #: Fields added after the first version: left out of content keys while at their defaults.
    LATER = ("weighting", "hard", "warmup_epochs", "online")

    def __post_init__(self):
        self._rule()  # the rule's own checks

    def _rule(self) -> "HexRule":
        return HexRule(epsilon=self.epsilon, q=self.q, hierarchy=self.hierarchy, weighting=self.weighting,
                       hard=self.hard, warmup_epochs=self.warmup_epochs, online=self.online)

    def rule(self) -> "HexRule | None":
        return self._rule() if self.enabled else None

    @classmethod
    def authors(cls, **overrides) -> "HexSettings":
        """The HEX authors' way: H(i) = min-max normalised cosine above 0.9, stepped down to 0.7 (at a third and two
        thirds of training), weighted by the debiased hard-negative estimate (tau+ 0.1, beta 1), after 10 epochs of
        plain InfoNCE. (The poster gives no schedule past its start; 0.9 -> 0.8 -> 0.7 is ours.)"""
        base = dict(enabled=True, hierarchy="threshold", weighting="hard_negative", warmup_epochs=10.0,
                    epsilon=EpsilonRule(mode="step", scale="minmax", start=0.9, end=0.7, milestones=(1 / 3, 2 / 3)),
                    hard=HardNegativeSettings(tau_plus=0.1, beta=1.0))
        return cls(**{**base, **overrides})


def hex_key_content(section: dict) -> dict:
    """The ``method.hex`` section as JSON for cache keys: the fields added after the first version (and the
    epsilon rule's) are left out while at their defaults, so configs written before them keep their keys."""
    out = dict(section)
    defaults = HexSettings()
    for name in HexSettings.LATER:
        value = getattr(defaults, name)
        default = _json_of(value)
        if name in out and out[name] == default:
            out.pop(name)
    if isinstance(out.get("epsilon"), dict):
        epsilon = dict(out["epsilon"])
        for name in EpsilonRule.LATER:
            if name in epsilon and epsilon[name] == getattr(EpsilonRule(), name):
                epsilon.pop(name)
        out["epsilon"] = epsilon
    return out


def _json_of(value):
    from dataclasses import asdict, is_dataclass
    if is_dataclass(value):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(value).items()}
    return value


@dataclass(frozen=True)
class HexRule:
    """epsilon rule + Q rule + where H(i) comes from (``threshold``, ``earlier_clusters``, ``online_clusters``) +
    how it is weighted (``q`` or ``hard_negative``) + the warm-up. ``earlier_clusters`` falls back to the threshold
    when a batch comes without group ids, as on stage 0, and logs ``hex/from_groups`` = 0."""

    epsilon: EpsilonRule = EpsilonRule()
    q: QRule = QRule()
    hierarchy: str = "threshold"
    weighting: str = "q"
    hard: HardNegativeSettings = HardNegativeSettings()
    warmup_epochs: float = 0.0
    online: OnlineClusterSettings = OnlineClusterSettings()

    def __post_init__(self):
        if self.hierarchy not in HIERARCHIES:
            raise ConfigError(f"method.hex.hierarchy {self.hierarchy!r} is unknown: use one of "
                              f"{', '.join(HIERARCHIES)}")
        if self.weighting not in WEIGHTINGS:
            raise ConfigError(f"method.hex.weighting {self.weighting!r} is unknown: use one of "
                              f"{', '.join(WEIGHTINGS)}")
        if not (self.warmup_epochs >= 0 and math.isfinite(self.warmup_epochs)):
            raise ConfigError(f"method.hex.warmup_epochs={self.warmup_epochs} must be >= 0 (0: HEX from the first "
                              f"step; the authors use 10)")

    @classmethod
    def from_config(cls, config: dict | None) -> "HexRule | None":
        """The ``method.hex`` section as a JSON dict (``HexSettings``) -> a rule, or None when HEX is off."""
        if not config or not config.get("enabled", False):
            return None
        epsilon = dict(config.get("epsilon", {}))
        if "milestones" in epsilon:
            epsilon["milestones"] = tuple(epsilon["milestones"])
        return HexSettings(enabled=True, hierarchy=config.get("hierarchy", "threshold"),
                           epsilon=EpsilonRule(**epsilon), q=QRule(**config.get("q", {})),
                           weighting=config.get("weighting", "q"),
                           hard=HardNegativeSettings(**config.get("hard", {})),
                           warmup_epochs=float(config.get("warmup_epochs", 0.0)),
                           online=OnlineClusterSettings(**config.get("online", {}))).rule()

    @property
    def wants_groups(self) -> bool:
        return self.hierarchy in ("earlier_clusters", "online_clusters")

    @property
    def wants_online_clusters(self) -> bool:
        return self.hierarchy == "online_clusters"

    @property
    def needs_progress(self) -> bool:
        return self.epsilon.needs_progress or self.q.needs_progress

    def warmup_steps(self, *, total_steps: int | None, epochs: int | None) -> int:
        """Steps of plain InfoNCE before HEX starts: warmup_epochs x (total_steps / epochs)."""
        if self.warmup_epochs <= 0:
            return 0
        if not total_steps or not epochs:
            raise ConfigError("method.hex.warmup_epochs needs the run length in steps and epochs: call "
                              "method.on_train_start(total_steps=..., epochs=...) before training_loss (the image "
                              "task does), or set method.hex.warmup_epochs=0")
        if self.warmup_epochs >= epochs:
            raise ConfigError(f"method.hex.warmup_epochs={self.warmup_epochs} is not below train.epochs={epochs}: "
                              f"HEX would never start; lower method.hex.warmup_epochs or raise train.epochs")
        return round(self.warmup_epochs * total_steps / epochs)

    def weights(self, *, progress: float, cosines: torch.Tensor):
        """Q for this step: the Q rule's value, or the hard-negative weighting (read by the loss)."""
        if self.weighting == "hard_negative":
            from contrastive.methods.losses import HardNegativeWeighting
            return HardNegativeWeighting(tau_plus=self.hard.tau_plus, beta=self.hard.beta)
        return self.q(progress=progress, cosines=cosines)

    @torch.no_grad()
    def select(self, *, cosines: torch.Tensor, negatives: torch.Tensor, step: int, total_steps: int | None,
               anchor_groups: torch.Tensor | None = None, candidate_groups: torch.Tensor | None = None,
               epochs: int | None = None, anchor_clusters: torch.Tensor | None = None,
               candidate_clusters: torch.Tensor | None = None) -> HexSelection:
        """Choose H(i) and Q for one step.

        cosines: (N, M) anchor-candidate cosines (no grad); negatives: (N, M) bool, which candidates are negatives
        of each anchor; anchor_groups (N,), candidate_groups (M,): int group ids (-1 = unknown, never in H);
        anchor_clusters (N,), candidate_clusters (M,): online cluster ids (``online_clusters``). During the
        warm-up (step < :meth:`warmup_steps`) H is empty, which makes every HEX loss plain InfoNCE; the epsilon and
        Q schedules then run over the remaining steps, (step - warmup) / (total_steps - warmup).
        """
        step = int(step)  # the engine passes a 0-dim tensor (a compiled forward would recompile on an int)
        warmup = self.warmup_steps(total_steps=total_steps, epochs=epochs)
        # Schedules run over the HEX phase: epsilon starts at its start value when the warm-up ends.
        progress = progress_of(step=max(0, step - warmup), total_steps=None if total_steps is None
                               else total_steps - warmup) if self.needs_progress else 0.0
        q = self.weights(progress=progress, cosines=cosines)
        if step < warmup:
            return HexSelection(hierarchy=torch.zeros_like(negatives, dtype=torch.bool), q=q, epsilon=None,
                                from_groups=False, warmup=True)
        has_groups = anchor_groups is not None and candidate_groups is not None
        same_group = None
        if self.wants_groups and has_groups:
            anchor_groups, candidate_groups = anchor_groups.to(cosines.device), candidate_groups.to(cosines.device)
            same_group = (anchor_groups[:, None] == candidate_groups[None, :]) & (anchor_groups[:, None] >= 0)
        if self.wants_online_clusters:
            if anchor_clusters is None or candidate_clusters is None:
                raise ValueError("hierarchy online_clusters needs anchor_clusters and candidate_clusters")
            same = anchor_clusters.to(cosines.device)[:, None] == candidate_clusters.to(cosines.device)[None, :]
            if same_group is not None:  # nested: the earlier stages' group, split by the current stage's clusters
                same = same & same_group
            return HexSelection(hierarchy=same & negatives, q=q, epsilon=None, from_groups=same_group is not None)
        if same_group is not None:
            return HexSelection(hierarchy=same_group & negatives, q=q, epsilon=None, from_groups=True)
        scores = self.epsilon.scores(cosines=cosines, negatives=negatives)
        epsilon = self.epsilon(progress=progress, scores=scores, negatives=negatives)
        return HexSelection(hierarchy=(scores > epsilon) & negatives, q=q, epsilon=epsilon, from_groups=False)
