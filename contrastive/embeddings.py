"""Embedding export: float16 shards plus the sample ids they belong to."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from contrastive.engine.checkpoint import atomic_write_bytes
from contrastive.errors import DataError

MANIFEST = "manifest.json"


@torch.no_grad()
def compute_embeddings(*, encode: Callable[[torch.Tensor], torch.Tensor], get_batch: Callable[[np.ndarray], torch.Tensor],
                       num_samples: int, batch_size: int, device: torch.device,
                       progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Embed samples 0..num_samples-1 in order. encode: float (B, 3, H, W) -> (B, D). Returns float32 (N, D)."""
    chunks = []
    for start in range(0, num_samples, batch_size):
        indices = np.arange(start, min(start + batch_size, num_samples), dtype=np.int64)
        images = get_batch(indices).to(device).float().div_(255.0)
        chunks.append(encode(images).float().cpu().numpy())
        if progress is not None:
            progress(len(indices))
    return np.concatenate(chunks, axis=0) if chunks else np.zeros((0, 0), np.float32)


def encoder_of(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    model.eval()
    return model.embed


def _save_npy(path: Path, array: np.ndarray) -> None:
    import io
    buffer = io.BytesIO()
    np.save(buffer, array)
    atomic_write_bytes(path, buffer.getvalue())


def save_embeddings(*, embeddings: np.ndarray, ids: np.ndarray, directory: Path, shard_size: int = 65_536) -> dict:
    """Write (N, D) embeddings as float16 shards ``part-XXXXX.npy`` and ``ids.npy``; returns the manifest.

    The manifest is written last, so a directory without one is an interrupted export.
    """
    if len(embeddings) != len(ids):
        raise ValueError(f"{len(embeddings)} embeddings but {len(ids)} ids")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, start in enumerate(range(0, max(len(embeddings), 1), shard_size)):
        name = f"part-{number:05d}.npy"
        _save_npy(directory / name, embeddings[start:start + shard_size].astype(np.float16))
        shards.append(name)
    _save_npy(directory / "ids.npy", np.asarray(ids))
    manifest = {"num_samples": int(len(embeddings)), "dim": int(embeddings.shape[1]) if embeddings.ndim == 2 else 0,
                "dtype": "float16", "shards": shards, "ids": "ids.npy"}
    atomic_write_bytes(directory / MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def load_embeddings(*, directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """Returns (ids (N,), embeddings float32 (N, D))."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        raise DataError(f"no finished embedding export in {directory} (manifest.json missing): the export was "
                        f"interrupted or deleted; rerun the pipeline to export again")
    manifest = json.loads(manifest_path.read_text())
    parts = [np.load(directory / name) for name in manifest["shards"]]
    embeddings = np.concatenate(parts).astype(np.float32)
    ids = np.load(directory / manifest["ids"], allow_pickle=False)
    if len(ids) != manifest["num_samples"] or len(embeddings) != manifest["num_samples"]:
        raise DataError(f"embedding export in {directory} is inconsistent with its manifest: delete the directory "
                        f"and rerun the pipeline")
    return ids, embeddings
