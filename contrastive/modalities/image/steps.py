"""The steps of one MCL stage as plain functions over directories.

Each step reads what earlier steps wrote (paths), writes its own directory, and returns a small JSON-able record.
Training takes a typed ``ImageStageSpec`` built by the config schema and runs on the engine
(``contrastive.engine.loop.train``) through the image modality; nothing here knows about Prefect or MLflow.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from contrastive.modalities.image.augment import TwoViewAugment
from contrastive.data.loading import iter_batches, load_dataset
from contrastive.embeddings import EmbeddingWriter, compute_embeddings, write_manifest
from contrastive.engine.callbacks import JsonlMetrics, KeyRecorder
from contrastive.engine.checkpoint import save_torch, write_json
from contrastive.engine.distributed import DistInfo, barrier, current_info, device_for, per_rank_batch
from contrastive.engine.launch import EXPORT_SUMMARY
from contrastive.engine.loop import TrainCallback, release_device_memory, train
from contrastive.engine.rng import seed_everything
from contrastive.engine.task import StageSpec
from contrastive.errors import DataError
from contrastive.integrate import concat_normalized
from contrastive.mcl.steps import stage_sampler
from contrastive.methods import build_method
from contrastive.modalities.image.adapter import ImageBatchSource, ImageContrastiveTask


# ---------------------------------------------------------------------------------------------------- training
@dataclass(frozen=True, kw_only=True)
class ImageStageSpec(StageSpec):
    """One unimodal training stage, built by the config schema (JSON-able for torchrun).

    batch_size is the GLOBAL batch (all ranks); each of the W processes holds batch_size / W samples of it.
    model / method / augment: the config's sections as JSON (they are saved with the model, so it rebuilds).
    """
    dataset_dir: str
    pseudo_labels_path: str | None
    model: dict
    method: dict
    augment: dict
    batch_size: int
    remainder_policy: str
    workers: int = 0
    #: model.pt of an earlier stage to start from (naive inheritance, paper Table 5); None = a fresh encoder.
    init_model_path: str | None = None


def train_stage(spec: ImageStageSpec, *, info: DistInfo | None = None, callbacks: list[TrainCallback] = (),
                stop_after_steps: int | None = None) -> dict:
    """Train a FRESH encoder for one stage (the paper shows inheriting weights from stage j-1 defeats MCL).

    With ``spec.pseudo_labels_path`` every global batch comes from one pseudo-label group (MCL Algorithm 1), split
    across the ranks; without it the batches are ordinary random batches (stage 0 and the control run). Every
    process of a torchrun launch calls this with its ``info``; rank 0 writes ``stage_dir/checkpoints/last.pt``
    (resumable), ``stage_dir/model/model.pt`` and ``train_summary.json``.
    """
    info = info or current_info()
    if spec.threads:
        torch.set_num_threads(spec.threads)
    stage_dir = Path(spec.stage_dir)
    dataset = load_dataset(spec.dataset_dir)
    batch = per_rank_batch(global_batch_size=spec.batch_size, world_size=info.world_size)
    train_indices, sampler, groups = stage_sampler(
        dataset=dataset, pseudo_labels_path=spec.pseudo_labels_path, batch_size=batch, seed=spec.seed,
        remainder_policy=spec.remainder_policy, world_size=info.world_size, rank=info.rank)
    seed_everything(spec.seed)
    method = build_method(model_kwargs=spec.model, method_kwargs=spec.method)
    if spec.init_model_path is not None:  # a resume's checkpoint still wins: the engine loads it over these
        method.load_state_dict(torch.load(spec.init_model_path, map_location="cpu", weights_only=False)["state_dict"])
    torch_device = device_for(name=spec.device, info=info)
    task = ImageContrastiveTask(method=method, augment=TwoViewAugment(**spec.augment), seed=spec.seed,
                                channels_last=spec.loop.channels_last, epochs=spec.loop.epochs)
    source = ImageBatchSource(
        sampler=sampler, ids=dataset.ids[train_indices], groups=groups, info=info,
        read_batches=lambda planned: read_image_batches(dataset=dataset, rows_in_split=train_indices,
                                                        planned=planned, workers=spec.workers),
        # On the CPU a background thread augments the next batches while the step runs; a GPU augments in it.
        prepare=task.prepare if torch_device.type == "cpu" else None)
    recorder = KeyRecorder()
    # Under torchrun the flow reads the metrics from this file once the launch ends.
    extra = [JsonlMetrics(stage_dir / "train_metrics.jsonl")] if info.is_distributed else []
    result = train(task=task, source=source, optim=spec.optim, loop=spec.loop, device=torch_device,
                   checkpoint_path=stage_dir / "checkpoints" / "last.pt", info=info,
                   callbacks=[*callbacks, *extra, *([recorder] if spec.record_keys else [])],
                   stop_after_steps=stop_after_steps)
    if spec.record_keys:
        write_json(stage_dir / f"keys_rank{info.rank}.json", {
            "batches": recorder.batches, "losses": [h["train/loss"] for h in result.history]})
    model_path = stage_dir / "model" / "model.pt"
    summary = {**result.summary(), "views_per_second": task.views_per_sample * result.samples_per_second,
               "world_size": info.world_size, "per_rank_batch": batch, "global_batch": spec.batch_size,
               "batch_plan": sampler.stats, "cluster_pure_batches": groups is not None,
               "model_path": str(model_path)}
    if info.is_main:
        save_torch({"state_dict": method.state_dict(), "model_kwargs": spec.model, "method_kwargs": spec.method},
                   model_path, what="the stage's final model")
        write_json(stage_dir / "train_summary.json", summary)
    del task, method, source
    release_device_memory(torch_device)
    return summary


def train_stage_from_json(*, spec: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun launch (``contrastive.engine.launch``): the spec arrives as JSON."""
    return train_stage(ImageStageSpec.from_json(spec), info=info)


