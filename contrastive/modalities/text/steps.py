"""The steps of one text MCL stage as plain functions over directories (the text counterpart of
``contrastive.modalities.image.steps``): train a fresh SimCSE encoder on the engine (random batches for stage 0, cluster-pure
batches from the pseudo-labels of all earlier stages after it), export its sentence embeddings keyed by sample
id, and evaluate one stage or the concatenation of several (linear probe and kNN per attribute, STS Spearman,
isotropy of the representation). Nothing here knows about Prefect or MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from contrastive.data.dataset import RowsOf
from contrastive.embeddings import ExportBatch, compute_embeddings, export_ranked, rank_share
from contrastive.engine.callbacks import JsonlMetrics, KeyRecorder
from contrastive.engine.checkpoint import save_torch
from contrastive.engine.files import write_json, write_stage_summary
from contrastive.engine.safe_load import load_torch_file
from contrastive.engine.distributed import DistInfo, current_info, device_for
from contrastive.engine.loop import TrainCallback, release_device_memory, train
from contrastive.engine.task import StageSpec
from contrastive.errors import ConfigError, DataError
from contrastive.evaluate import read_stage_embeddings, score_attributes
from contrastive.integrate import concat_normalized
from contrastive.mcl.steps import start_stage
from contrastive.modalities.text.adapter import IsotropyProbe, TextBatchSource, TextContrastiveTask, TokenArrays, encode_tokens
from contrastive.modalities.text.dataset import TextDataset, load_text_dataset, triples_for
from contrastive.modalities.text.encoders import TextEncoderSpec, build_encoder, resolve_hf_path
from contrastive.modalities.text.isotropy import average_random_cosine, norm_stats, partition_isotropy
from contrastive.modalities.text.simcse import SimCSE
from contrastive.modalities.text.tokenizer import HFTokenizer, WordTokenizer

METHODS = ("simcse_unsup", "simcse_sup")


@dataclass(frozen=True, kw_only=True)
class TextStageSpec(StageSpec):
    """One text training stage, built by the text config. encoder: a ``TextEncoderSpec`` as JSON; method:
    {"name": simcse_unsup | simcse_sup, "temperature", "mlp_head"}; isotropy: {"every_steps" (0 = off),
    "num_sentences", "num_frequent"}."""
    dataset_dir: str
    pseudo_labels_path: str | None
    encoder: dict
    method: dict
    batch_size: int
    remainder_policy: str
    isotropy: dict = field(default_factory=lambda: {"every_steps": 0, "num_sentences": 256, "num_frequent": 10})


# ---------------------------------------------------------------------------------------------------- models
def train_text_stage_from_json(*, spec: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun launch (``contrastive.engine.launch``): the spec arrives as JSON."""
    return train_text_stage(TextStageSpec.from_json(spec), info=info)


def tokenizer_for(encoder: TextEncoderSpec, *, vocab: list[str] | None):
    return WordTokenizer(vocab) if encoder.kind == "tiny" else HFTokenizer(resolve_hf_path(encoder.hf_path))


def build_text_method(*, encoder: dict, method: dict, vocab: list[str] | None) -> tuple[SimCSE, object]:
    """(a fresh SimCSE model, its tokenizer); the tiny encoder's initialisation follows torch's RNG."""
    spec = TextEncoderSpec(**encoder)
    if method["name"] not in METHODS:
        raise ConfigError(f"method.name {method['name']!r} is not a text method: use {' or '.join(METHODS)}")
    tokenizer = tokenizer_for(spec, vocab=vocab)
    model = SimCSE(encoder=build_encoder(spec, vocab_size=len(tokenizer)), temperature=method["temperature"],
                   supervised=method["name"] == "simcse_sup", mlp_head=method.get("mlp_head", True))
    return model, tokenizer


def load_text_model(*, model_path: Path | str, device: torch.device) -> tuple[SimCSE, object, TextEncoderSpec]:
    """(model in eval mode, tokenizer, encoder spec) of a trained stage."""
    if not Path(model_path).exists():
        raise DataError(f"trained model {model_path} is missing: rerun the pipeline to retrain this stage")
    saved = load_torch_file(model_path, what="trained model")
    model, tokenizer = build_text_method(encoder=saved["encoder"], method=saved["method"], vocab=saved["vocab"])
    model.load_state_dict(saved["state_dict"])
    return model.to(device).eval(), tokenizer, TextEncoderSpec(**saved["encoder"])


def tokenize(tokenizer, sentences, *, max_length: int) -> TokenArrays:
    ids, mask = tokenizer.encode(list(sentences), max_length=max_length)
    return TokenArrays(ids=ids, mask=mask)


