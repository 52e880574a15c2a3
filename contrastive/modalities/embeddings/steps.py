"""The steps of one embeddings MCL stage as plain functions over directories: train a fresh MLP encoder on the
engine (random batches for stage 0, cluster-pure batches from the pseudo-labels of all earlier stages after it),
export its representation of every vector keyed by sample id, and score one stage or the concatenation of
several (linear probe and kNN per attribute). Nothing here knows about Prefect or MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from contrastive.data.dataset import RowsOf
from contrastive.embeddings import save_embeddings
from contrastive.engine.checkpoint import save_torch
from contrastive.engine.files import write_stage_summary
from contrastive.engine.safe_load import load_torch_file
from contrastive.engine.distributed import device_for, single_process_info
from contrastive.engine.launch import EXPORT_SUMMARY
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


def train_feature_stage(spec: FeatureStageSpec, *, callbacks: list[TrainCallback] = (),
                        stop_after_steps: int | None = None) -> dict:
    """Train a FRESH MLP encoder for one stage; writes ``checkpoints/last.pt`` (resumable), ``model/model.pt`` and
    ``train_summary.json`` into ``spec.stage_dir``."""
    info = single_process_info(threads=spec.threads, what="embeddings")
    stage_dir, dataset, _, plan = start_stage(spec, info=info, open_dataset=load_feature_dataset)
    features = np.asarray(dataset.features[plan.train_rows], dtype=np.float32)
    model = build_model(in_dim=dataset.dim, encoder=spec.encoder, temperature=spec.views["temperature"])
    if spec.init_model_path is not None:  # a resume's checkpoint still wins: the engine loads it over these
        model.load_state_dict(load_torch_file(spec.init_model_path, what="init model (init_model_path)")
                              ["state_dict"])
    task = FeatureViewTask(model=model, feature_std=features.std(axis=0),
                           feature_dropout=spec.views["feature_dropout"], noise=spec.views["noise"], seed=spec.seed)
    torch_device = device_for(name=spec.device, info=info)
    result = train(task=task, source=FeatureBatchSource(sampler=plan.sampler, features=features,
                                                        ids=RowsOf(dataset.ids, plan.train_rows)),
                   optim=spec.optim, loop=spec.loop, device=torch_device,
                   checkpoint_path=stage_dir / "checkpoints" / "last.pt", info=info, callbacks=list(callbacks),
                   stop_after_steps=stop_after_steps)
    model_path = stage_dir / "model" / "model.pt"
    save_torch({"state_dict": model.state_dict(), "in_dim": dataset.dim, "encoder": spec.encoder,
                "views": spec.views}, model_path, what="the stage's final model")
    summary = {**result.summary(), "global_batch": spec.batch_size, "batch_plan": plan.sampler.stats,
               "cluster_pure_batches": plan.groups is not None, "model_path": str(model_path)}
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


def export_feature_embeddings(*, dataset_dir: str, model_path: str, out_dir: str, batch_size: int,
                              device: str) -> dict:
    """Embed every vector (train and test) with the stage's encoder: float16 shards + ids in ``out_dir``."""
    dataset = load_feature_dataset(dataset_dir)
    torch_device = device_for(name=device)
    model = load_feature_model(model_path=model_path, device=torch_device)
    manifest = save_embeddings(embeddings=embed_features(model, dataset.features, device=torch_device,
                                                         batch_size=batch_size),
                               ids=dataset.ids, directory=Path(out_dir))
    summary = {"dir": str(out_dir), "num_samples": manifest["num_samples"], "dim": manifest["dim"]}
    write_stage_summary(Path(out_dir) / EXPORT_SUMMARY, summary)
    return summary


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
