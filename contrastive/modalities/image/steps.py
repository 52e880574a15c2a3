"""The steps of one MCL stage as plain functions over directories.

Each step reads what earlier steps wrote (paths), writes its own directory, and returns a small JSON-able record.
Training takes a typed ``ImageStageSpec`` built by the config schema and runs on the engine
(``contrastive.engine.loop.train``) through the image modality; nothing here knows about Prefect or MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from contrastive.modalities.image.augment import TwoViewAugment
from contrastive.data.dataset import RowsOf
from contrastive.data.loading import BatchReader, iter_batches, load_dataset, resample_device, resolve_workers
from contrastive.embeddings import ExportBatch, compute_embeddings, export_ranked, rank_share
from contrastive.engine.callbacks import JsonlMetrics, KeyRecorder
from contrastive.engine.checkpoint import save_torch
from contrastive.engine.files import write_json, write_stage_summary
from contrastive.engine.safe_load import load_torch_file
from contrastive.engine.distributed import DistInfo, current_info, device_for
from contrastive.engine.loop import TrainCallback, release_device_memory, train
from contrastive.engine.task import StageSpec
from contrastive.errors import DataError
from contrastive.integrate import concat_normalized
from contrastive.mcl.steps import start_stage
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
    #: DataLoader workers decoding a dataset stored as files; None = ``contrastive.data.loading.default_workers``.
    workers: int | None = 0
    #: model.pt of an earlier stage to start from (naive inheritance, paper Table 5); None = a fresh encoder.
    init_model_path: str | None = None
    #: ``train.resample_on_gpu``: on CUDA the workers ship decoded squares and the GPU resamples them.
    resample_on_gpu: bool = False


def train_stage(spec: ImageStageSpec, *, info: DistInfo | None = None, callbacks: list[TrainCallback] = (),
                stop_after_steps: int | None = None) -> dict:
    """Train a FRESH encoder for one stage (the paper shows inheriting weights from stage j-1 defeats MCL).

    With ``spec.pseudo_labels_path`` every global batch comes from one pseudo-label group (MCL Algorithm 1), split
    across the ranks; without it the batches are ordinary random batches (stage 0 and the control run). Every
    process of a torchrun launch calls this with its ``info``; rank 0 writes ``stage_dir/checkpoints/last.pt``
    (resumable), ``stage_dir/model/model.pt`` and ``train_summary.json``.
    """
    info = info or current_info()
    stage_dir, dataset, batch, (train_indices, sampler, groups) = start_stage(spec, info=info,
                                                                              open_dataset=load_dataset)
    method = build_method(model_kwargs=spec.model, method_kwargs=spec.method)
    if spec.init_model_path is not None:  # a resume's checkpoint still wins: the engine loads it over these
        method.load_state_dict(load_torch_file(spec.init_model_path, what="init model (init_model_path)")
                               ["state_dict"])
    torch_device = device_for(name=spec.device, info=info)
    task = ImageContrastiveTask(method=method, augment=TwoViewAugment(**spec.augment), seed=spec.seed,
                                channels_last=spec.loop.channels_last, epochs=spec.loop.epochs)
    reader = BatchReader(dataset, workers=resolve_workers(spec.workers),  # its workers serve every epoch
                         resample_on=resample_device(on_gpu=spec.resample_on_gpu, device=torch_device))
    source = ImageBatchSource(
        sampler=sampler, ids=RowsOf(dataset.ids, train_indices), groups=groups, info=info,
        read_batches=lambda planned: read_image_batches(reader=reader, rows_in_split=train_indices,
                                                        planned=planned),
        # On the CPU a background thread augments the next batches while the step runs; a GPU augments in it.
        prepare=task.prepare if torch_device.type == "cpu" else None)
    recorder = KeyRecorder()
    # Under torchrun the flow reads the metrics from this file once the launch ends.
    extra = [JsonlMetrics(stage_dir / "train_metrics.jsonl")] if info.is_distributed else []
    try:
        result = train(task=task, source=source, optim=spec.optim, loop=spec.loop, device=torch_device,
                       checkpoint_path=stage_dir / "checkpoints" / "last.pt", info=info,
                       callbacks=[*callbacks, *extra, *([recorder] if spec.record_keys else [])],
                       stop_after_steps=stop_after_steps)
    finally:
        reader.close()
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
        write_stage_summary(stage_dir / "train_summary.json", summary)
    del task, method, source
    release_device_memory(torch_device)
    return summary


def train_stage_from_json(*, spec: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun launch (``contrastive.engine.launch``): the spec arrives as JSON."""
    return train_stage(ImageStageSpec.from_json(spec), info=info)


