"""Hyper-CL ("Hyper-CL: Conditioning Sentence Representations with Hypernetworks"): a hypernetwork turns an
embedded condition c into a projection W_c of a precomputed sentence embedding s, so one embedding serves every
perspective and a new condition costs one small matrix product.

Low-rank form (the paper's sec. 3.4): two hypernetworks h1, h2 map c (Dc) to W1 = h1(c), W2 = h2(c) in R^{D x K},
and W_c = W1 W2^T (rank <= K); the conditioned embedding is s_c = W_c s = W1 (W2^T s).

C-STS objective (sec. 3.3) on quadruples (s1, s2, c_high, c_low), where the pair is more similar under c_high:
    L_cl  = -log( e^{cos(s1_h, s2_h) / tau} / (e^{cos(s1_h, s2_h) / tau} + e^{cos(s1_l, s2_l) / tau}) )
    L_mse = mean over both conditions of (cos(s1_c, s2_c) - y_c)^2,  y_c = the gold score scaled to [0, 1]
    L     = L_cl + mse_weight * L_mse          (tau high, as the paper does, so the labels' MSE keeps its weight)

A "plain linear projection per condition" (the baseline) is the same module fed one-hot conditions with a linear
hypernetwork: each condition then owns its own low-rank matrix.

Training runs on the one engine (``contrastive.engine.loop.train``) through ``HyperTask``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.loop import train
from contrastive.engine.task import LoopSpec, OptimSpec, StageTask
from contrastive.errors import ConfigError
from contrastive.mcl.sampler import ClusterBatchSampler


class HyperProjection(nn.Module):
    """h1, h2: (B, Dc) -> (B, D, K) each (linear, or a one-hidden-layer MLP when ``hidden``); forward(s (B, D),
    c (B, Dc)) -> W1 (W2^T s) (B, D)."""

    def __init__(self, *, condition_dim: int, embedding_dim: int, rank: int, hidden: int | None = None):
        super().__init__()
        if rank < 1 or rank > embedding_dim:
            raise ConfigError(f"hyper.rank must be in [1, {embedding_dim}] (the embedding size), got {rank}")
        self.embedding_dim, self.rank = embedding_dim, rank

        def hypernetwork() -> nn.Module:
            out = embedding_dim * rank
            if hidden:
                return nn.Sequential(nn.Linear(condition_dim, hidden), nn.GELU(), nn.Linear(hidden, out))
            return nn.Linear(condition_dim, out)

        self.h1, self.h2 = hypernetwork(), hypernetwork()

    def factors(self, conditions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(W1, W2), each (B, D, K)."""
        shape = (len(conditions), self.embedding_dim, self.rank)
        return self.h1(conditions).view(shape), self.h2(conditions).view(shape)

    def matrices(self, conditions: torch.Tensor) -> torch.Tensor:
        """W_c = W1 W2^T: (B, D, D), rank <= K (what can be cached once per condition)."""
        w1, w2 = self.factors(conditions)
        return w1 @ w2.transpose(1, 2)

    def forward(self, sentences: torch.Tensor, conditions: torch.Tensor) -> torch.Tensor:
        w1, w2 = self.factors(conditions)
        return (w1 @ (w2.transpose(1, 2) @ sentences[..., None]))[..., 0]


def conditioned_cosine(model: HyperProjection, s1: torch.Tensor, s2: torch.Tensor,
                       conditions: torch.Tensor) -> torch.Tensor:
    """(B,) cos(W_c s1, W_c s2)."""
    return F.cosine_similarity(model(s1, conditions), model(s2, conditions), dim=1)


