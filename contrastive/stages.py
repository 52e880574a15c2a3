"""The steps of one MCL stage as plain functions over directories.

Each step reads what earlier steps wrote (paths), writes its own directory, and returns a small JSON-able record.
Prefect tasks call these with keyword arguments unpacked from the config; nothing here knows about Prefect or
MLflow.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from contrastive.augment import TwoViewAugment
from contrastive.engine.checkpoint import atomic_write_bytes
from contrastive.clustering import adjusted_mutual_information, kmeans, load_assignments, save_clusters
from contrastive.data.dataset import ImageArrayDataset
from contrastive.data.image_files import load_dataset
from contrastive.data.loading import iter_batches
from contrastive.embeddings import compute_embeddings, load_embeddings, save_embeddings
from contrastive.errors import ConfigError, DataError
from contrastive.evaluate import evaluate_representation
from contrastive.integrate import concat_normalized
from contrastive.methods import build_method
from contrastive.sampling import (ClusterBatchSampler, align_labels_to_ids, combine_pseudo_labels,
                                  merge_small_groups)
from contrastive.engine.distributed import DistInfo, current_info, device_for, per_rank_batch
from contrastive.engine.callbacks import JsonlMetrics, KeyRecorder
from contrastive.engine.loop import TrainCallback, release_device_memory, train
from contrastive.engine.rng import seed_everything
from contrastive.engine.task import StageSpec
from contrastive.modalities.image import ImageBatchSource, ImageContrastiveTask


def write_json(path: Path, value: dict) -> None:
    atomic_write_bytes(Path(path), json.dumps(value, indent=2, default=str).encode())


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------------------------------------------- training
def load_pseudo_labels(*, path: Path, dataset: ImageArrayDataset) -> np.ndarray:
    """Pseudo-label groups (M_train,) aligned to the dataset's train split, verified by sample id."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"pseudo-labels {path} are missing: rerun the pipeline so the clustering step writes them")
    stored = np.load(path, allow_pickle=False)
    train_ids = dataset.ids[dataset.indices("train")]
    return align_labels_to_ids(label_ids=stored["ids"], labels=stored["groups"], dataset_ids=train_ids)


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
    train_indices = dataset.indices("train")
    groups = None if spec.pseudo_labels_path is None else load_pseudo_labels(path=spec.pseudo_labels_path,
                                                                             dataset=dataset)
    batch = per_rank_batch(global_batch_size=spec.batch_size, world_size=info.world_size)
    sampler = ClusterBatchSampler(groups=groups, num_samples=len(train_indices), batch_size=batch, seed=spec.seed,
                                  world_size=info.world_size, rank=info.rank,
                                  remainder_policy=spec.remainder_policy)
    seed_everything(spec.seed)
    method = build_method(model_kwargs=spec.model, method_kwargs=spec.method)
    torch_device = device_for(name=spec.device, info=info)
    source = ImageBatchSource(
        sampler=sampler, ids=dataset.ids[train_indices], groups=groups, info=info,
        read_batches=lambda planned: read_image_batches(dataset=dataset, rows_in_split=train_indices,
                                                        planned=planned, workers=spec.workers))
    task = ImageContrastiveTask(method=method, augment=TwoViewAugment(**spec.augment), seed=spec.seed,
                                channels_last=spec.loop.channels_last)
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
    summary = {"steps": result.steps, "epochs": result.epochs, "final_loss": result.final_loss,
               "resumed_from_step": result.resumed_from_step, "seconds": result.seconds,
               "samples_per_second": result.samples_per_second,
               "views_per_second": task.views_per_sample * result.samples_per_second,
               "trimmed_samples": result.trimmed_samples, "epochs_ended_early": result.epochs_ended_early,
               "world_size": info.world_size, "per_rank_batch": batch, "global_batch": spec.batch_size,
               "batch_plan": sampler.stats, "cluster_pure_batches": groups is not None,
               "model_path": str(model_path)}
    if info.is_main:
        model_path.parent.mkdir(parents=True, exist_ok=True)
        buffer_path = model_path.with_suffix(".tmp")
        torch.save({"state_dict": method.state_dict(), "model_kwargs": spec.model, "method_kwargs": spec.method},
                   buffer_path)
        buffer_path.replace(model_path)
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
    if not Path(model_path).exists():
        raise DataError(f"trained model {model_path} is missing: rerun the pipeline to retrain this stage")
    saved = torch.load(model_path, map_location=device, weights_only=False)
    method = build_method(model_kwargs=saved["model_kwargs"], method_kwargs=saved["method_kwargs"])
    method.load_state_dict(saved["state_dict"])
    return method.to(device).eval()


# ---------------------------------------------------------------------------------------------------- export
def export_stage_embeddings(*, dataset_dir: Path, model_path: Path, out_dir: Path, batch_size: int, device: str,
                            progress: Callable[[int], None] | None = None) -> dict:
    """Embed every sample (train and test) with the stage's backbone; float16 shards + ids in ``out_dir``."""
    dataset = load_dataset(dataset_dir)
    torch_device = device_for(name=device)
    model = load_trained_model(model_path=model_path, device=torch_device)
    embeddings = compute_embeddings(encode=model.embed, get_batch=dataset.get_batch, num_samples=len(dataset),
                                    batch_size=batch_size, device=torch_device, progress=progress)
    manifest = save_embeddings(embeddings=embeddings, ids=dataset.ids, directory=out_dir)
    return {"dir": str(out_dir), "num_samples": manifest["num_samples"], "dim": manifest["dim"]}


