"""The text modality: batches of tokenized sentences -> a SimCSE loss, on the one engine.

A batch plan (``contrastive.mcl.sampler.ClusterBatchSampler``: cluster-pure batches for MCL stages >= 1, random
batches otherwise) gives the rows of every batch; their token ids were computed once for the whole training split
and each batch is cut to its longest sentence. Unsupervised SimCSE needs no augmentation beyond the encoder's own
dropout, so ``inputs`` only moves tokens to the device; supervised SimCSE's batches also carry each anchor's
entailment positive and contradiction hard negative.

The task also measures the isotropy diagnostics (``contrastive.modalities.text.isotropy``) on a fixed probe set of sentences
every ``isotropy_every_steps`` optimizer steps (and once before the first step), so they are logged with the
training metrics and kept as a trajectory: the learning dynamics, not only the end point.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import nn

from contrastive.engine.task import StageTask


@dataclass
class TokenArrays:
    """int64 (N, L) ids and (N, L) attention mask of N sentences, padded to a common L."""
    ids: np.ndarray
    mask: np.ndarray

    def rows(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' ids and mask as tensors, cut to the longest of them (at least 1 column)."""
        mask = self.mask[rows]
        width = max(1, int(mask.sum(axis=1).max())) if len(rows) else 1
        return torch.from_numpy(self.ids[rows, :width].copy()), torch.from_numpy(mask[:, :width].copy())


@dataclass
class TextBatch:
    """rows: int64 (b,) positions in the training split; ids (sample ids); input_ids / attention_mask (b, L);
    positive_* / negative_* (b, L') for supervised SimCSE, else None; groups (b,) pseudo-labels or None."""
    rows: np.ndarray
    ids: np.ndarray
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    groups: torch.Tensor | None = None
    positive_ids: torch.Tensor | None = None
    positive_mask: torch.Tensor | None = None
    negative_ids: torch.Tensor | None = None
    negative_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take(self, n: int) -> "TextBatch":
        cut = lambda t: None if t is None else t[:n]  # noqa: E731
        return TextBatch(rows=self.rows[:n], ids=self.ids[:n], input_ids=self.input_ids[:n],
                         attention_mask=self.attention_mask[:n], groups=cut(self.groups),
                         positive_ids=cut(self.positive_ids), positive_mask=cut(self.positive_mask),
                         negative_ids=cut(self.negative_ids), negative_mask=cut(self.negative_mask))

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in self.ids]


class TextBatchSource:
    """This process's batches of the training split, planned by ``sampler`` (rows of the split).

    tokens: the training sentences' tokens; positives / negatives: those of each row's NLI positive and hard
    negative (supervised SimCSE) or None; ids: (M,) sample ids; groups: (M,) pseudo-labels or None."""

    def __init__(self, *, sampler, tokens: TokenArrays, ids: np.ndarray, groups: np.ndarray | None = None,
                 positives: TokenArrays | None = None, negatives: TokenArrays | None = None):
        self.sampler = sampler
        self.tokens, self.positives, self.negatives = tokens, positives, negatives
        self.ids = ids
        self.groups = groups

    def __len__(self) -> int:
        return len(self.sampler)

    def batches(self, *, epoch: int, start: int) -> Iterator[TextBatch]:
        for rows in self.sampler.planned_rows(epoch=epoch, start=start):
            input_ids, mask = self.tokens.rows(rows)
            batch = TextBatch(rows=rows, ids=self.ids[rows], input_ids=input_ids, attention_mask=mask,
                              groups=None if self.groups is None else torch.from_numpy(self.groups[rows].astype(np.int64)))
            if self.positives is not None and self.negatives is not None:
                batch.positive_ids, batch.positive_mask = self.positives.rows(rows)
                batch.negative_ids, batch.negative_mask = self.negatives.rows(rows)
            yield batch


class SimCSEStep(nn.Module):
    """What the engine wraps: forward(**inputs) -> (loss, metrics) of a ``contrastive.modalities.text.simcse.SimCSE``."""

    def __init__(self, method: nn.Module):
        super().__init__()
        self.method = method

    def forward(self, **inputs):
        return self.method.training_loss(**inputs)


