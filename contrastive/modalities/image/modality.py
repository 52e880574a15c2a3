"""The image modality (``pipeline: image``): SimCLR-family methods on images (Trifeature, image folders, shards, the
paper datasets), probed per attribute, with embedding diagnostics per stage and a HEX-free control for HEX configs.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from contrastive.modalities.base import Launch, Member, Modality, ResultsTable, ServingInput


class ImageModality(Modality):
    name = "image"
    title = "images"
    launch = Launch(train_entry="contrastive.modalities.image.steps:train_stage_from_json",
                    export_entry="contrastive.modalities.image.steps:export_stage_from_json")
    diagnoses = True
    serving = ServingInput(dtype="uint8", shape=(-1, -1, -1, -1), description="uint8 images (n, H, W, C) or (n, C, H, W)",
                           requirements=("torch", "torchvision", "numpy", "webdataset"))

    # ------------------------------------------------------------------------------------------ checks and data
    def preflight(self, config) -> None:
        from contrastive.modalities.image.config import preflight
        preflight(config)

    def prepare_data(self, config, *, log: Callable[[str], None]) -> dict:
        """Generate (or find) the dataset and check the config against its size before any training."""
        from contrastive.data.loading import load_dataset
        from contrastive.modalities.image.config import check_feasible
        path = prepare_image_data(config.data)
        dataset = load_dataset(path)
        num_train = len(dataset.indices("train"))
        check_feasible(config, num_train=num_train)
        data = config.data
        skip = {"image_folder": data.image_folder.max_skip_fraction,
                "shards": data.shards.max_skip_fraction}.get(data.kind, 0.0)
        log(f"image data in {path}: {num_train} training images, attributes {sorted(dataset.labels)}")
        return {"dir": str(path), "digest": dataset.digest, "num_train": num_train,
                "num_test": len(dataset.indices("test")), "attributes": list(dataset.labels),
                "storage": dataset.manifest.get("storage", "memory"), "max_skip_fraction": skip}

    # ------------------------------------------------------------------------------------------ training
    def train_content(self, config, *, stage: int, seed: int, data: dict, batches_key: str | None,
                      inherit_key: str | None) -> dict:
        content = {"step": "train", "model": config.model.content(), "method": config.method.in_use(),
                   "augment": config.augment.content(), "train": config.train_key_content(),
                   "seed": seed, "data": data["digest"], "pseudo_labels": batches_key,
                   "remainder_policy": config.mcl.remainder_policy if batches_key else None,
                   "processes": config.distributed.world_size()}
        if inherit_key is not None:  # mcl.inherit: the weights it starts from; absent otherwise (keys unchanged)
            content["inherit_from"] = inherit_key
        return content

    def inherits(self, config) -> bool:
        return config.mcl.inherit

    def cumulative_concat(self, config) -> bool:
        return config.mcl.cumulative_concat

    def train_spec(self, config, *, stage: int, seed: int, out_dir: str, data: dict, batches_path: str | None,
                   init_model_path: str | None):
        from contrastive.modalities.image.steps import ImageStageSpec
        return ImageStageSpec(
            **self.stage_fields(config, seed=seed, out_dir=out_dir, data=data, batches_path=batches_path),
            model=config.model.model_dump(mode="json"), method=config.method.model_dump(mode="json"),
            augment=config.augment.model_dump(), workers=config.train.workers, init_model_path=init_model_path,
            resample_on_gpu=config.train.resample_on_gpu)

    def train(self, spec, *, callbacks: list) -> dict:
        from contrastive.modalities.image.steps import train_stage
        return train_stage(spec, callbacks=callbacks)

    def train_metrics(self, summary: dict) -> dict[str, float]:
        return {"train/views_per_second": summary["views_per_second"]}

    # ------------------------------------------------------------------------------------------ export
    def export_kwargs(self, config, *, model_path: str, data: dict, out_dir: str) -> dict:
        """Under the stage's precision (part of the train key, so of this export's key) and memory format."""
        return {**super().export_kwargs(config, model_path=model_path, data=data, out_dir=out_dir),
                "workers": config.train.workers, "precision": config.train.precision,
                "channels_last": config.train.channels_last, "resample_on_gpu": config.train.resample_on_gpu}

    export_reports_progress = True

    def export(self, **kwargs) -> dict:
        from contrastive.modalities.image.steps import export_stage_embeddings
        return export_stage_embeddings(**kwargs)

    def export_metrics(self, result: dict) -> dict[str, float]:
        return {"unreadable": result["unreadable"]}

    # ------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, config, *, members: list[Member], data: dict, out_dir: str) -> dict[str, float]:
        """Linear probe + kNN per attribute of one stage or of the concatenation of several."""
        from contrastive.modalities.image.steps import evaluate_embeddings
        e = config.eval
        return evaluate_embeddings(dataset_dir=data["dir"], embeddings_dirs=[m.embeddings_dir for m in members],
                                   probe_c=e.probe_c, probe_max_iter=e.probe_max_iter,
                                   probe_max_train=e.probe_max_train, knn_k=e.knn_k, seed=config.seed)

    def diagnose_content(self, config, *, stage: int, export_key: str, clusters_key: str | None) -> list:
        return ["diagnose", export_key, clusters_key, config.for_stage(stage).augment.content(), config.seed]

    def diagnose(self, config, *, stage: int, model_path: str, embeddings_dir: str, clusters_dir: str | None,
                 data: dict, out_dir: str, title: str) -> dict:
        from contrastive.modalities.image.diagnostics import diagnose_stage
        stage_config = config.for_stage(stage)
        return diagnose_stage(dataset_dir=data["dir"], embeddings_dir=embeddings_dir, out_dir=Path(out_dir),
                              clusters_dir=clusters_dir, model_path=model_path,
                              augment_kwargs=stage_config.augment.model_dump(), device=config.device,
                              seed=config.seed, title=title, precision=stage_config.train.precision,
                              channels_last=stage_config.train.channels_last)

    # ------------------------------------------------------------------------------------------ the control run
    def control_config(self, config):
        """A HEX pipeline's control is the same method without HEX (it retrains stage 0 too); otherwise the same
        config, whose stage 0 is MCL's own."""
        mcl = config.mcl
        hex_on = config.method.hex.enabled
        if not mcl.control or (mcl.num_stages == 1 and not hex_on):
            return None
        return without_hex(config) if hex_on else config

    def control_label(self, config) -> str:
        return "control (no HEX)" if config.method.hex.enabled else "control"

    # ------------------------------------------------------------------------------------------ reporting
    def tables(self, config, summary: dict) -> list[ResultsTable]:
        results = summary["results"]
        return [ResultsTable(title=f"{config.name}: linear-probe accuracy (held-out split)", rows=results,
                             metric="probe"),
                ResultsTable(title="kNN accuracy", rows=results, metric="knn")]

    def plots(self, config, *, results: dict[str, dict], out: Path) -> list[Path]:
        from contrastive.evaluate import plot_attribute_accuracy
        return [plot_attribute_accuracy(results=results, path=out / "probe_accuracy.png"),
                plot_attribute_accuracy(results=results, path=out / "knn_accuracy.png", metric="knn",
                                        title="kNN accuracy per attribute")]

    # ------------------------------------------------------------------------------------------ serving
    def load_encoder(self, model_path: str):
        from contrastive.modalities.image.serving import load_encoder
        return load_encoder(model_path)

    def embed(self, encoder, inputs):
        from contrastive.modalities.image.serving import embed
        return embed(encoder, inputs)


