"""The MCL steps between two stages, for every modality: k-means on a stage's exported embeddings, and the
pseudo-labels of the next stage (the tuple of ALL earlier stages' cluster ids).

Both read what the export wrote (float16 shards + sample ids) and key everything by sample id, never by position.
A modality says which samples take part (``ids``: the unimodal pipeline clusters its training split, the CLIP
pipeline every exported sample) and which ground-truth attributes the clusters can be compared with.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from contrastive.data.dataset import RowsOf, npz_column_for_ids, save_index
from contrastive.embeddings import load_embedding_ids, load_embedding_rows, load_embeddings
from contrastive.engine.distributed import DistInfo, per_rank_batch
from contrastive.engine.files import write_stage_summary
from contrastive.engine.rng import seed_everything
from contrastive.errors import DataError
from contrastive.integrate import concat_normalized
from contrastive.mcl.ids import align_labels_to_ids
from contrastive.mcl.pseudo_labels import combine_pseudo_labels
from contrastive.mcl.sampler import ClusterBatchSampler
from contrastive.mcl.small_groups import merge_small_groups


@dataclass(frozen=True)
class KMeansSpec:
    """k-means after one stage (``contrastive.mcl.clustering.kmeans``): K clusters, Lloyd iterations, cosine or
    Euclidean, the seeding, and the sample Lloyd trains on (None: every point)."""
    k: int
    seed: int
    niter: int = 25
    spherical: bool = True
    init: str = "auto"
    max_train_points: int | None = None


def embeddings_for(*, embeddings_dir: Path, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, (N, D) embeddings) of one export, restricted to and ordered as ``ids`` when given."""
    if ids is None:
        return load_embeddings(directory=Path(embeddings_dir))
    stored_ids = load_embedding_ids(directory=Path(embeddings_dir))
    rows = align_labels_to_ids(label_ids=stored_ids, labels=np.arange(stored_ids.size), dataset_ids=ids)
    return ids, load_embedding_rows(directory=Path(embeddings_dir), rows=rows)  # the rows alone: one copy


def cluster_stage(*, embeddings_dir: Path, out_dir: Path, kmeans_spec: KMeansSpec, earlier_cluster_dirs: list[Path],
                  ids: np.ndarray | None = None, attributes: dict[str, np.ndarray] | None = None,
                  gpu_devices: tuple[int, ...] = (0,)) -> dict:
    """k-means on one stage's embeddings of ``ids`` (all exported samples when None); writes assignments keyed by
    sample id, centroids, sizes and inertia to ``out_dir``, and the AMI against every earlier stage's clustering and
    against each attribute in ``attributes`` (int labels aligned to ``ids``, -1 unknown): which features the
    clusters absorbed. ``gpu_devices``: the GPUs k-means may use when faiss sees them (): the CPU); where it runs
    is placement, not content, so it is no part of ``kmeans_spec``."""
    # faiss and scikit-learn cost seconds to import in every torchrun worker that never clusters.
    from contrastive.mcl.clustering import adjusted_mutual_information, assignments_for, kmeans, save_clusters

    ids, features = embeddings_for(embeddings_dir=embeddings_dir, ids=ids)
    s = kmeans_spec
    result = kmeans(features=features, k=s.k, seed=s.seed, niter=s.niter, spherical=s.spherical, init=s.init,
                    max_train_points=s.max_train_points, gpu_devices=gpu_devices)
    summary = save_clusters(result=result, ids=ids, directory=Path(out_dir))
    ami = {}
    for number, earlier in enumerate(earlier_cluster_dirs):
        aligned = assignments_for(directory=Path(earlier), ids=ids)
        ami[f"stage_{number}"] = adjusted_mutual_information(a=aligned, b=result.assignments)
    for attribute, labels in (attributes or {}).items():
        if (labels >= 0).any():
            ami[f"attr_{attribute}"] = adjusted_mutual_information(a=labels, b=result.assignments)
    summary = {**summary, "ami": ami, "dir": str(out_dir)}
    write_stage_summary(Path(out_dir) / "summary.json", summary)
    return summary


