"""Atomic, digest-checked checkpoints.

``save_checkpoint`` writes ``<name>.tmp``, fsyncs, renames over ``<name>`` (after moving the previous good file to
``<name>.prev``) and records a SHA-256 beside it. ``load_checkpoint`` verifies the digest and falls back to the
previous good checkpoint, with a warning, when the newest one is truncated or corrupt.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _previous_path(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Write then rename, so a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_json(path: Path, value: dict) -> None:
    """A JSON record written atomically (write, then rename)."""
    atomic_write_bytes(Path(path), json.dumps(value, indent=2, default=str).encode())


def save_checkpoint(state: dict[str, Any], path: Path) -> str:
    """Serialise ``state`` with torch.save; returns its SHA-256 hex digest."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    if path.exists() and _verified(path):
        os.replace(path, _previous_path(path))
        if _digest_path(path).exists():
            os.replace(_digest_path(path), _digest_path(_previous_path(path)))
    atomic_write_bytes(path, payload)
    atomic_write_bytes(_digest_path(path), digest.encode())
    return digest


def _verified(path: Path) -> bool:
    digest_file = _digest_path(path)
    if not path.exists() or not digest_file.exists():
        return False
    expected = digest_file.read_text().strip()
    return hashlib.sha256(path.read_bytes()).hexdigest() == expected


def load_checkpoint(path: Path, *, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The newest checkpoint whose digest verifies, or None when there is none (a fresh start)."""
    path = Path(path)
    for candidate in (path, _previous_path(path)):
        if not candidate.exists():
            continue
        if not _verified(candidate):
            warnings.warn(f"checkpoint {candidate} is truncated or corrupt (digest mismatch); "
                          f"falling back to the previous good checkpoint", RuntimeWarning, stacklevel=2)
            continue
        return torch.load(candidate, map_location=map_location, weights_only=False)
    return None
