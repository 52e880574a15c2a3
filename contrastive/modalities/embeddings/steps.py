"""The steps of one embeddings MCL stage as plain functions over directories: train a fresh MLP encoder on the
engine (random batches for stage 0, cluster-pure batches from the pseudo-labels of all earlier stages after it),
export its representation of every vector keyed by sample id, and score one stage or the concatenation of
several (linear probe and kNN per attribute). Training and export run in one process or as the ranks of a torchrun
launch (``*_from_json``, the modality's ``Launch``). Nothing here knows about Prefect or MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from contrastive.data.dataset import RowsOf
from contrastive.embeddings import export_ranked, rank_share
from contrastive.engine.callbacks import JsonlMetrics, KeyRecorder
from contrastive.engine.checkpoint import save_torch
from contrastive.engine.distributed import DistInfo, current_info, device_for
from contrastive.engine.files import write_json, write_stage_summary
from contrastive.engine.safe_load import load_torch_file
from contrastive.engine.loop import TrainCallback, release_device_memory, train
from contrastive.engine.task import StageSpec
from contrastive.errors import DataError
from contrastive.integrate import concat_normalized
from contrastive.mcl.steps import start_stage
from contrastive.modalities.embeddings.adapter import FeatureBatchSource, FeatureSimCLR, FeatureViewTask
from contrastive.modalities.embeddings.data import load_feature_dataset


@dataclass(frozen=True, kw_only=True)
class FeatureStageSpec(StageSpec):
    """One embeddings training stage, built by the embeddings config. encoder: {"hidden", "depth", "dim",
    "projection_dim"}; views: {"temperature", "feature_dropout", "noise"} (the config's sections as JSON; the
    encoder is saved with the model, so it rebuilds)."""
    dataset_dir: str
    pseudo_labels_path: str | None
    encoder: dict
    views: dict
    batch_size: int
    remainder_policy: str
    #: model.pt of the previous stage to start from (mcl.inherit, the paper's Table 5 ablation); None = fresh.
    init_model_path: str | None = None


def build_model(*, in_dim: int, encoder: dict, temperature: float) -> FeatureSimCLR:
    return FeatureSimCLR(in_dim=in_dim, hidden=encoder["hidden"], depth=encoder["depth"], dim=encoder["dim"],
                         projection_dim=encoder["projection_dim"], temperature=temperature)


def train_feature_stage_from_json(*, spec: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun launch (``contrastive.engine.launch``): the spec arrives as JSON."""
    return train_feature_stage(FeatureStageSpec.from_json(spec), info=info)


def train_feature_stage(spec: FeatureStageSpec, *, info: DistInfo | None = None, callbacks: list[TrainCallback] = (),
                        stop_after_steps: int | None = None) -> dict:
    """Train a FRESH MLP encoder for one stage; writes ``checkpoints/last.pt`` (resumable), ``model/model.pt`` and
    ``train_summary.json`` into ``spec.stage_dir``.

    Under torchrun (DDP) ``spec.batch_size`` is the GLOBAL batch: each of the W ranks holds batch_size / W vectors
    of it (cluster-pure global batches split across the ranks, as for images and sentences), NT-Xent's negatives
    are gathered from every rank with their gradient and batch norm covers the global batch, so W ranks compute the
    loss of the one global batch. Without feature dropout and noise that is the single-process training exactly;
    with them, rank 0 keeps the single process's view stream and every other rank draws its own. Rank 0 writes the
    files."""
    info = info or current_info()
    stage_dir, dataset, batch, plan = start_stage(spec, info=info, open_dataset=load_feature_dataset)
    features = np.asarray(dataset.features[plan.train_rows], dtype=np.float32)
    model = build_model(in_dim=dataset.dim, encoder=spec.encoder, temperature=spec.views["temperature"])
    if spec.init_model_path is not None:  # a resume's checkpoint still wins: the engine loads it over these
        model.load_state_dict(load_torch_file(spec.init_model_path, what="init model (init_model_path)")
                              ["state_dict"])
    # The same initial weights on every rank, a view stream of its own (the same draws on every rank would
    # correlate the noise of the global batch's rows).
    task = FeatureViewTask(model=model, feature_std=features.std(axis=0),
                           feature_dropout=spec.views["feature_dropout"], noise=spec.views["noise"],
                           seed=spec.seed + 7919 * info.rank)
    torch_device = device_for(name=spec.device, info=info)
    recorder = KeyRecorder()
    # Under torchrun the flow reads the metrics from this file once the launch ends.
    extra = [JsonlMetrics(stage_dir / "train_metrics.jsonl")] if info.is_distributed else []
    result = train(task=task, source=FeatureBatchSource(sampler=plan.sampler, features=features,
                                                        ids=RowsOf(dataset.ids, plan.train_rows)),
                   optim=spec.optim, loop=spec.loop, device=torch_device,
                   checkpoint_path=stage_dir / "checkpoints" / "last.pt", info=info,
                   callbacks=[*callbacks, *extra, *([recorder] if spec.record_keys else [])],
                   stop_after_steps=stop_after_steps)
    if spec.record_keys:
        write_json(stage_dir / f"keys_rank{info.rank}.json", {
            "batches": recorder.batches, "losses": [h["train/loss"] for h in result.history]})
    model_path = stage_dir / "model" / "model.pt"
    summary = {**result.summary(), "world_size": info.world_size, "per_rank_batch": batch,
               "global_batch": spec.batch_size, "batch_plan": plan.sampler.stats,
               "cluster_pure_batches": plan.groups is not None, "model_path": str(model_path)}
    if info.is_main:
        save_torch({"state_dict": model.state_dict(), "in_dim": dataset.dim, "encoder": spec.encoder,
                    "views": spec.views}, model_path, what="the stage's final model")
        write_stage_summary(stage_dir / "train_summary.json", summary)
    del task
    release_device_memory(torch_device)
    return summary


