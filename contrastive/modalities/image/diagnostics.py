"""The image modality's per-stage diagnostics: the shared cosine geometry of :mod:`contrastive.diagnostics` over a
stage's exported embeddings, grouped by every attribute and the stage's k-means clusters, and alignment measured
on two augmented views of some of the stage's training images.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from contrastive.data.loading import load_dataset
from contrastive.diagnostics import diagnose_embeddings, plot_similarity_histograms
from contrastive.embeddings import load_embedding_ids, load_embedding_rows
from contrastive.engine.distributed import device_for
from contrastive.engine.files import write_json
from contrastive.engine.precision import autocast_context
from contrastive.mcl.clustering import load_assignments
from contrastive.mcl.ids import align_labels_to_ids
from contrastive.modalities.image.augment import TwoViewAugment


@torch.no_grad()
def embed_two_views(*, encode: Callable[[torch.Tensor], torch.Tensor], images_uint8: torch.Tensor,
                    augment: Callable, seed: int, batch_size: int, device: torch.device
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings (V, D) of two augmentations of each of V images (uint8 (V, 3, H, W)), for alignment."""
    generator = torch.Generator().manual_seed(seed)
    first, second = [], []
    for start in range(0, len(images_uint8), batch_size):
        view1, view2 = augment(images_uint8[start:start + batch_size], generator)
        first.append(encode(view1.to(device)).float().cpu().numpy())
        second.append(encode(view2.to(device)).float().cpu().numpy())
    return np.concatenate(first), np.concatenate(second)


def diagnose_stage(*, dataset_dir: Path, embeddings_dir: Path, out_dir: Path, clusters_dir: Path | None = None,
                   model_path: Path | None = None, augment_kwargs: dict | None = None, device: str = "cpu",
                   num_pairs: int = 20_000, alignment_samples: int = 1_000, seed: int = 0, title: str = "",
                   precision: str = "fp32", channels_last: bool = False) -> dict:
    """Diagnostics of one stage's exported embeddings over the train split; groupings = every attribute with
    labels, plus the stage's k-means clusters when ``clusters_dir`` is given. With ``model_path`` and
    ``augment_kwargs``, alignment is measured on ``alignment_samples`` images, encoded as the export encodes
    (the stage's ``precision`` and memory format: on a 2-core CPU bf16 and channels_last make it ~2x faster).
    Writes ``out_dir/metrics.json`` and ``out_dir/similarity.png``; returns {"metrics", "plot"}."""
    from contrastive.modalities.image.steps import load_trained_model

    dataset = load_dataset(dataset_dir)
    ids = load_embedding_ids(directory=embeddings_dir)
    dataset.verify_ids(ids)
    train = dataset.indices("train")
    train_embeddings = load_embedding_rows(directory=embeddings_dir, rows=train)  # the split alone: one copy
    groupings = {name: labels[train] for name, labels in dataset.labels.items() if (labels[train] >= 0).any()}
    if clusters_dir is not None:
        cluster_ids, assignments = load_assignments(directory=clusters_dir)
        groupings["clusters"] = align_labels_to_ids(label_ids=cluster_ids, labels=assignments,
                                                    dataset_ids=ids[train])
    views = None
    if model_path is not None and augment_kwargs is not None:
        torch_device = device_for(name=device)
        model = load_trained_model(model_path=model_path, device=torch_device)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        model = model.to(memory_format=memory_format)
        chosen = np.sort(np.random.default_rng(seed).permutation(len(train))[:alignment_samples])

        def encode(views: torch.Tensor) -> torch.Tensor:
            # Autocast around the encoder alone, as training and the export run it: the views are augmented in
            # float32 outside it (under bf16 autocast the blur's convolutions returned bf16 into a float32 batch).
            with autocast_context(precision=precision, device=torch_device):
                return model.embed(views.contiguous(memory_format=memory_format))

        views = embed_two_views(encode=encode, images_uint8=dataset.get_batch(train[chosen]),
                                augment=TwoViewAugment(**augment_kwargs), seed=seed, batch_size=256,
                                device=torch_device)
    diagnosis = diagnose_embeddings(embeddings=train_embeddings, groupings=groupings, views=views,
                                    num_pairs=num_pairs, seed=seed)
    out_dir = Path(out_dir)
    plot = plot_similarity_histograms(diagnosis=diagnosis, path=out_dir / "similarity.png", title=title)
    write_json(out_dir / "metrics.json", diagnosis.metrics)
    return {"metrics": diagnosis.metrics, "plot": str(plot)}