def prepare_image_data(data) -> Path:
    """Write (or find) the dataset of ``data`` (the config's data section) in the cache; returns its directory."""
    from contrastive.modalities.image import dataset_config
    if data.kind == "trifeature" and data.trifeature.hierarchy is not None:  # families for HEX (docs/hex.md)
        from contrastive.modalities.image.datasets.hierarchical import prepare_hierarchical
        t = data.trifeature
        return prepare_hierarchical(root=data.cache_dir, num_train=t.num_train, num_test=t.num_test,
                                    spec=t.hierarchy, image_size=t.image_size, seed=t.seed)
    if data.kind == "trifeature":
        from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
        t = data.trifeature
        return prepare_trifeature(root=data.cache_dir, num_train=t.num_train, num_test=t.num_test,
                                  image_size=t.image_size, num_colors=t.num_colors, num_shapes=t.num_shapes,
                                  num_textures=t.num_textures, seed=t.seed)
    if data.kind == "shards":
        from contrastive.data.shards import prepare_shards
        s = data.shards
        return prepare_shards(train_urls=s.train_urls, test_urls=s.test_urls, root=data.cache_dir,
                              image_size=s.image_size, label_fields=s.label_fields,
                              max_skip_fraction=s.max_skip_fraction)
    if data.kind in dataset_config.KINDS:  # CIFAR-MNIST, CelebA, STL-10, ImageNet, balanced Trifeature
        return dataset_config.prepare(data.kind, getattr(data, data.kind), cache_dir=data.cache_dir)
    from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
    f = data.image_folder
    return prepare_image_folder(source=f.source, root=data.cache_dir, image_size=f.image_size,
                                labels_csv=f.labels_csv, test_fraction=f.test_fraction, seed=f.seed,
                                storage=f.storage, split_from_folders=f.split_from_folders,
                                max_skip_fraction=f.max_skip_fraction, decode_scale=f.decode_scale)


def without_hex(config):
    """A HEX pipeline's control: the same method and everything else, with method.hex.enabled = False."""
    control = config.model_copy(deep=True)
    control.method.hex = dataclasses.replace(control.method.hex, enabled=False)
    for patch in control.stage_overrides.values():
        if isinstance(patch.get("method"), dict) and isinstance(patch["method"].get("hex"), dict):
            patch["method"]["hex"]["enabled"] = False
    return control


MODALITY = ImageModality()
