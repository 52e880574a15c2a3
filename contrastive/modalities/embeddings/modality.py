"""The embeddings modality (``pipeline: embeddings``): MCL over precomputed feature vectors (the user's ``.npy``
or synthetic features with a dominant and a weaker attribute), small MLP encoders trained stage by stage, probed
per attribute. The smallest complete modality: docs/architecture.md walks through it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from contrastive.modalities.base import Launch, Member, Modality, ResultsTable, ServingInput


class EmbeddingsModality(Modality):
    name = "embeddings"
    title = "feature vectors"
    step_prefix = "emb-"
    export_batch_size = 4096
    launch = Launch(train_entry="contrastive.modalities.embeddings.steps:train_feature_stage_from_json",
                    export_entry="contrastive.modalities.embeddings.steps:export_features_from_json")
    # torchvision: the stage model is a contrastive.methods model, whose package imports contrastive.models.
    serving = ServingInput(dtype="float32", shape=(-1, -1), description="float32 feature vectors (n, D)",
                           requirements=("torch", "torchvision", "numpy"))

    # ------------------------------------------------------------------------------------------ checks and data
    def preflight(self, config) -> None:
        from contrastive.modalities.embeddings.config import preflight_features
        preflight_features(config)

    def prepare_data(self, config, *, log: Callable[[str], None]) -> dict:
        """Generate (or find) the synthetic features, or read the user's files (errors name the file and the fix);
        check the capacity rule against the number of training vectors before any training."""
        from contrastive.modalities.embeddings import data as features_data
        from contrastive.modalities.embeddings.config import check_features_feasible
        d = config.data
        if d.kind == "synthetic":
            s = d.synthetic
            path = features_data.prepare_synthetic(root=d.cache_dir, num_train=s.num_train, num_test=s.num_test,
                                                   dim=s.dim, classes=s.classes, scales=s.scales, noise=s.noise,
                                                   seed=s.seed)
        else:
            f = d.files
            path = features_data.prepare_feature_files(root=d.cache_dir, features_path=f.features, ids_path=f.ids,
                                                       labels_path=f.labels, test_fraction=f.test_fraction,
                                                       seed=config.seed)
        dataset = features_data.load_feature_dataset(path)
        num_train = len(dataset.indices("train"))
        check_features_feasible(config, num_train=num_train)
        log(f"feature vectors in {path}: {num_train} training vectors of dimension {dataset.dim}, attributes "
            f"{dataset.attributes}")
        return {"dir": str(path), "digest": dataset.digest, "num_train": num_train,
                "num_test": len(dataset.indices("test")), "dim": dataset.dim, "attributes": dataset.attributes}

    def open_dataset(self, directory: str):
        from contrastive.modalities.embeddings.data import load_feature_dataset
        return load_feature_dataset(directory)

    # ------------------------------------------------------------------------------------------ training
    def train_content(self, config, *, stage: int, seed: int, data: dict, batches_key: str | None,
                      inherit_key: str | None) -> dict:
        """What a stage's weights depend on: encoder, views, training, seed, data and its batches, and the number of
        processes when it is not 1 (each rank draws its own views; absent for one process, so the keys of
        single-process stages are what they were)."""
        content = {"step": "emb-train", "model": config.model.content(), "method": config.method.content(),
                   "train": config.train_key_content(), "seed": seed, "data": data["digest"],
                   "pseudo_labels": batches_key,
                   "remainder_policy": config.mcl.remainder_policy if batches_key else None,
                   "inherit_from": inherit_key}
        if config.distributed.world_size() != 1:
            content["processes"] = config.distributed.world_size()
        return content

    def train_spec(self, config, *, stage: int, seed: int, out_dir: str, data: dict, batches_path: str | None,
                   init_model_path: str | None):
        from contrastive.modalities.embeddings.steps import FeatureStageSpec
        return FeatureStageSpec(
            **self.stage_fields(config, seed=seed, out_dir=out_dir, data=data, batches_path=batches_path),
            encoder=config.model.model_dump(mode="json"), views=config.method.model_dump(mode="json"),
            init_model_path=init_model_path)

    def train(self, spec, *, callbacks: list) -> dict:
        from contrastive.modalities.embeddings.steps import train_feature_stage
        return train_feature_stage(spec, callbacks=callbacks)

    # ------------------------------------------------------------------------------------------ export
    def export(self, **kwargs) -> dict:
        from contrastive.modalities.embeddings.steps import export_feature_embeddings
        return export_feature_embeddings(**kwargs)

    # ------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, config, *, members: list[Member], data: dict, out_dir: str) -> dict[str, float]:
        from contrastive.modalities.embeddings.steps import evaluate_feature_embeddings
        e = config.eval
        return evaluate_feature_embeddings(
            dataset_dir=data["dir"], embeddings_dirs=[m.embeddings_dir for m in members], probe_c=e.probe_c,
            probe_max_iter=e.probe_max_iter, probe_max_train=e.probe_max_train, knn_k=e.knn_k, seed=config.seed)

    # ------------------------------------------------------------------------------------------ reporting
    def tables(self, config, summary: dict) -> list[ResultsTable]:
        results = summary["results"]
        return [ResultsTable(title=f"{config.name}: linear-probe accuracy (held-out vectors)", rows=results,
                             metric="probe"),
                ResultsTable(title="kNN accuracy", rows=results, metric="knn")]

    # ------------------------------------------------------------------------------------------ serving
    def load_encoder(self, model_path: str):
        import torch

        from contrastive.modalities.embeddings.steps import load_feature_model
        return load_feature_model(model_path=model_path, device=torch.device("cpu"))

    def embed(self, encoder, inputs) -> np.ndarray:
        """float32 (n, dim) representations of (n, D) vectors (an array, a list of rows or a numeric frame)."""
        import torch

        from contrastive.modalities.embeddings.steps import embed_features
        rows = inputs.to_numpy() if hasattr(inputs, "to_numpy") else np.asarray(inputs)
        return embed_features(encoder, np.atleast_2d(rows), device=torch.device("cpu"))


MODALITY = EmbeddingsModality()