# ---------------------------------------------------------------------------------------------------- training
def train_text_stage(spec: TextStageSpec, *, info: DistInfo | None = None, callbacks: list[TrainCallback] = (),
                     stop_after_steps: int | None = None) -> dict:
    """Train a FRESH SimCSE encoder for one stage (cluster-pure batches when ``spec.pseudo_labels_path``); writes
    ``checkpoints/last.pt`` (resumable), ``model/model.pt``, ``isotropy.json`` (the trajectory) and
    ``train_summary.json`` into ``spec.stage_dir``.

    Under torchrun (DDP) ``spec.batch_size`` is the GLOBAL batch: each of the W ranks holds batch_size / W
    sentences of it (cluster-pure global batches split across the ranks, as for images) and SimCSE's negatives
    are gathered from every rank with their gradient (``contrastive.modalities.text.simcse``), so W ranks compute
    the loss of the one global batch. Without dropout that is the single-process training exactly; with it, rank
    0 keeps the single process's dropout stream and every other rank draws its own. Rank 0 writes the files."""
    info = info or current_info()
    stage_dir, dataset, batch, (train_rows, sampler, groups) = start_stage(spec, info=info,
                                                                           open_dataset=load_text_dataset)
    encoder = TextEncoderSpec(**spec.encoder)
    vocab = dataset.tokenizer().vocab if encoder.kind == "tiny" else None
    model, tokenizer = build_text_method(encoder=spec.encoder, method=spec.method, vocab=vocab)
    if info.rank:  # the same initial weights on every rank, a dropout stream of its own (the same masks on every
        torch.manual_seed(spec.seed + 7919 * info.rank)  # rank would correlate the noise of the global batch)
    length = encoder.max_length
    tokens = tokenize(tokenizer, dataset.sentences[train_rows], max_length=length)
    positives = negatives = None
    if spec.method["name"] == "simcse_sup":
        pos, neg = triples_for(dataset, train_rows)
        positives, negatives = tokenize(tokenizer, pos, max_length=length), tokenize(tokenizer, neg, max_length=length)
    source = TextBatchSource(sampler=sampler, tokens=tokens, ids=RowsOf(dataset.ids, train_rows), groups=groups,
                             positives=positives, negatives=negatives)
    iso = spec.isotropy
    probe = None
    if iso.get("every_steps", 0) > 0:
        probe_rows = np.arange(min(iso.get("num_sentences", 256), len(train_rows)))
        probe_tokens = TokenArrays(ids=tokens.ids[probe_rows], mask=tokens.mask[probe_rows])
        special = tuple(i for i in (getattr(tokenizer, "cls_id", None),
                                    getattr(getattr(tokenizer, "tokenizer", None), "cls_token_id", None),
                                    getattr(getattr(tokenizer, "tokenizer", None), "sep_token_id", None))
                        if i is not None)
        probe = IsotropyProbe(tokens=probe_tokens, every_steps=iso["every_steps"], skip_tokens=special,
                              num_frequent=iso.get("num_frequent", 10), seed=spec.seed)
    task = TextContrastiveTask(method=model, probe=probe)
    recorder = KeyRecorder()
    # Under torchrun the flow reads the metrics from this file once the launch ends.
    extra = [JsonlMetrics(stage_dir / "train_metrics.jsonl")] if info.is_distributed else []
    result = train(task=task, source=source, optim=spec.optim, loop=spec.loop,
                   device=device_for(name=spec.device, info=info), checkpoint_path=stage_dir / "checkpoints" / "last.pt",
                   info=info, callbacks=[*callbacks, *extra, *([recorder] if spec.record_keys else [])],
                   stop_after_steps=stop_after_steps)
    if probe is not None and (not task.isotropy_history or task.isotropy_history[-1][0] != task.step):
        task.measure_now()  # the end point, whatever the log cadence
    if spec.record_keys:
        write_json(stage_dir / f"keys_rank{info.rank}.json", {
            "batches": recorder.batches, "losses": [h["train/loss"] for h in result.history]})
    model_path = stage_dir / "model" / "model.pt"
    history = [{"step": step, **values} for step, values in task.isotropy_history]
    summary = {**result.summary(), "world_size": info.world_size, "per_rank_batch": batch,
               "global_batch": spec.batch_size, "batch_plan": sampler.stats, "cluster_pure_batches": groups is not None,
               "model_path": str(model_path), "isotropy_path": str(stage_dir / "isotropy.json"),
               "isotropy_start": history[0] if history else None, "isotropy_end": history[-1] if history else None}
    if info.is_main:
        save_torch({"state_dict": model.state_dict(), "encoder": spec.encoder, "method": spec.method,
                    "vocab": vocab}, model_path, what="the stage's final model")
        write_json(stage_dir / "isotropy.json", {"history": history})
        write_stage_summary(stage_dir / "train_summary.json", summary)
    torch_device = next(model.parameters()).device
    del task, model, source
    release_device_memory(torch_device)
    return summary


