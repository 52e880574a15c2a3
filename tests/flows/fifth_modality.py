"""A fifth modality that lives only in the tests: what docs/architecture.md says a new modality implements, and
nothing else, registered at run time (``registry.register``) without a line changed outside tests/.

Linear MCL over vectors with a strong attribute (``major``) and a weak one (``minor``): a stage's "encoder" is the
top principal directions of its training vectors, fitted in closed form. Stage 0 centres the vectors once, so its
directions are the major attribute's; a cluster-pure stage centres each pseudo-label group on its own mean, which
removes what the earlier stages' clusters already separate, so its directions find the minor attribute.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from contrastive.data.dataset import SampleIndex
from contrastive.embeddings import save_embeddings
from contrastive.engine.task import LoopSpec, OptimSpec, StageSpec
from contrastive.evaluate import read_stage_embeddings, score_attributes
from contrastive.integrate import concat_normalized
from contrastive.mcl.steps import load_pseudo_labels
from contrastive.modalities import registry
from contrastive.modalities.base import Member, Modality, ResultsTable
from pipeline_config.schema import NOT_IN_KEY, MclConfig, _PipelineBase, _Section


class FifthData(_Section):
    cache_dir: Path = Field(Path("data"), **NOT_IN_KEY)
    num_samples: int = 600
    seed: int = 0


class FifthTrain(_Section):
    dim: int = Field(3, ge=1, description="principal directions a stage keeps (4 class means span 3)")
    batch_size: int = 32  # what a pseudo-label group must hold (the shared clustering steps read it)


class FifthConfig(_PipelineBase):
    pipeline: Literal["fifth"] = "fifth"
    name: str = Field("fifth", **NOT_IN_KEY)
    data: FifthData = FifthData()
    train: FifthTrain = FifthTrain()
    mcl: MclConfig = MclConfig()
    IN_PROCESS_ONLY = "closed-form linear stages"


@dataclass(frozen=True, kw_only=True)
class FifthStageSpec(StageSpec):
    dataset_dir: str
    pseudo_labels_path: str | None
    dim: int


class FifthModality(Modality):
    name = "fifth"
    title = "linear vectors (a test's modality)"
    step_prefix = "fifth-"

    def prepare_data(self, config, *, log) -> dict:
        rng = np.random.default_rng(config.data.seed)
        n = config.data.num_samples
        major, minor = rng.integers(0, 4, n), rng.integers(0, 4, n)
        # The attributes in orthogonal 4-D blocks: the major one's class means 6x further apart.
        x = np.hstack([6 * rng.normal(size=(4, 4))[major], rng.normal(size=(4, 4))[minor]])
        x += 0.1 * rng.normal(size=(n, 8))
        directory = Path(config.data.cache_dir) / "fifth"
        directory.mkdir(parents=True, exist_ok=True)
        np.savez(directory / "data.npz", x=x.astype(np.float32), major=major, minor=minor)
        log(f"{n} vectors in {directory}")
        return {"dir": str(directory), "digest": f"fifth-{config.data.seed}-{n}", "num_train": int(n * 3 // 4)}

    def open_dataset(self, directory: str) -> SampleIndex:
        arrays = np.load(Path(directory) / "data.npz")
        n = len(arrays["x"])
        index = {"ids": np.asarray([f"v{i}" for i in range(n)]),
                 "split": np.where(np.arange(n) < n * 3 // 4, "train", "test"),
                 "label_major": arrays["major"], "label_minor": arrays["minor"]}
        return SampleIndex(path=Path(directory), index=index, manifest={
            "attributes": {"major": list("abcd"), "minor": list("abcd")}, "digest": directory})

    def train_content(self, config, *, stage, seed, data, batches_key, inherit_key) -> dict:
        return {"step": "fifth-train", "train": config.train.content(), "data": data["digest"], "groups": batches_key}

    def train_spec(self, config, *, stage, seed, out_dir, data, batches_path, init_model_path) -> FifthStageSpec:
        # Closed form: no optimizer steps, so the optimizer and loop specs stay at their defaults.
        return FifthStageSpec(stage_dir=out_dir, seed=seed, device="cpu", optim=OptimSpec(),
                              loop=LoopSpec(epochs=1), dataset_dir=data["dir"], pseudo_labels_path=batches_path,
                              dim=config.train.dim)

    def total_steps(self, config, *, stage, data) -> int:
        return 1

    def train(self, spec: FifthStageSpec, *, callbacks: list) -> dict:
        start, dataset = time.monotonic(), self.open_dataset(spec.dataset_dir)
        train = dataset.indices("train")
        x = np.load(Path(spec.dataset_dir) / "data.npz")["x"][train]
        groups = np.zeros(len(x), int) if spec.pseudo_labels_path is None else \
            load_pseudo_labels(path=Path(spec.pseudo_labels_path), ids=dataset.ids[train])
        for group in np.unique(groups):  # each (pseudo-label) group centred on its own mean
            x[groups == group] -= x[groups == group].mean(axis=0)
        _, singular, vt = np.linalg.svd(x, full_matrices=False)
        unexplained = float((singular[spec.dim:] ** 2).sum() / (singular ** 2).sum())
        model_path = Path(spec.stage_dir) / "model" / "model.npy"
        model_path.parent.mkdir(parents=True, exist_ok=True)
        np.save(model_path, vt[:spec.dim].T)
        for callback in callbacks:  # what a loop reports at an epoch's end (MLflow, progress)
            callback.on_epoch_end(epoch=0, metrics={"train/epoch_loss": unexplained})
        seconds = time.monotonic() - start
        summary = {"model_path": str(model_path), "final_loss": unexplained, "seconds": seconds,
                   "trimmed_samples": 0, "samples_per_second": len(x) / max(seconds, 1e-9),
                   "resumed_from_step": None, "batch_plan": {}}
        (Path(spec.stage_dir) / "train_summary.json").write_text(json.dumps(summary))
        return summary

    def export(self, *, dataset_dir: str, model_path: str, out_dir: str, **_) -> dict:
        x, projection = np.load(Path(dataset_dir) / "data.npz")["x"], np.load(model_path)
        manifest = save_embeddings(embeddings=(x @ projection).astype(np.float32),
                                   ids=self.open_dataset(dataset_dir).ids, directory=Path(out_dir))
        return {"dir": out_dir, "num_samples": manifest["num_samples"], "dim": manifest["dim"]}

    def evaluate(self, config, *, members: list[Member], data: dict, out_dir: str) -> dict[str, float]:
        dataset, e = self.open_dataset(data["dir"]), config.eval
        stages = read_stage_embeddings(dataset=dataset, embeddings_dirs=[m.embeddings_dir for m in members])
        return score_attributes(dataset=dataset, features=concat_normalized(stage_embeddings=stages),
                                probe_c=e.probe_c, probe_max_iter=e.probe_max_iter,
                                probe_max_train=e.probe_max_train, knn_k=e.knn_k, seed=config.seed)

    def tables(self, config, summary: dict) -> list[ResultsTable]:
        return [ResultsTable(title=f"{config.name}: linear-probe accuracy", rows=summary["results"], metric="probe"),
                ResultsTable(title="kNN accuracy", rows=summary["results"], metric="knn")]


MODALITY = FifthModality()
registry.register(MODALITY, FifthConfig)
