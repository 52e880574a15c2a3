"""Embedding export: float16 shards plus the sample ids they belong to."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from contrastive.engine.checkpoint import atomic_write_bytes
from contrastive.errors import DataError

MANIFEST = "manifest.json"


class EmbeddingWriter:
    """Streams (B, D) embeddings into float16 shards ``<prefix>-XXXXX.npy`` of ``shard_size`` rows, so an export
    holds one shard in memory, not (N, D) float32 (10 GB for ImageNet at D = 2048)."""

    def __init__(self, directory: Path, *, prefix: str = "part", shard_size: int = 65_536):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix, self.shard_size = prefix, shard_size
        self.pending: list[np.ndarray] = []
        self.pending_rows = 0
        self.shards: list[str] = []
        self.ids: list[np.ndarray] = []
        self.dim = 0

    def add(self, embeddings: np.ndarray, ids: np.ndarray) -> None:
        if len(embeddings) != len(ids):
            raise ValueError(f"{len(embeddings)} embeddings but {len(ids)} ids")
        if len(embeddings):
            self.dim = int(embeddings.shape[1])
        self.pending.append(np.asarray(embeddings, dtype=np.float16))
        self.ids.append(np.asarray(ids))
        self.pending_rows += len(embeddings)
        while self.pending_rows >= self.shard_size:
            self._flush(self.shard_size)

    def _flush(self, rows: int) -> None:
        block = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        name = f"{self.prefix}-{len(self.shards):05d}.npy"
        _save_npy(self.directory / name, block[:rows])
        self.shards.append(name)
        rest = block[rows:]
        self.pending, self.pending_rows = ([rest] if len(rest) else []), len(rest)

    def finish(self) -> dict:
        """Write the last partial shard; returns {"shards", "ids", "dim"} (a part of a manifest)."""
        if self.pending_rows or not self.shards:
            if not self.pending:
                self.pending = [np.zeros((0, self.dim), np.float16)]
            self._flush(self.pending_rows)
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)
        return {"shards": self.shards, "ids": ids, "dim": self.dim}


def write_manifest(*, directory: Path, parts: list[dict]) -> dict:
    """Combine the parts of one or several writers (ranks, in rank order) into ``ids.npy`` + the manifest, written
    last: a directory without a manifest is an interrupted export."""
    directory = Path(directory)
    ids = np.concatenate([part["ids"] for part in parts])
    _save_npy(directory / "ids.npy", ids)
    manifest = {"num_samples": int(len(ids)), "dim": max(part["dim"] for part in parts), "dtype": "float16",
                "shards": [name for part in parts for name in part["shards"]], "ids": "ids.npy"}
    atomic_write_bytes(directory / MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


@torch.no_grad()
def compute_embeddings(*, encode: Callable[[torch.Tensor], torch.Tensor],
                       batches: Iterable[tuple[np.ndarray, torch.Tensor]], device: torch.device,
                       writer: EmbeddingWriter, ids: np.ndarray, expected_rows: Iterable[np.ndarray],
                       progress: Callable[[int], None] | None = None) -> int:
    """Embed every planned batch into ``writer``, in order. batches: (rows kept, uint8 (b, C, H, W)) per planned
    batch of ``expected_rows``; encode: float (b, C, H, W) in [0, 1] -> (b, D). A row missing from its batch (an
    unreadable image) gets a zero embedding, so every sample keeps its place and id. Returns how many rows did."""
    missing = 0
    for planned, (kept, images) in zip(expected_rows, batches):
        encoded = encode(images.to(device).float().div_(255.0)).float().cpu().numpy() if len(kept) else None
        if len(kept) == len(planned):
            block = encoded
        else:
            dim = encoded.shape[1] if encoded is not None else writer.dim
            block = np.zeros((len(planned), dim), np.float32)
            if encoded is not None:
                block[np.isin(planned, kept)] = encoded
            missing += len(planned) - len(kept)
        writer.add(block, ids[planned])
        if progress is not None:
            progress(len(planned))
    return missing


def _save_npy(path: Path, array: np.ndarray) -> None:
    import io
    buffer = io.BytesIO()
    np.save(buffer, array)
    atomic_write_bytes(path, buffer.getvalue())


def save_embeddings(*, embeddings: np.ndarray, ids: np.ndarray, directory: Path, shard_size: int = 65_536) -> dict:
    """Write (N, D) embeddings as float16 shards ``part-XXXXX.npy`` and ``ids.npy``; returns the manifest."""
    writer = EmbeddingWriter(directory, shard_size=shard_size)
    writer.add(embeddings, ids)
    return write_manifest(directory=directory, parts=[writer.finish()])


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