# ---------------------------------------------------------------------------------------------------- export
def embed_sentences(*, model: SimCSE, tokenizer, sentences, max_length: int, device: torch.device,
                    batch_size: int = 256) -> np.ndarray:
    """(N, D) float32 pooled embeddings of ``sentences`` (eval mode, no MLP head)."""
    tokens = tokenize(tokenizer, sentences, max_length=max_length)
    return encode_tokens(model.encoder, tokens, device=device, batch_size=batch_size)[1]


def export_text_embeddings(*, dataset_dir: Path | str, model_path: Path | str, out_dir: Path | str,
                           batch_size: int, device: str, precision: str = "fp32",
                           info: DistInfo | None = None) -> dict:
    """Embed every sentence (train and test) with the stage's encoder: float16 shards + ids in ``out_dir``.

    The shared export loop (``contrastive.embeddings``): sentences are tokenized batch by batch (each batch cut
    to its longest sentence) and pooled without SimCSE's head, as :func:`embed_sentences` does. Under torchrun
    each rank embeds a contiguous share of the sentences and rank 0 writes the manifest in rank order (the same
    ids order as one process). ``precision``: the stage's (``train.precision``: bf16 / fp16 autocast on the
    encoder); it is part of the train key, which the export key holds."""
    info = info or current_info()
    dataset = load_text_dataset(dataset_dir)
    torch_device = device_for(name=device, info=info)
    model, tokenizer, encoder = load_text_model(model_path=model_path, device=torch_device)
    mine = rank_share(len(dataset), info=info)

    def batches():
        for start in range(0, len(mine), batch_size):
            rows = mine[start:start + batch_size]
            tokens = tokenize(tokenizer, dataset.sentences[rows], max_length=encoder.max_length)
            yield ExportBatch(ids=dataset.ids[rows], inputs=tokens.rows(np.arange(len(rows))))

    def embed(writer) -> dict[str, int]:
        compute_embeddings(encode=model.encoder, batches=batches(), device=torch_device, writer=writer,
                           precision=precision)
        return {}

    return export_ranked(out_dir=Path(out_dir), info=info, embed=embed)


def export_text_from_json(*, export: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun export (``contrastive.engine.launch``)."""
    return export_text_embeddings(**export, info=info)


# ---------------------------------------------------------------------------------------------------- evaluation
def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (scipy), nan when either side is constant."""
    from scipy.stats import spearmanr

    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def sts_spearman(*, pairs, encode) -> float:
    """Spearman between cos(e(s1), e(s2)) and the gold scores; ``encode(list of sentences) -> (N, D)``."""
    unique = sorted({s for p in pairs for s in (p.sentence1, p.sentence2)})
    where = {s: i for i, s in enumerate(unique)}
    emb = encode(unique)
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    cos = np.array([emb[where[p.sentence1]] @ emb[where[p.sentence2]] for p in pairs])
    return spearman(cos, np.array([p.score for p in pairs]))


def concat_encoder(*, model_paths: list[str], device: torch.device, batch_size: int = 256):
    """encode(sentences) -> the concatenation of every stage's L2-normalised embeddings (MCL's representation)."""
    loaded = [load_text_model(model_path=p, device=device) for p in model_paths]

    def encode(sentences):
        return concat_normalized(stage_embeddings=[
            embed_sentences(model=m, tokenizer=t, sentences=sentences, max_length=e.max_length, device=device,
                            batch_size=batch_size) for m, t, e in loaded])
    return encode


def evaluate_text_embeddings(*, dataset_dir: Path | str, embeddings_dirs: list[Path | str], model_paths: list[str],
                             probe_c: float, probe_max_iter: int, probe_max_train: int, knn_k: int, seed: int,
                             device: str = "auto") -> dict[str, float]:
    """One stage (one dir) or the concatenation of several stages: probe/<attr>, knn/<attr> (labelled data),
    sts/spearman (when the dataset has STS pairs) and the representation's isotropy (iso/...)."""
    dataset: TextDataset = load_text_dataset(dataset_dir)
    stage_embeddings = read_stage_embeddings(dataset=dataset, embeddings_dirs=embeddings_dirs)
    metrics = score_attributes(dataset=dataset, features=concat_normalized(stage_embeddings=stage_embeddings),
                               probe_c=probe_c, probe_max_iter=probe_max_iter, probe_max_train=probe_max_train,
                               knn_k=knn_k, seed=seed)
    if dataset.file("sts") is not None:
        from contrastive.modalities.text.readers import read_sts_pairs
        encode = concat_encoder(model_paths=model_paths, device=device_for(name=device))
        metrics["sts/spearman"] = sts_spearman(pairs=read_sts_pairs(dataset.file("sts")), encode=encode)
    raw = np.concatenate(stage_embeddings, axis=1)
    metrics["iso/sentence_anisotropy"] = average_random_cosine(raw, seed=seed)
    metrics["iso/sentence_isotropy_I"] = partition_isotropy(raw)
    metrics["iso/sentence_mean_norm"] = norm_stats(raw)["mean_norm"]
    return metrics