def hyper_cl_loss(*, model: HyperProjection, s1: torch.Tensor, s2: torch.Tensor, c_high: torch.Tensor,
                  c_low: torch.Tensor, y_high: torch.Tensor, y_low: torch.Tensor, temperature: float,
                  mse_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The C-STS objective of the module docstring over a batch of B quadruples; y_*: (B,) scores in [0, 1]."""
    high = conditioned_cosine(model, s1, s2, c_high)
    low = conditioned_cosine(model, s1, s2, c_low)
    logits = torch.stack([high, low], dim=1) / temperature
    contrastive = F.cross_entropy(logits, torch.zeros(len(high), dtype=torch.long, device=high.device))
    mse = 0.5 * (((high - y_high) ** 2).mean() + ((low - y_low) ** 2).mean())
    loss = contrastive + mse_weight * mse
    return loss, {"hyper/cl": contrastive.detach(), "hyper/mse": mse.detach(),
                  "hyper/margin": (high - low).detach().mean()}


# ---------------------------------------------------------------------------------------------------- data
@dataclass
class Quadruples:
    """N C-STS quadruples over precomputed embeddings: s1, s2 (N, D); c_high, c_low (N, Dc); y_high, y_low (N,)
    in [0, 1]."""
    s1: np.ndarray
    s2: np.ndarray
    c_high: np.ndarray
    c_low: np.ndarray
    y_high: np.ndarray
    y_low: np.ndarray

    def __len__(self) -> int:
        return len(self.s1)

    def subset(self, rows: np.ndarray) -> "Quadruples":
        return Quadruples(*(getattr(self, f)[rows] for f in ("s1", "s2", "c_high", "c_low", "y_high", "y_low")))


def quadruples_from_pairs(pairs, *, embed: dict[str, np.ndarray], condition_vectors: dict[str, np.ndarray],
                          score_range: tuple[float, float]) -> tuple[Quadruples, list[tuple[str, str, str, str]]]:
    """Group C-STS rows by sentence pair and keep each pair's highest- and lowest-scored conditions (pairs judged
    under one condition only, or with equal scores, are skipped). ``embed``: sentence -> (D,) embedding;
    ``condition_vectors``: condition -> (Dc,). Returns the quadruples and their (s1, s2, c_high, c_low) texts."""
    low_score, high_score = score_range
    if high_score <= low_score:
        raise ConfigError(f"score range {score_range} is empty: give (min, max) of the gold scores")
    by_pair: dict[tuple[str, str], list] = {}
    for p in pairs:
        by_pair.setdefault((p.sentence1, p.sentence2), []).append(p)
    rows, texts = [], []
    for (a, b), judged in by_pair.items():
        judged = sorted(judged, key=lambda p: p.score)
        low, high = judged[0], judged[-1]
        if high.score == low.score:
            continue
        scale = lambda v: (v - low_score) / (high_score - low_score)  # noqa: E731
        rows.append((embed[a], embed[b], condition_vectors[high.condition], condition_vectors[low.condition],
                     scale(high.score), scale(low.score)))
        texts.append((a, b, high.condition, low.condition))
    if not rows:
        raise ConfigError("no C-STS pair is judged under two conditions with different scores: Hyper-CL trains on "
                          "such pairs (each pair listed once per condition)")
    columns = list(zip(*rows))
    return Quadruples(*(np.asarray(c, dtype=np.float32) for c in columns)), texts


# ---------------------------------------------------------------------------------------------------- engine
@dataclass
class QuadrupleBatch:
    rows: np.ndarray
    tensors: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take(self, n: int) -> "QuadrupleBatch":
        return QuadrupleBatch(rows=self.rows[:n], tensors={k: v[:n] for k, v in self.tensors.items()})

    @property
    def keys(self) -> list[str]:
        return [str(r) for r in self.rows]


class QuadrupleSource:
    """Random batches of quadruples (one process)."""

    def __init__(self, *, data: Quadruples, batch_size: int, seed: int):
        self.data = data
        self.sampler = ClusterBatchSampler(groups=None, num_samples=len(data), batch_size=min(batch_size, len(data)),
                                           seed=seed)

    def __len__(self) -> int:
        return len(self.sampler)

    def batches(self, *, epoch: int, start: int) -> Iterator[QuadrupleBatch]:
        self.sampler.load_state_dict({"epoch": epoch, "batches_consumed": start})
        for planned in self.sampler:
            rows = np.asarray(planned, dtype=np.int64)
            part = self.data.subset(rows)
            yield QuadrupleBatch(rows=rows, tensors={k: torch.from_numpy(np.ascontiguousarray(getattr(part, k)))
                                                     for k in ("s1", "s2", "c_high", "c_low", "y_high", "y_low")})


class HyperStep(nn.Module):
    def __init__(self, model: HyperProjection, *, temperature: float, mse_weight: float):
        super().__init__()
        self.model, self.temperature, self.mse_weight = model, temperature, mse_weight

    def forward(self, **batch):
        return hyper_cl_loss(model=self.model, temperature=self.temperature, mse_weight=self.mse_weight, **batch)


class HyperTask(StageTask):
    """Hyper-CL's projection trained on precomputed embeddings (the encoder stays frozen)."""

    def __init__(self, *, model: HyperProjection, temperature: float, mse_weight: float):
        self.model = model
        self.generators = {}
        self.temperature, self.mse_weight = temperature, mse_weight

    def forward_module(self) -> nn.Module:
        return HyperStep(self.model, temperature=self.temperature, mse_weight=self.mse_weight)

    def inputs(self, batch: QuadrupleBatch, *, device: torch.device, step: int) -> dict:
        return {k: v.to(device) for k, v in batch.tensors.items()}


