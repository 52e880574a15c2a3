"""Hyper-CL as the text pipeline's optional final step: conditioned projections of the pipeline's final
representation (the MCL concatenation of every stage), trained on C-STS-style pairs and evaluated against the
unconditioned representation and against a plain linear projection per condition.

    sentence embeddings  s = concat_j normalize(f_j(x))            (precomputed once, frozen encoders)
    condition embeddings c = the condition text through the same encoders ("encoder"), or one-hot per named
                             condition ("onehot": a learned embedding per condition)
    conditioned          s_c = W1(c) W2(c)^T s                      (contrastive.modalities.text.hyper)

Metrics (held-out pairs): C-STS Spearman and pair accuracy (the pair more similar under its high condition) for
Hyper-CL, the linear-per-condition baseline and the unconditioned cosine; retrieval recall@k per attribute on the
test sentences (generated data: the condition text of each attribute, relevance = same attribute value); and the
cost of a query under a new condition over cached embeddings (one small matrix product) against re-encoding the
sentences with the condition prepended, measured side by side in the same run (a ratio, not a timing).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from contrastive.engine.checkpoint import save_torch
from contrastive.engine.files import write_json
from contrastive.engine.distributed import device_for
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.errors import ConfigError, DataError
from contrastive.modalities.text.dataset import load_text_dataset
from contrastive.modalities.text.generator import CONDITIONS
from contrastive.modalities.text.hyper import (HyperSpec, conditioned_spearman, pair_accuracy, project, quadruples_from_pairs,
                                    recall_at_k, timed, train_hyper)
from contrastive.modalities.text.readers import read_csts_pairs
from contrastive.modalities.text.steps import concat_encoder


def run_hyper_cl(*, dataset_dir: Path | str, model_paths: list[str], out_dir: Path | str, spec: HyperSpec,
                 conditions: str, test_fraction: float, score_range: tuple[float, float], optim: OptimSpec,
                 loop: LoopSpec, recall_k: int, device: str = "auto", callbacks=()) -> dict[str, float]:
    """Train Hyper-CL and the linear baseline on the training pairs, score all three on the held-out pairs;
    writes ``metrics.json`` and ``hyper.pt`` into ``out_dir``. Returns the metrics (module docstring)."""
    out_dir = Path(out_dir)
    dataset = load_text_dataset(dataset_dir)
    path = dataset.file("csts")
    if path is None:
        raise DataError("hyper.enabled needs C-STS pairs (sentence1, sentence2, condition, score): set "
                        "data.files.csts, or use data.kind generator, which writes them")
    pairs = read_csts_pairs(path)
    torch_device = device_for(name=device)
    encode = concat_encoder(model_paths=model_paths, device=torch_device)
    sentences = sorted({s for p in pairs for s in (p.sentence1, p.sentence2)})
    embedded = dict(zip(sentences, encode(sentences)))
    names = sorted({p.condition for p in pairs})
    onehot = {n: row for n, row in zip(names, np.eye(len(names), dtype=np.float32))}
    vectors = dict(zip(names, encode(names))) if conditions == "encoder" else onehot
    distinct = {np.round(v, 5).tobytes() for v in vectors.values()}
    if len(distinct) < len(names):
        raise ConfigError(f"the encoder embeds some of the conditions {names} identically (words its vocabulary "
                          "does not know become [UNK]): set hyper.conditions=onehot (a learned embedding per "
                          "condition), or use a pretrained encoder (model.encoder=hf)")
    data, _ = quadruples_from_pairs(pairs, embed=embedded, condition_vectors=vectors, score_range=score_range)
    baseline_data, _ = quadruples_from_pairs(pairs, embed=embedded, condition_vectors=onehot, score_range=score_range)
    order = np.random.default_rng(spec.seed).permutation(len(data))
    cut = max(1, int(round(len(data) * (1 - test_fraction))))
    train_rows, test_rows = order[:cut], order[cut:] if cut < len(data) else order[:0]
    if len(test_rows) == 0:
        raise DataError(f"{len(data)} C-STS quadruples leave none held out at hyper.test_fraction={test_fraction}: "
                        "raise it or give more pairs")
    model, summary = train_hyper(data=data.subset(train_rows), spec=spec, optim=optim, loop=loop,
                                 checkpoint_path=out_dir / "checkpoints" / "hyper.pt", device=torch_device,
                                 callbacks=callbacks)
    linear, linear_summary = train_hyper(data=baseline_data.subset(train_rows),
                                         spec=HyperSpec(**{**asdict(spec), "hidden": None}), optim=optim, loop=loop,
                                         checkpoint_path=out_dir / "checkpoints" / "linear.pt", device=torch_device)
    test, test_onehot = data.subset(test_rows), baseline_data.subset(test_rows)
    metrics = {"csts/hyper_spearman": conditioned_spearman(model, test),
               "csts/linear_spearman": conditioned_spearman(linear, test_onehot),
               "csts/unconditioned_spearman": conditioned_spearman(None, test),
               "csts/hyper_pair_accuracy": pair_accuracy(model, test),
               "csts/linear_pair_accuracy": pair_accuracy(linear, test_onehot),
               "csts/train_quadruples": float(len(train_rows)), "csts/test_quadruples": float(len(test_rows)),
               "csts/hyper_final_loss": summary["final_loss"], "csts/linear_final_loss": linear_summary["final_loss"]}
    test_sentences = list(dataset.sentences[dataset.indices("test")])
    if test_sentences:
        cached = encode(test_sentences)
        labels = {a: dataset.labels[a][dataset.indices("test")] for a in dataset.attributes}
        for attribute, y in labels.items():
            condition = CONDITIONS.get(attribute)
            if condition not in vectors:
                continue
            metrics[f"recall/{attribute}_unconditioned"] = recall_at_k(cached, y, k=recall_k)
            metrics[f"recall/{attribute}_hyper"] = recall_at_k(project(model, cached, vectors[condition]), y,
                                                               k=recall_k)
            metrics[f"recall/{attribute}_linear"] = recall_at_k(project(linear, cached, onehot[condition]), y,
                                                                k=recall_k)
        condition = names[0]
        projecting = timed(lambda: project(model, cached, vectors[condition]))
        reencoding = timed(lambda: encode([f"{condition} : {s}" for s in test_sentences]), repeat=1)
        metrics["csts/reencode_over_project_time"] = reencoding / max(projecting, 1e-9)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_torch({"hyper": model.state_dict(), "linear": linear.state_dict(), "spec": asdict(spec),
                "conditions": conditions, "condition_names": names}, out_dir / "hyper.pt", what="the Hyper-CL model")
    write_json(out_dir / "metrics.json", metrics)
    return metrics