def read_image_batches(*, dataset, rows_in_split: np.ndarray, planned, workers: int):
    """(split positions kept, uint8 images) for every planned batch of split positions, in order: decoded in
    DataLoader workers for a dataset stored as files (unreadable files dropped and counted), a slice of the
    in-memory array otherwise."""
    position_of = np.full(len(dataset), -1, dtype=np.int64)
    position_of[rows_in_split] = np.arange(rows_in_split.size)
    dataset_rows = (rows_in_split[rows] for rows in planned)
    for kept, images in iter_batches(dataset, dataset_rows, workers=workers):
        yield position_of[kept], images


def load_trained_model(*, model_path: Path, device: torch.device) -> torch.nn.Module:
    return read_trained_model(model_path=model_path, device=device)[0]


def read_trained_model(*, model_path: Path, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """A stage's ``model.pt``: the method rebuilt from it (on ``device``, eval mode) and the ``model_kwargs`` it
    was built with (``in_channels``, absent in models saved before it existed: 3)."""
    if not Path(model_path).exists():
        raise DataError(f"trained model {model_path} is missing: rerun the pipeline to retrain this stage")
    saved = torch.load(model_path, map_location=device, weights_only=False)
    method = build_method(model_kwargs=saved["model_kwargs"], method_kwargs=saved["method_kwargs"])
    method.load_state_dict(saved["state_dict"])
    return method.to(device).eval(), saved["model_kwargs"]


# ---------------------------------------------------------------------------------------------------- export


def export_stage_embeddings(*, dataset_dir: Path, model_path: Path, out_dir: Path, batch_size: int, device: str,
                            workers: int = 0, info: DistInfo | None = None,
                            progress: Callable[[int], None] | None = None) -> dict:
    """Embed every sample (train and test) with the stage's backbone; float16 shards + ids in ``out_dir``.

    Streams: images are read batch by batch (decoded in ``workers`` DataLoader workers for a dataset stored as
    files) and written shard by shard. Under torchrun each rank embeds a contiguous share of the samples into its
    own shards and rank 0 writes the manifest that lists them in rank order (same ids order as one process).
    An unreadable image gets a zero embedding (counted in ``unreadable``), so every sample keeps its id.
    """
    info = info or current_info()
    dataset = load_dataset(dataset_dir)
    torch_device = device_for(name=device, info=info)
    model = load_trained_model(model_path=model_path, device=torch_device)
    mine = np.array_split(np.arange(len(dataset), dtype=np.int64), info.world_size)[info.rank]
    planned = [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]
    prefix = f"rank{info.rank:03d}-part" if info.is_distributed else "part"
    writer = EmbeddingWriter(Path(out_dir), prefix=prefix)
    unreadable = compute_embeddings(encode=model.embed, batches=iter_batches(dataset, planned, workers=workers),
                                    device=torch_device, writer=writer, ids=dataset.ids, expected_rows=planned,
                                    progress=progress)
    part = writer.finish()
    if info.is_distributed:
        np.save(Path(out_dir) / f"rank{info.rank:03d}-ids.npy", part["ids"])
        write_json(Path(out_dir) / f"rank{info.rank:03d}.json", {"shards": part["shards"], "dim": part["dim"],
                                                               "unreadable": unreadable})
        barrier()
        if not info.is_main:
            return {}
        parts = [{**json.loads((Path(out_dir) / f"rank{rank:03d}.json").read_text()),
                  "ids": np.load(Path(out_dir) / f"rank{rank:03d}-ids.npy")} for rank in range(info.world_size)]
        unreadable = sum(part["unreadable"] for part in parts)
    else:
        parts = [part]
    manifest = write_manifest(directory=Path(out_dir), parts=parts)
    summary = {"dir": str(out_dir), "num_samples": manifest["num_samples"], "dim": manifest["dim"],
               "unreadable": unreadable, "world_size": info.world_size}
    write_json(Path(out_dir) / EXPORT_SUMMARY, summary)
    return summary


def export_stage_from_json(*, export: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun export (``contrastive.engine.launch``)."""
    return export_stage_embeddings(**export, info=info)


class _Rows:
    """What :func:`embed_images` gives ``compute_embeddings`` in place of an ``EmbeddingWriter``: the float32
    blocks, kept in memory."""

    def __init__(self):
        self.blocks: list[np.ndarray] = []
        self.dim = 0

    def add(self, embeddings: np.ndarray, ids: np.ndarray) -> None:
        self.blocks.append(embeddings)


def embed_images(model: torch.nn.Module, images: torch.Tensor, *, device: torch.device,
                 batch_size: int = 256) -> np.ndarray:
    """float32 (n, D) embeddings of uint8 images (n, C, H, W) held in memory, by the export's own transform
    (``compute_embeddings``: pixels / 255 on the model's ``embed``), ``batch_size`` images at a time."""
    if not len(images):
        raise ValueError("no images to embed")
    planned = [np.arange(start, min(start + batch_size, len(images))) for start in range(0, len(images), batch_size)]
    rows = _Rows()
    compute_embeddings(encode=model.embed, batches=((kept, images[kept[0]:kept[-1] + 1]) for kept in planned),
                       device=device, writer=rows, ids=np.arange(len(images)), expected_rows=planned)
    return np.concatenate(rows.blocks).astype(np.float32, copy=False)


# ---------------------------------------------------------------------------------------------------- evaluation
def evaluate_embeddings(*, dataset_dir: Path, embeddings_dirs: list[Path], probe_c: float, probe_max_iter: int,
                        probe_max_train: int, knn_k: int, seed: int) -> dict[str, float]:
    """Probe one stage (one dir) or the concatenation of several stages' L2-normalised embeddings."""
    from contrastive.evaluate import read_stage_embeddings, score_attributes  # scikit-learn: not needed to serve
    dataset = load_dataset(dataset_dir)
    features = concat_normalized(stage_embeddings=read_stage_embeddings(dataset=dataset,
                                                                        embeddings_dirs=embeddings_dirs))
    return score_attributes(dataset=dataset, features=features, probe_c=probe_c, probe_max_iter=probe_max_iter,
                            probe_max_train=probe_max_train, knn_k=knn_k, seed=seed)