def build_pseudo_labels(*, cluster_dirs: list[Path], embeddings_dirs: list[Path], out_path: Path,
                        min_group_size: int, small_group_policy: str, ids: np.ndarray | None = None) -> dict:
    """Pseudo-label for the next stage = combine(y_0, ..., y_j): the tuple of ALL earlier stages' cluster ids,
    for ``ids`` (the samples of the latest export when None), written as ``{ids, groups}`` to ``out_path``.

    Groups smaller than ``min_group_size`` (the global batch) are handled by ``small_group_policy``: merged into
    the nearest group by centroid in the concatenated, per-stage normalised embedding space, pooled, or kept;
    counts go in the returned stats, written beside the labels.
    """
    from contrastive.mcl.clustering import assignments_for

    if ids is None:
        ids = load_embedding_ids(directory=Path(embeddings_dirs[-1]))
    stage_assignments = [assignments_for(directory=Path(d), ids=ids) for d in cluster_dirs]
    combined = combine_pseudo_labels(stage_assignments=stage_assignments)
    features = None
    # Only a merge into a large group reads the embeddings: all stages' (M, D) concatenated as float32 (110 GB for
    # 3 stages of CC12M at 768-d), so they are loaded when some groups are small and some large, not on every call.
    small = np.bincount(combined) < min_group_size
    if small_group_policy == "merge_nearest" and small.any() and not small.all():
        features = concat_normalized(stage_embeddings=[embeddings_for(embeddings_dir=d, ids=ids)[1]
                                                       for d in embeddings_dirs])
    groups, stats = merge_small_groups(groups=combined, features=features, min_size=min_group_size,
                                       policy=small_group_policy)
    sizes = np.bincount(groups)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp.npz")  # renamed once complete: a killed run never leaves half a file
    save_index(tmp, {"ids": ids, "groups": groups})  # string ids without pickle, never whole as <U
    tmp.replace(out)
    stats = {**stats, "stages_combined": len(cluster_dirs), "num_groups": int(sizes.size),
             "min_group": int(sizes.min()), "max_group": int(sizes.max()), "samples": int(ids.size), "path": str(out)}
    write_stage_summary(out.with_suffix(".json"), stats)
    return stats


def load_pseudo_labels(*, path: Path, ids) -> np.ndarray:
    """Pseudo-label groups (M,) aligned to ``ids`` (an array, or a ``RowsOf`` view of a dataset's ids), verified
    by sample id. When the file's ids are ``ids`` in the
    same order (the labels of this dataset's training split: the usual case) they are compared chunk by chunk as
    they are read, never held whole (a ``<U`` copy costs 4 B a character of the longest id, each: 120 MB at 1M
    30-character paths); otherwise they are loaded and joined."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"pseudo-labels {path} are missing: rerun the pipeline so the clustering step writes them")
    groups = npz_column_for_ids(path, ids=ids, name="groups")
    if groups is not None:
        return groups
    with np.load(path, allow_pickle=False) as stored:
        return align_labels_to_ids(label_ids=stored["ids"], labels=stored["groups"], dataset_ids=ids)


class StagePlan(NamedTuple):
    """One stage's training rows (int64 (M,) positions of the train split in the dataset), their batch plan and
    pseudo-label groups ((M,), None for random batches)."""
    train_rows: np.ndarray
    sampler: ClusterBatchSampler
    groups: np.ndarray | None


def stage_sampler(*, dataset, pseudo_labels_path: Path | str | None, batch_size: int, seed: int,
                  remainder_policy: str, world_size: int = 1, rank: int = 0) -> StagePlan:
    """The batch plan of one stage over the M training samples of ``dataset`` (a ``SampleIndex``): cluster-pure
    batches of ``batch_size`` per rank from the pseudo-labels at ``pseudo_labels_path`` (MCL stages >= 1,
    Algorithm 1), random batches without it (stage 0, the control run)."""
    train_rows = dataset.indices("train")
    train_ids = RowsOf(dataset.ids, train_rows)  # compared with the pseudo-labels' ids a slice at a time, not copied
    groups = None if pseudo_labels_path is None else load_pseudo_labels(path=Path(pseudo_labels_path), ids=train_ids)
    sampler = ClusterBatchSampler(groups=groups, num_samples=len(train_rows), batch_size=batch_size, seed=seed,
                                  world_size=world_size, rank=rank, remainder_policy=remainder_policy)
    return StagePlan(train_rows=train_rows, sampler=sampler, groups=groups)


class StageStart(NamedTuple):
    """What a training stage over a prepared dataset starts from (:func:`start_stage`)."""
    stage_dir: Path
    dataset: Any
    batch: int  # this rank's share of the global batch
    plan: StagePlan


def start_stage(spec, *, info: DistInfo, open_dataset: Callable[[str], Any]) -> StageStart:
    """The start every modality's stage over a dataset shares: torch's CPU threads (``spec.threads``, 0 = torch's
    default), the dataset at ``spec.dataset_dir`` (opened by ``open_dataset``), this rank's share of the global
    ``spec.batch_size``, the stage's batch plan (cluster-pure with ``spec.pseudo_labels_path``) and every RNG seeded
    with ``spec.seed``, last, so the model the caller builds next starts from the same weights on every rank.

    ``spec``: a ``StageSpec`` with ``dataset_dir``, ``pseudo_labels_path``, ``batch_size`` and ``remainder_policy``.
    """
    if spec.threads:
        torch.set_num_threads(spec.threads)
    dataset = open_dataset(spec.dataset_dir)
    batch = per_rank_batch(global_batch_size=spec.batch_size, world_size=info.world_size)
    plan = stage_sampler(dataset=dataset, pseudo_labels_path=spec.pseudo_labels_path, batch_size=batch, seed=spec.seed,
                         remainder_policy=spec.remainder_policy, world_size=info.world_size, rank=info.rank)
    seed_everything(spec.seed)
    return StageStart(stage_dir=Path(spec.stage_dir), dataset=dataset, batch=batch, plan=plan)
