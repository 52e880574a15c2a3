"""SimCSE (Gao, Yao & Chen, 2021) as a stage method, in the form the isotropy paper studies (its eq. 2):

    l_i = -log( exp(sim(e_i, e_i+) / tau) / sum_{j=1..N} exp(sim(e_i, e_j+) / tau) ),   sim = cosine, tau = 0.05

- unsupervised: e_i and e_i+ are the same sentence encoded twice; the two dropout masks are the only
  augmentation; the other sentences of the batch are the negatives;
- supervised: e_i+ is an entailment of the anchor and each anchor also has a contradiction e_i- as a hard
  negative; the denominator runs over every e_j+ and every e_j- of the batch.

Under DDP the batch is the global one: every rank gathers the encodings of all ranks with their gradient
(``contrastive.engine.distributed.gather_with_grad``) and computes the same loss over the B = sum_r B_r sentences,
so the negatives are every rank's and DDP's averaged gradient is the single-process gradient of that batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from contrastive.engine.distributed import gather_with_grad
from contrastive.engine.precision import fp32_logits
from contrastive.modalities.text.encoders import SentenceEncoder


def cosine_logits(a: torch.Tensor, b: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """(N, D), (M, D) -> (N, M) cos(a_i, b_j) / tau."""
    return F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / temperature


@fp32_logits
def simcse_unsup_loss(*, z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """z1, z2: (B, D) two dropout-noised encodings of the same B sentences; row i of z2 is the positive of row i
    of z1, the other rows of z2 its negatives. Returns the scalar mean of l_i over the B anchors."""
    logits = cosine_logits(z1, z2, temperature=temperature)
    return F.cross_entropy(logits, torch.arange(len(z1), device=z1.device))


@fp32_logits
def simcse_sup_loss(*, anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """anchors, positives, negatives: (B, D). l_i = -log( e^{s(h_i, h_i+)} / sum_j (e^{s(h_i, h_j+)} +
    e^{s(h_i, h_j-)}) ), s = cos / tau (SimCSE eq. 5). Returns the scalar mean over the B anchors."""
    logits = torch.cat([cosine_logits(anchors, positives, temperature=temperature),
                        cosine_logits(anchors, negatives, temperature=temperature)], dim=1)
    return F.cross_entropy(logits, torch.arange(len(anchors), device=anchors.device))


class SimCSE(nn.Module):
    """An encoder, SimCSE's training-only MLP head (Linear + tanh over the pooled vector; dropped for export, as
    unsupervised SimCSE does) or none, and the loss.

    ``training_loss(input_ids, attention_mask, ...)`` -> (loss, metrics); ``embed`` -> pooled (B, D) without head.
    """

    def __init__(self, *, encoder: SentenceEncoder, temperature: float, supervised: bool, mlp_head: bool):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Sequential(nn.Linear(encoder.dim, encoder.dim), nn.Tanh()) if mlp_head else nn.Identity()
        self.temperature = temperature
        self.supervised = supervised

    def _project(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(input_ids, attention_mask))

    def training_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      positive_ids: torch.Tensor | None = None, positive_mask: torch.Tensor | None = None,
                      negative_ids: torch.Tensor | None = None, negative_mask: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, dict[str, float]]:
        """input_ids / attention_mask (B_r, L) of this rank; the supervised method also takes the positives' and
        hard negatives' (B_r, L') tokens. One forward over the stacked rows, so every row gets its own dropout mask;
        the loss and the metrics cover the global batch of all ranks (B_r rows itself without a process group)."""
        batch = len(input_ids)
        if not self.supervised:
            z = self._project(torch.cat([input_ids, input_ids]), torch.cat([attention_mask, attention_mask]))
            z1, z2 = gather_with_grad(z[:batch]), gather_with_grad(z[batch:])  # the global batch's rows
            loss = simcse_unsup_loss(z1=z1, z2=z2, temperature=self.temperature)
            return loss, _pair_metrics(z1, z2)
        if positive_ids is None or negative_ids is None:
            raise ValueError("supervised SimCSE needs positive_ids and negative_ids")
        width = max(input_ids.shape[1], positive_ids.shape[1], negative_ids.shape[1])
        ids = torch.cat([_pad(t, width) for t in (input_ids, positive_ids, negative_ids)])
        mask = torch.cat([_pad(t, width) for t in (attention_mask, positive_mask, negative_mask)])
        z = self._project(ids, mask)
        anchors, positives, negatives = (gather_with_grad(part) for part in (z[:batch], z[batch:2 * batch],
                                                                            z[2 * batch:]))
        loss = simcse_sup_loss(anchors=anchors, positives=positives, negatives=negatives,
                               temperature=self.temperature)
        metrics = _pair_metrics(anchors, positives)
        with torch.no_grad():
            metrics["simcse/hard_negative_cos"] = F.cosine_similarity(anchors.float(), negatives.float(),
                                                                      dim=1).mean()
        return loss, metrics

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids, attention_mask)


def _pad(tokens: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(tokens, (0, width - tokens.shape[1])) if tokens.shape[1] < width else tokens


@torch.no_grad()
def _pair_metrics(a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean cosine of the positive pairs and of the in-batch negatives (alignment and spread while training), as
    scalar tensors the loop reads at logging steps."""
    cos = F.normalize(a.float(), dim=1) @ F.normalize(b.float(), dim=1).T
    n = len(cos)
    off = (cos.sum() - cos.diagonal().sum()) / max(1, n * n - n)
    return {"simcse/positive_cos": cos.diagonal().mean(), "simcse/negative_cos": off}