@dataclass
class IsotropyProbe:
    """A fixed probe set (tokens of S sentences) measured every ``every_steps`` steps; ``skip_tokens``: ids left
    out of the token measures ([CLS], [PAD])."""
    tokens: TokenArrays
    every_steps: int
    skip_tokens: tuple[int, ...] = ()
    num_frequent: int = 10
    seed: int = 0


class TextContrastiveTask(StageTask):
    """SimCSE (unsupervised or supervised) on tokenized sentences; optional isotropy trajectory."""

    views_per_sample = 2

    def __init__(self, *, method: nn.Module, probe: IsotropyProbe | None = None):
        self.model = method
        # Encoder passes per sentence: two dropout views, or anchor + positive + hard negative (supervised).
        self.views_per_sample = 3 if getattr(method, "supervised", False) else 2
        self.generators = {}
        self.probe = probe
        self.step = 0
        self.next_probe = 0
        #: [(step, {metric: value})] of every isotropy measurement of this run.
        self.isotropy_history: list[tuple[int, dict[str, float]]] = []

    def forward_module(self) -> nn.Module:
        return SimCSEStep(self.model)

    def inputs(self, batch: TextBatch, *, device: torch.device, step: int) -> dict:
        out = {"input_ids": batch.input_ids.to(device), "attention_mask": batch.attention_mask.to(device)}
        if batch.positive_ids is not None:
            out.update(positive_ids=batch.positive_ids.to(device), positive_mask=batch.positive_mask.to(device),
                       negative_ids=batch.negative_ids.to(device), negative_mask=batch.negative_mask.to(device))
        return out

    def on_train_start(self, *, total_steps: int) -> None:
        # The engine calls this after the model is on its device and before any checkpoint is loaded, so this is
        # the seeded initialisation (the same weights a resumed run started from): the trajectory's step 0.
        if self.probe is not None:
            self.step = 0
            self.measure_now()

    def after_step(self, *, step: int) -> None:
        self.step = step + 1

    def log_metrics(self) -> dict[str, float]:
        """The isotropy diagnostics when a measurement is due (read at the engine's log steps)."""
        if self.probe is None or self.step < self.next_probe:
            return {}
        return {f"iso/{k}": v for k, v in self.measure_now().items()}

    def measure_now(self) -> dict[str, float]:
        """Measure the probe set with the current weights (eval mode: no dropout), record it at the current step."""
        from contrastive.modalities.text.isotropy import isotropy_report

        probe = self.probe
        device = next(self.model.parameters()).device
        states, sentences = encode_tokens(self.model.encoder, probe.tokens, device=device, with_states=True)
        report = isotropy_report(states=states, mask=probe.tokens.mask[:, :states.shape[1]],
                                 token_ids=probe.tokens.ids[:, :states.shape[1]], sentences=sentences,
                                 skip_tokens=probe.skip_tokens, num_frequent=probe.num_frequent, seed=probe.seed)
        self.isotropy_history.append((self.step, report))
        self.next_probe = self.step + probe.every_steps
        return report


@torch.no_grad()
def encode_tokens(encoder: nn.Module, tokens: TokenArrays, *, device: torch.device, batch_size: int = 256,
                  with_states: bool = False) -> tuple[np.ndarray | None, np.ndarray]:
    """(token states (N, L, D) or None, pooled embeddings (N, D)) of every row, in eval mode (the previous mode is
    restored). Token states are padded to the tokens' full width L."""
    was_training = encoder.training
    encoder.eval()
    from contrastive.modalities.text.encoders import pool

    states_out, pooled_out = [], []
    try:
        for start in range(0, len(tokens.ids), batch_size):
            rows = np.arange(start, min(start + batch_size, len(tokens.ids)))
            ids, mask = tokens.rows(rows)
            ids, mask = ids.to(device), mask.to(device)
            states = encoder.token_states(ids, mask)
            pooled_out.append(pool(states, mask, pooling=encoder.pooling).float().cpu().numpy())
            if with_states:
                full = np.zeros((len(rows), tokens.ids.shape[1], states.shape[2]), np.float32)
                full[:, :states.shape[1]] = states.float().cpu().numpy()
                states_out.append(full)
    finally:
        encoder.train(was_training)
    pooled = np.concatenate(pooled_out) if pooled_out else np.zeros((0, encoder.dim), np.float32)
    return (np.concatenate(states_out) if with_states else None), pooled
