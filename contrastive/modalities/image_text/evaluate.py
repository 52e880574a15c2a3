"""Zero-shot evaluation of CLIP stages: feature extraction, image-text retrieval recall@k, the model soup.

Integration of stages (MCL, Sec. 5.5): the concatenation of the stages' L2-normalised embeddings (image side and
text side alike), and, as a second integration for CLIP, the model soup: the element-wise average of the stage
models' weights (Wortsman et al., 2022, "Model soups"); it works here because all stages start from one init.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import nn

from contrastive.engine.precision import autocast_context
from contrastive.plotting import grouped_bars, locked_pyplot, save_figure

RECALL_KS = (1, 5, 10)


@torch.no_grad()
def encode_images(*, model: nn.Module, images: Sequence[Image.Image] | torch.Tensor, transform: Callable | None,
                  device: torch.device, batch_size: int = 256, precision: str = "fp32") -> np.ndarray:
    """L2-normalised image embeddings, float32 (N, D). images: PIL images (transformed here) or a float
    (N, 3, S, S) tensor already transformed."""
    model.eval()
    chunks = []
    for start in range(0, len(images), batch_size):
        part = images[start:start + batch_size]
        pixels = part if isinstance(part, torch.Tensor) else torch.stack([transform(im) for im in part])
        with autocast_context(precision=precision, device=device):
            chunks.append(model.encode_image(pixels.to(device), normalize=True).float().cpu())
    return torch.cat(chunks).numpy() if chunks else np.zeros((0, 0), np.float32)


@torch.no_grad()
def encode_texts(*, model: nn.Module, texts: Sequence[str], tokenizer: Callable, device: torch.device,
                 batch_size: int = 256, precision: str = "fp32") -> np.ndarray:
    """L2-normalised text embeddings, float32 (N, D)."""
    model.eval()
    chunks = []
    for start in range(0, len(texts), batch_size):
        tokens = tokenizer(list(texts[start:start + batch_size])).to(device)
        with autocast_context(precision=precision, device=device):
            chunks.append(model.encode_text(tokens, normalize=True).float().cpu())
    return torch.cat(chunks).numpy() if chunks else np.zeros((0, 0), np.float32)


def concat_stage_features(per_stage: list[np.ndarray]) -> np.ndarray:
    """[Z_0 / |Z_0|, ..., Z_{N-1} / |Z_{N-1}|]: (N, sum D_j). Rows are renormalised per stage (cheap, and robust
    to features saved in float16)."""
    from contrastive.integrate import concat_normalized
    return concat_normalized(stage_embeddings=per_stage)


def retrieval_recall(*, image_features: np.ndarray, text_features: np.ndarray,
                     ks: Sequence[int] = RECALL_KS, chunk: int = 4096) -> dict[str, float]:
    """Zero-shot retrieval recall@k in percent, image->text and text->image, over N paired rows.

    image_features, text_features: (N, D), row i of each a matching pair (normalised, or concatenations of
    normalised stages). Returns {"retrieval/i2t_r@k", "retrieval/t2i_r@k", "retrieval/mean_r@k", "count/retrieval_pairs"}.
    """
    if image_features.shape != text_features.shape or image_features.ndim != 2:
        raise ValueError(f"need paired (N, D) features, got {image_features.shape} and {text_features.shape}")
    n = image_features.shape[0]
    images, texts = image_features.astype(np.float32), text_features.astype(np.float32)
    i2t, t2i = np.empty(n, np.int64), np.empty(n, np.int64)
    for start in range(0, n, chunk):
        rows = slice(start, min(n, start + chunk))
        sim = images[rows] @ texts.T  # (c, N): image -> all texts
        matches = sim[np.arange(sim.shape[0]), np.arange(rows.start, rows.stop)][:, None]
        i2t[rows] = (sim > matches).sum(axis=1)
        sim = texts[rows] @ images.T
        matches = sim[np.arange(sim.shape[0]), np.arange(rows.start, rows.stop)][:, None]
        t2i[rows] = (sim > matches).sum(axis=1)
    out = {}
    for k in ks:
        out[f"retrieval/i2t_r@{k}"] = 100.0 * float((i2t < k).mean())
        out[f"retrieval/t2i_r@{k}"] = 100.0 * float((t2i < k).mean())
        out[f"retrieval/mean_r@{k}"] = (out[f"retrieval/i2t_r@{k}"] + out[f"retrieval/t2i_r@{k}"]) / 2
    out["count/retrieval_pairs"] = float(n)
    return out


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Uniform model soup: the element-wise mean of floating-point tensors (computed in float32, stored in each
    tensor's dtype); non-float tensors (counters) are taken from the first state. All states need the same keys."""
    if not states:
        raise ValueError("a soup needs at least one state dict")
    keys = set(states[0])
    if any(set(s) != keys for s in states[1:]):
        raise ValueError("state dicts disagree on their keys; a soup needs models of one architecture")
    soup = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            soup[key] = torch.stack([s[key].float() for s in states]).mean(dim=0).to(first.dtype)
        else:
            soup[key] = first.clone()
    return soup


def plot_metric_groups(*, results: dict[str, dict[str, float]], prefix: str, path, title: str,
                       ylabel: str = "accuracy (%)"):
    """Grouped bars: one group per representation (stage 0, ..., concat, soup), one bar per ``prefix/<name>``
    metric (e.g. the nine MMVP categories and their average). Values in percent. Returns the path."""
    with locked_pyplot() as plt:
        fig, ax = plt.subplots(figsize=(2.5 + 1.6 * len(results), 4.0))
        grouped_bars(ax, results=results, prefix=prefix)
        ax.set_ylim(0, 105)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
        return save_figure(plt, fig, path, dpi=120)