@dataclass(frozen=True)
class HyperSpec:
    rank: int = 16
    hidden: int | None = None
    temperature: float = 1.0
    mse_weight: float = 1.0
    batch_size: int = 64
    seed: int = 0


def train_hyper(*, data: Quadruples, spec: HyperSpec, optim: OptimSpec, loop: LoopSpec, checkpoint_path: Path,
                device: torch.device, callbacks=()) -> tuple[HyperProjection, dict]:
    """Train a fresh ``HyperProjection`` on ``data`` with the engine; returns (model in eval mode, summary)."""
    torch.manual_seed(spec.seed)
    model = HyperProjection(condition_dim=data.c_high.shape[1], embedding_dim=data.s1.shape[1], rank=spec.rank,
                            hidden=spec.hidden)
    task = HyperTask(model=model, temperature=spec.temperature, mse_weight=spec.mse_weight)
    result = train(task=task, source=QuadrupleSource(data=data, batch_size=spec.batch_size, seed=spec.seed),
                   optim=optim, loop=loop, device=device, checkpoint_path=checkpoint_path, callbacks=list(callbacks))
    return model.eval(), {"steps": result.steps, "final_loss": result.final_loss, "seconds": result.seconds,
                          "history": result.history}


# ---------------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def quadruple_loss(model: HyperProjection, data: Quadruples, *, temperature: float, mse_weight: float) -> float:
    t = {k: torch.from_numpy(getattr(data, k)) for k in ("s1", "s2", "c_high", "c_low", "y_high", "y_low")}
    model = model.cpu()
    return float(hyper_cl_loss(model=model, temperature=temperature, mse_weight=mse_weight, **t)[0])


def pair_accuracy(model: HyperProjection | None, data: Quadruples) -> float:
    """Fraction of quadruples whose pair is more similar under c_high than under c_low (0.5 = no conditioning;
    the unconditioned representation, ``model`` None, scores the same similarity under both: 0)."""
    if model is None:
        return 0.0
    with torch.no_grad():
        s1, s2 = torch.from_numpy(data.s1), torch.from_numpy(data.s2)
        high = conditioned_cosine(model.cpu(), s1, s2, torch.from_numpy(data.c_high))
        low = conditioned_cosine(model, s1, s2, torch.from_numpy(data.c_low))
    return float((high > low).float().mean())


def conditioned_spearman(model: HyperProjection | None, data: Quadruples) -> float:
    """Spearman between the (conditioned) cosine and the gold scores over both conditions of every quadruple;
    ``model`` None scores the unconditioned cosine."""
    from contrastive.modalities.text.steps import spearman

    s1, s2 = np.concatenate([data.s1, data.s1]), np.concatenate([data.s2, data.s2])
    gold = np.concatenate([data.y_high, data.y_low])
    if model is None:
        unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
        cos = (unit(s1) * unit(s2)).sum(axis=1)
    else:
        with torch.no_grad():
            cos = conditioned_cosine(model.cpu(), torch.from_numpy(s1), torch.from_numpy(s2), torch.from_numpy(
                np.concatenate([data.c_high, data.c_low]))).numpy()
    return spearman(cos, gold)


def recall_at_k(embeddings: np.ndarray, labels: np.ndarray, *, k: int) -> float:
    """Retrieval recall@k: the fraction of queries (every row with a label >= 0) whose k nearest other rows by
    cosine include at least one row with the same label."""
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    valid = np.flatnonzero(labels >= 0)
    sims = sims[np.ix_(valid, valid)]
    nearest = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    hits = (labels[valid][nearest] == labels[valid][:, None]).any(axis=1)
    return float(hits.mean())


@torch.no_grad()
def project(model: HyperProjection, embeddings: np.ndarray, condition: np.ndarray) -> np.ndarray:
    """Every row of ``embeddings`` (N, D) under one condition (Dc,): W_c is built once, then one (N, D) x (D, D)
    product; this is the cost of a new condition over cached embeddings."""
    w = model.cpu().matrices(torch.from_numpy(condition[None].astype(np.float32)))[0]
    return (torch.from_numpy(embeddings.astype(np.float32)) @ w.T).numpy()


def timed(fn, *, repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best
