"""The text modality (``pipeline: text``): SimCSE stages on sentences (generated or the user's files), probed per
attribute, scored on STS and for isotropy, with Hyper-CL's conditioned projections on the final representation.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from contrastive.modalities.base import Launch, Member, Modality, ResultsTable, ServingInput

PROJECTIONS = {"hyper": "Hyper-CL", "linear": "linear per condition", "unconditioned": "unconditioned"}


class TextModality(Modality):
    name = "text"
    title = "sentences"
    step_prefix = "text-"
    final_name = "hyper"
    export_batch_size = 256
    launch = Launch(train_entry="contrastive.modalities.text.steps:train_text_stage_from_json",
                    export_entry="contrastive.modalities.text.steps:export_text_from_json")
    serving = ServingInput(dtype="str", shape=(-1,), description="sentences (a list of strings)",
                           requirements=("torch", "numpy", "scikit-learn"))

    # ------------------------------------------------------------------------------------------ checks and data
    def preflight(self, config) -> None:
        from contrastive.modalities.text.config import preflight_text
        preflight_text(config)

    def prepare_data(self, config, *, log: Callable[[str], None]) -> dict:
        """Generate (or find) the sentences, or read the user's files (errors name file and line); check the
        capacity rule against the number of training sentences before any training."""
        from contrastive.modalities.text.config import check_text_feasible
        from contrastive.modalities.text.dataset import (GeneratorParams, load_text_dataset, prepare_generated_text,
                                                         prepare_text_files)
        d = config.data
        if d.kind == "generator":
            g = d.generator
            path = prepare_generated_text(root=d.cache_dir, params=GeneratorParams(
                num_train=g.num_train, num_test=g.num_test, num_sts_pairs=g.num_sts_pairs,
                num_csts_pairs=g.num_csts_pairs, vocab_min_count=d.vocab_min_count, seed=g.seed))
        else:
            f = d.files
            path = prepare_text_files(root=d.cache_dir, sentences_path=f.sentences, sts_path=f.sts,
                                      csts_path=f.csts, nli_path=f.nli, test_fraction=f.test_fraction,
                                      vocab_min_count=d.vocab_min_count, seed=config.seed)
        dataset = load_text_dataset(path)
        num_train = len(dataset.indices("train"))
        check_text_feasible(config, num_train=num_train)
        log(f"text data in {path}: {num_train} training sentences, attributes {dataset.attributes}, evaluation "
            f"files {sorted(dataset.manifest.get('files', {}))}")
        return {"dir": str(path), "digest": dataset.digest, "num_train": num_train,
                "num_test": len(dataset.indices("test")), "attributes": dataset.attributes,
                "files": dataset.manifest.get("files", {})}

    def open_dataset(self, directory: str):
        from contrastive.modalities.text.dataset import load_text_dataset
        return load_text_dataset(directory)

    # ------------------------------------------------------------------------------------------ training
    def train_content(self, config, *, stage: int, seed: int, data: dict, batches_key: str | None,
                      inherit_key: str | None) -> dict:
        """What a stage's weights depend on: encoder, method, training, isotropy probe, seed, data, batches, and the
        number of processes when it is not 1 (each rank draws its own dropout masks; absent for one process, so
        the keys of single-process stages are what they were)."""
        content = {"step": "text-train", "model": config.model.content(), "method": config.method.content(),
                   "train": config.train_key_content(), "isotropy": config.isotropy.content(), "seed": seed,
                   "data": data["digest"], "pseudo_labels": batches_key,
                   "remainder_policy": config.mcl.remainder_policy if batches_key else None}
        if config.distributed.world_size() != 1:
            content["processes"] = config.distributed.world_size()
        return content

    def train_spec(self, config, *, stage: int, seed: int, out_dir: str, data: dict, batches_path: str | None,
                   init_model_path: str | None):
        from contrastive.modalities.text.steps import TextStageSpec
        return TextStageSpec(
            **self.stage_fields(config, seed=seed, out_dir=out_dir, data=data, batches_path=batches_path),
            encoder=config.encoder_spec().to_json(), method=config.method.model_dump(mode="json"),
            isotropy=config.isotropy.model_dump(mode="json"))

    def train(self, spec, *, callbacks: list) -> dict:
        from contrastive.modalities.text.steps import train_text_stage
        return train_text_stage(spec, callbacks=callbacks)

    def train_artifacts(self, config, *, stage: int, out_dir: str) -> list[Path]:
        """The isotropy trajectory logged while training, and its plot."""
        from contrastive.modalities.text.isotropy import plot_isotropy_history
        history_path = Path(out_dir) / "isotropy.json"
        history = json.loads(history_path.read_text())["history"] if history_path.exists() else []
        if not history:
            return []
        plot = plot_isotropy_history(history=history, path=Path(out_dir) / "isotropy.png",
                                     title=f"{config.name} stage {stage}: isotropy over training")
        return [plot, history_path]

    # ------------------------------------------------------------------------------------------ export
    def export_kwargs(self, config, *, model_path: str, data: dict, out_dir: str) -> dict:
        """Under the stage's precision: part of the train key, so of this export's key."""
        return {**super().export_kwargs(config, model_path=model_path, data=data, out_dir=out_dir),
                "precision": config.train.precision}

    def export(self, **kwargs) -> dict:
        from contrastive.modalities.text.steps import export_text_embeddings
        return export_text_embeddings(**kwargs)

    # ------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, config, *, members: list[Member], data: dict, out_dir: str) -> dict[str, float]:
        """Probe + kNN per attribute, STS Spearman and isotropy of one stage or the concatenation of several."""
        from contrastive.modalities.text.steps import evaluate_text_embeddings
        e = config.eval
        return evaluate_text_embeddings(
            dataset_dir=data["dir"], embeddings_dirs=[m.embeddings_dir for m in members],
            model_paths=[m.model_path for m in members], probe_c=e.probe_c, probe_max_iter=e.probe_max_iter,
            probe_max_train=e.probe_max_train, knn_k=e.knn_k, seed=config.seed, device=config.device)

    def has_final_step(self, config) -> bool:
        return config.hyper.enabled

    def final_content(self, config, *, train_keys: list[str]) -> list:
        return ["text-hyper", train_keys, config.hyper.content(), config.model.encoder, config.seed]

    def final_metrics(self, config, *, model_paths: list[str], data: dict, out_dir: str) -> dict:
        """Hyper-CL over the MCL concatenation: C-STS Spearman, pair accuracy and recall@k per attribute against
        the unconditioned representation and a linear projection per condition."""
        from contrastive.engine.task import LoopSpec, OptimSpec
        from contrastive.modalities.text.conditioned import run_hyper_cl
        from contrastive.modalities.text.hyper import HyperSpec
        h = config.hyper
        spec = HyperSpec(rank=h.rank, hidden=h.hidden, temperature=h.temperature, mse_weight=h.mse_weight,
                         batch_size=h.batch_size, seed=config.seed)
        metrics = run_hyper_cl(dataset_dir=data["dir"], model_paths=model_paths, out_dir=out_dir, spec=spec,
                               conditions=h.condition_source(config.model.encoder), test_fraction=h.test_fraction,
                               score_range=(h.score_min, h.score_max), optim=OptimSpec(name="adam", lr=h.lr),
                               loop=LoopSpec(epochs=h.epochs, log_every_steps=10), recall_k=h.recall_k,
                               device=config.device)
        return {"metrics": metrics, "artifacts": [Path(out_dir) / "hyper.pt"]}

    # ------------------------------------------------------------------------------------------ reporting
    def tables(self, config, summary: dict) -> list[ResultsTable]:
        """Probe and kNN accuracy per attribute and STS Spearman per representation, then, with hyper.enabled,
        Hyper-CL's scores (the summary's ``final`` entry, kept out of ``results`` so seed aggregation sees
        representations only)."""
        results = summary["results"]
        tables = [ResultsTable(title=f"{config.name}: linear-probe accuracy (held-out sentences)", rows=results,
                               metric="probe"),
                  ResultsTable(title="kNN accuracy", rows=results, metric="knn"),
                  ResultsTable(title="STS Spearman (cosine vs gold)", rows=results, metric="sts")]
        hyper = summary.get("final")
        if hyper:
            csts = {label: {"csts/Spearman": hyper.get(f"csts/{name}_spearman", float("nan")),
                            "csts/pair accuracy": hyper.get(f"csts/{name}_pair_accuracy", float("nan"))}
                    for name, label in PROJECTIONS.items()}
            tables.append(ResultsTable(
                title=f"C-STS, {int(hyper.get('csts/test_quadruples', 0))} held-out pairs (MCL concat)",
                rows=csts, metric="csts"))
            recall = {label: {f"recall/{k.split('/')[1].rsplit('_', 1)[0]}": v for k, v in hyper.items()
                              if k.startswith("recall/") and k.endswith(f"_{name}")}
                      for name, label in PROJECTIONS.items()}
            tables.append(ResultsTable(title=f"conditioned retrieval recall@{config.hyper.recall_k}", rows=recall,
                                       metric="recall"))
        return tables

    # ------------------------------------------------------------------------------------------ serving
    def load_encoder(self, model_path: str):
        """(SimCSE model, tokenizer, encoder spec) of one stage on the CPU."""
        import torch

        from contrastive.modalities.text.steps import load_text_model
        return load_text_model(model_path=model_path, device=torch.device("cpu"))

    def embed(self, encoder, inputs) -> np.ndarray:
        """float32 (n, D) pooled embeddings of n sentences (a list, an array or a one-column frame of strings)."""
        import torch

        from contrastive.modalities.text.steps import embed_sentences
        model, tokenizer, spec = encoder
        sentences = inputs.iloc[:, 0].tolist() if hasattr(inputs, "iloc") else [str(x) for x in np.ravel(inputs)]
        return embed_sentences(model=model, tokenizer=tokenizer, sentences=sentences, max_length=spec.max_length,
                               device=torch.device("cpu"))


MODALITY = TextModality()