def read_image_batches(*, reader: BatchReader, rows_in_split: np.ndarray, planned):
    """(split positions kept, uint8 images) for every planned batch of split positions, in order: decoded in the
    reader's DataLoader workers for a dataset stored as files (unreadable files dropped and counted), a slice of
    the in-memory array otherwise."""
    position_of = np.full(len(reader.dataset), -1, dtype=np.int64)
    position_of[rows_in_split] = np.arange(rows_in_split.size)
    dataset_rows = (rows_in_split[rows] for rows in planned)
    for kept, images in reader.read(dataset_rows):
        yield position_of[kept], images


def load_trained_model(*, model_path: Path, device: torch.device) -> torch.nn.Module:
    return read_trained_model(model_path=model_path, device=device)[0]


def read_trained_model(*, model_path: Path, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """A stage's ``model.pt``: the method rebuilt from it (on ``device``, eval mode) and the ``model_kwargs`` it
    was built with (``in_channels``, absent in models saved before it existed: 3)."""
    if not Path(model_path).exists():
        raise DataError(f"trained model {model_path} is missing: rerun the pipeline to retrain this stage")
    saved = load_torch_file(model_path, what="trained model", map_location=device)
    method = build_method(model_kwargs=saved["model_kwargs"], method_kwargs=saved["method_kwargs"])
    method.load_state_dict(saved["state_dict"])
    return method.to(device).eval(), saved["model_kwargs"]


# ---------------------------------------------------------------------------------------------------- export


def export_stage_embeddings(*, dataset_dir: Path, model_path: Path, out_dir: Path, batch_size: int, device: str,
                            workers: int | None = 0, precision: str = "fp32", channels_last: bool = False,
                            info: DistInfo | None = None, progress: Callable[[int, int], None] | None = None,
                            resample_on_gpu: bool = False) -> dict:
    """Embed every sample (train and test) with the stage's backbone; float16 shards + ids in ``out_dir``.

    Streams: images are read batch by batch (decoded in ``workers`` DataLoader workers for a dataset stored as
    files) and written shard by shard. Under torchrun each rank embeds a contiguous share of the samples into its
    own shards and rank 0 writes the manifest that lists them in rank order (``contrastive.embeddings.
    export_ranked``: the same ids order as one process). ``precision``: the stage's (``train.precision``; bf16 /
    fp16 autocast on the encoder, the embeddings stored as float16 either way); it is part of the train key, so
    the export key, which holds the train key, follows it. ``channels_last``: the stage's memory format
    (``train.channels_last``; on CPU oneDNN's convolutions and max-pooling run about 1.5x faster in it, the
    embeddings are the same up to rounding). ``resample_on_gpu``: ``train.resample_on_gpu``
    (:func:`contrastive.data.loading.resample_device`). An unreadable image gets a zero embedding (counted in
    ``unreadable``), so every sample keeps its id. Also what a benchmark calls to time an export at a precision.
    """
    info = info or current_info()
    dataset = load_dataset(dataset_dir)
    torch_device = device_for(name=device, info=info)
    model = load_trained_model(model_path=model_path, device=torch_device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    mine = rank_share(len(dataset), info=info)
    planned = [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]

    def embed(writer) -> dict[str, int]:
        read = iter_batches(dataset, planned, workers=resolve_workers(workers),
                            resample_on=resample_device(on_gpu=resample_on_gpu, device=torch_device))
        batches = (ExportBatch(ids=dataset.ids[rows], inputs=(images,), present=np.isin(rows, kept))
                   for rows, (kept, images) in zip(planned, read))
        unreadable = compute_embeddings(encode=pixels_to_embedding(model, channels_last=channels_last),
                                        batches=batches, device=torch_device,
                                        writer=writer, precision=precision, progress=progress)
        return {"unreadable": unreadable}

    return export_ranked(out_dir=Path(out_dir), info=info, embed=embed)


def pixels_to_embedding(model: torch.nn.Module, *, channels_last: bool = False
                        ) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 (b, C, H, W) on the device -> (b, D): the export's transform (pixels / 255, the model's ``embed``).
    The images travel to the device as uint8 (a quarter of float32's bytes) and are scaled there; with
    ``channels_last`` in that memory format (the model's, set by the caller)."""
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return lambda images: model.embed(images.float().div_(255.0).contiguous(memory_format=memory_format))


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
    batches = (ExportBatch(ids=np.arange(start, min(start + batch_size, len(images))),
                           inputs=(images[start:start + batch_size],)) for start in range(0, len(images), batch_size))
    rows = _Rows()
    compute_embeddings(encode=pixels_to_embedding(model), batches=batches, device=device, writer=rows)
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