def load_feature_model(*, model_path: Path | str, device: torch.device) -> FeatureSimCLR:
    """A trained stage's model (eval mode) on ``device``."""
    if not Path(model_path).exists():
        raise DataError(f"trained model {model_path} is missing: rerun the pipeline to retrain this stage")
    saved = load_torch_file(model_path, what="trained model")
    model = build_model(in_dim=saved["in_dim"], encoder=saved["encoder"], temperature=saved["views"]["temperature"])
    model.load_state_dict(saved["state_dict"])
    return model.to(device).eval()


@torch.no_grad()
def embed_features(model: FeatureSimCLR, features: np.ndarray, *, device: torch.device,
                   batch_size: int = 4096) -> np.ndarray:
    """float32 (n, dim) representations (the encoder's output, no projection head) of (n, D) features."""
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 2 or features.shape[1] != model.encoder[0].in_features:
        raise ValueError(f"expected (n, {model.encoder[0].in_features}) features, got {features.shape}")
    blocks = [model.encoder(torch.tensor(features[start:start + batch_size]).to(device)).float().cpu().numpy()
              for start in range(0, len(features), batch_size)]
    return np.concatenate(blocks) if blocks else np.zeros((0, model.encoder[-1].out_features), np.float32)


def export_feature_embeddings(*, dataset_dir: str, model_path: str, out_dir: str, batch_size: int, device: str,
                              info: DistInfo | None = None) -> dict:
    """Embed every vector (train and test) with the stage's encoder: float16 shards + ids in ``out_dir``.

    Under torchrun each rank embeds a contiguous share of the vectors (``rank_share``) and rank 0 writes the
    manifest in rank order (the same ids order as one process: ``export_ranked``)."""
    info = info or current_info()
    dataset = load_feature_dataset(dataset_dir)
    torch_device = device_for(name=device, info=info)
    model = load_feature_model(model_path=model_path, device=torch_device)
    mine = rank_share(len(dataset.ids), info=info)

    def embed(writer) -> dict[str, int]:
        writer.add(embed_features(model, dataset.features[mine], device=torch_device, batch_size=batch_size),
                   dataset.ids[mine])
        return {}

    return export_ranked(out_dir=Path(out_dir), info=info, embed=embed)


def export_features_from_json(*, export: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun export (``contrastive.engine.launch``)."""
    return export_feature_embeddings(**export, info=info)


def evaluate_feature_embeddings(*, dataset_dir: str, embeddings_dirs: list[str], probe_c: float,
                                probe_max_iter: int, probe_max_train: int, knn_k: int, seed: int) -> dict[str, float]:
    """Linear probe and kNN per attribute of one stage (one dir) or the concatenation of several stages'
    L2-normalised embeddings; {} when the vectors have no labels or no held-out split."""
    from contrastive.evaluate import read_stage_embeddings, score_attributes
    dataset = load_feature_dataset(dataset_dir)
    features = concat_normalized(stage_embeddings=read_stage_embeddings(dataset=dataset,
                                                                        embeddings_dirs=embeddings_dirs))
    return score_attributes(dataset=dataset, features=features, probe_c=probe_c, probe_max_iter=probe_max_iter,
                            probe_max_train=probe_max_train, knn_k=knn_k, seed=seed)