def _train_split_embeddings(*, embeddings_dir: Path, dataset: ImageArrayDataset) -> tuple[np.ndarray, np.ndarray]:
    ids, embeddings = load_embeddings(directory=embeddings_dir)
    dataset.verify_ids(ids)
    train = dataset.indices("train")
    return ids[train], embeddings[train]


# ---------------------------------------------------------------------------------------------------- clustering
def cluster_stage(*, dataset_dir: Path, embeddings_dir: Path, out_dir: Path, k: int, seed: int, niter: int,
                  spherical: bool, init: str, max_train_points: int | None,
                  earlier_cluster_dirs: list[Path]) -> dict:
    """k-means on the train split's embeddings of one stage; AMI against every earlier stage's clustering."""
    dataset = load_dataset(dataset_dir)
    ids, features = _train_split_embeddings(embeddings_dir=embeddings_dir, dataset=dataset)
    result = kmeans(features=features, k=k, seed=seed, niter=niter, spherical=spherical, init=init,
                    max_train_points=max_train_points)
    summary = save_clusters(result=result, ids=ids, directory=Path(out_dir))
    ami = {}
    for number, earlier in enumerate(earlier_cluster_dirs):
        earlier_ids, earlier_assignments = load_assignments(directory=earlier)
        aligned = align_labels_to_ids(label_ids=earlier_ids, labels=earlier_assignments, dataset_ids=ids)
        ami[f"stage_{number}"] = adjusted_mutual_information(a=aligned, b=result.assignments)
    # AMI against the ground-truth attributes says which features the clusters absorbed.
    train = dataset.indices("train")
    for attribute, labels in dataset.labels.items():
        if (labels[train] >= 0).any():
            ami[f"attr_{attribute}"] = adjusted_mutual_information(a=labels[train], b=result.assignments)
    summary = {**summary, "ami": ami, "dir": str(out_dir)}
    write_json(Path(out_dir) / "summary.json", summary)
    return summary


def build_pseudo_labels(*, dataset_dir: Path, cluster_dirs: list[Path], embeddings_dirs: list[Path], out_path: Path,
                        min_group_size: int, small_group_policy: str) -> dict:
    """Pseudo-label for the next stage = combine(y_0, ..., y_j): the tuple of ALL earlier stages' cluster ids.

    Groups smaller than a batch are handled by ``small_group_policy`` (merge into the nearest group by centroid
    in the concatenated earlier-stage embedding space, pool, or none); counts go in the returned stats.
    """
    dataset = load_dataset(dataset_dir)
    train_ids = dataset.ids[dataset.indices("train")]
    stage_assignments = []
    for cluster_dir in cluster_dirs:
        ids, assignments = load_assignments(directory=cluster_dir)
        stage_assignments.append(align_labels_to_ids(label_ids=ids, labels=assignments, dataset_ids=train_ids))
    combined = combine_pseudo_labels(stage_assignments=stage_assignments)
    features = None
    if small_group_policy == "merge_nearest":
        features = concat_normalized(stage_embeddings=[
            _train_split_embeddings(embeddings_dir=d, dataset=dataset)[1] for d in embeddings_dirs])
    return save_merged_pseudo_labels(ids=train_ids, combined=combined, features=features,
                                     min_group_size=min_group_size, small_group_policy=small_group_policy,
                                     stages_combined=len(cluster_dirs), out_path=out_path)


def save_merged_pseudo_labels(*, ids: np.ndarray, combined: np.ndarray, features: np.ndarray | None,
                              min_group_size: int, small_group_policy: str, stages_combined: int, out_path: Path,
                              extra_stats: dict | None = None) -> dict:
    """Apply ``small_group_policy`` to the combined pseudo-labels (aligned to ``ids``), write ``{ids, groups}`` to
    ``out_path`` and the stats beside it as JSON; returns the stats. Shared by the MCL and CLIP pipelines so both
    write one file format. The npz is written to a temporary name and renamed, so a killed run never leaves a
    half-written file that the next run would trust. ``extra_stats`` go before ``path`` in the stats."""
    groups, stats = merge_small_groups(groups=combined, features=features, min_size=min_group_size,
                                       policy=small_group_policy)
    sizes = np.bincount(groups)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp.npz")
    np.savez(tmp, ids=ids, groups=groups)
    tmp.replace(out)
    stats = {**stats, "stages_combined": stages_combined, "num_groups": int(sizes.size),
             "min_group": int(sizes.min()), "max_group": int(sizes.max()), **(extra_stats or {}), "path": str(out)}
    write_json(out.with_suffix(".json"), stats)
    return stats


# ---------------------------------------------------------------------------------------------------- evaluation
def evaluate_embeddings(*, dataset_dir: Path, embeddings_dirs: list[Path], probe_c: float, probe_max_iter: int,
                        probe_max_train: int, knn_k: int, seed: int) -> dict[str, float]:
    """Probe one stage (one dir) or the concatenation of several stages' L2-normalised embeddings."""
    dataset = load_dataset(dataset_dir)
    stage_embeddings = []
    for directory in embeddings_dirs:
        ids, embeddings = load_embeddings(directory=directory)
        dataset.verify_ids(ids)
        stage_embeddings.append(embeddings)
    features = concat_normalized(stage_embeddings=stage_embeddings)
    train, test = dataset.indices("train"), dataset.indices("test")
    return evaluate_representation(
        train_x=features[train], test_x=features[test],
        train_labels={a: y[train] for a, y in dataset.labels.items()},
        test_labels={a: y[test] for a, y in dataset.labels.items()},
        probe_c=probe_c, probe_max_iter=probe_max_iter, probe_max_train=probe_max_train, knn_k=knn_k, seed=seed)
