"""The steps of one CLIP MCL stage as plain functions over directories (the CLIP twin of ``contrastive.modalities.image.steps``).

stage j: train (from the shared init; random batches for j = 0, cluster-pure batches from the group re-shard for
j >= 1) -> export image embeddings of every training sample keyed by ``__key__`` -> k-means -> pseudo-labels for
stage j+1 = combine(y_0, ..., y_j) -> re-shard the training shards by those groups -> stage j+1 ...
Evaluation encodes the MMVP pairs and a held-out retrieval set once per model and scores any stage, any
concatenation of stages and the soup from those saved features.

Each step reads what earlier steps wrote (paths), writes its own directory and returns a small JSON-able record.
Nothing here knows about Prefect or MLflow; under torchrun, :mod:`contrastive.engine.launch` calls
:func:`train_stage` in every process.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from contrastive.engine.checkpoint import save_torch
from contrastive.engine.files import write_json, write_stage_summary
from contrastive.data.loading import resolve_workers
from contrastive.modalities.image_text.data import (ClipBatch, SampleDecodePool, SampleDecoder, concat_batches,
                                                    count_samples, iter_decoded, ready_for_step, stream_batches,
                                                    write_tiny_shards)
from contrastive.data.skips import SkipCounter
from contrastive.engine.distributed import DistInfo, current_info, device_for, per_rank_batch
from contrastive.modalities.image_text.evaluate import (average_state_dicts, concat_stage_features, encode_images, encode_texts,
                                       retrieval_recall)
from contrastive.modalities.image_text.grouped import (MANIFEST, GroupedBatchReader, NpzColumn, manifest_slots,
                                                       reshard_by_group)
from contrastive.engine.precision import check_precision
from contrastive.modalities.image_text.model import (ClipSpec, create_clip, load_stage_model, load_stage_states,
                                    save_stage_model)
from contrastive.modalities.image_text.mmvp import mmvp_scores, pair_images, pair_similarities, pair_statements, read_mmvp
from contrastive.modalities.image_text.mmvp import write_tiny_mmvp
from contrastive.modalities.image_text.adapter import ClipTask
from contrastive.engine.callbacks import JsonlMetrics, KeyRecorder
from contrastive.engine.loop import TrainCallback, release_device_memory, train
from contrastive.engine.task import StageSpec
from contrastive.embeddings import ExportBatch, compute_embeddings, export_ranked, rank_share
from contrastive.errors import ConfigError, DataError

log = logging.getLogger(__name__)

EVAL_FEATURES = "eval_features.npz"


class ClipBatchSource:
    """The engine's view of a CLIP stage's batches: ``batches(epoch, start)`` and the planned length."""

    def __init__(self, batches: Callable, steps_per_epoch: int):
        self._batches = batches
        self.steps_per_epoch = steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def batches(self, *, epoch: int, start: int):
        return self._batches(epoch, start)


# ---------------------------------------------------------------------------------------------------- data
def prepare_synthetic_data(*, root: Path, num_train: int, num_heldout: int, samples_per_shard: int, image_size: int,
                           num_colors: int, num_shapes: int, num_textures: int, corrupt: bool,
                           mmvp_pairs_per_category: int, seed: int) -> dict:
    """Tiny image-text shards (train, held-out) and a tiny MMVP directory under ``root``, written once."""
    root = Path(root)
    common = {"image_size": image_size, "num_colors": num_colors, "num_shapes": num_shapes,
              "num_textures": num_textures}
    train = write_tiny_shards(directory=root / "train", num_samples=num_train, samples_per_shard=samples_per_shard,
                              seed=seed, corrupt=corrupt, **common)
    heldout = write_tiny_shards(directory=root / "heldout", num_samples=num_heldout,
                                samples_per_shard=max(num_heldout, 1), seed=seed + 1, corrupt=False,
                                key_prefix="h", **common)
    mmvp = write_tiny_mmvp(directory=root / "mmvp", pairs_per_category=mmvp_pairs_per_category, seed=seed, **common)
    return {"train_urls": train["urls"], "heldout_urls": heldout["urls"], "mmvp_dir": mmvp["dir"],
            "corrupt_keys": train["corrupt_keys"]}


# ---------------------------------------------------------------------------------------------------- training
@dataclass(frozen=True, kw_only=True)
class ClipStageSpec(StageSpec):
    """One CLIP fine-tuning stage, built by the config schema (JSON-able for torchrun).

    clip: the model spec (``ClipSpec.to_dict``); urls: the training shards; grouped_dir: the group-sorted re-shard of
    a cluster-pure stage (None: random batches, stage 0); global_batch_size: over all ranks. data_slots: how many
    slots the data is laid out in (None: one per process; a cluster-pure stage takes its re-shard's); each
    process reads ``data_slots / world_size`` of them side by side, so the global batches, and with them the
    training, are the same whatever the number of processes. The reader settings are
    ``contrastive.modalities.image_text.grouped.GroupedBatchReader``'s and ``stream_batches``'.
    """
    clip: dict
    urls: list[str]
    grouped_dir: str | None
    global_batch_size: int
    grad_checkpointing: bool = False
    remainder_policy: str = "partial"
    active_streams: int = 16
    group_shuffle_buffer: int = 0
    shuffle_buffer: int = 1000
    #: threads decoding beside the training thread; None = ``contrastive.data.loading.default_workers``
    decode_workers: int | None = 0
    max_skip_fraction: float = 0.01
    num_samples: int | None = None
    local_loss: bool = False
    data_slots: int | None = None


def train_stage_from_json(*, spec: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun launch (``contrastive.engine.launch``): the spec arrives as JSON."""
    return train_stage(ClipStageSpec.from_json(spec), info=info)


def train_stage(spec: ClipStageSpec, *, info: DistInfo | None = None, callbacks: list[TrainCallback] = (),
                stop_after_steps: int | None = None) -> dict:
    """Fine-tune one stage (see :func:`_train_stage`), then hand its cached device memory back before the next."""
    info = info or DistInfo()
    summary = _train_stage(spec, info=info, callbacks=callbacks, stop_after_steps=stop_after_steps)
    release_device_memory(device_for(name=spec.device, info=info))
    return summary


def data_slots(spec: ClipStageSpec, *, world_size: int) -> int:
    """The slots a stage's data is laid out in: the re-shard's for a cluster-pure stage, else spec.data_slots or
    one per process; a multiple of the number of processes, splitting the global batch evenly."""
    slots = spec.data_slots or world_size
    if spec.grouped_dir is not None:
        manifest = Path(spec.grouped_dir) / MANIFEST
        if manifest.is_file():
            slots = manifest_slots(json.loads(manifest.read_text()))
    if slots % world_size:
        raise ConfigError(f"the data is laid out in {slots} slots, which {world_size} processes cannot share evenly: "
                          f"run a divisor of {slots} processes (distributed.nproc_per_node x nnodes), or set "
                          "distributed.data_slots to a multiple of the processes and rerun the re-shard")
    if spec.global_batch_size % slots:
        raise ConfigError(f"train.global_batch_size={spec.global_batch_size} does not split into {slots} data slots: "
                          "use a multiple of distributed.data_slots")
    return slots


def _train_stage(spec: ClipStageSpec, *, info: DistInfo, callbacks: list[TrainCallback],
                 stop_after_steps: int | None) -> dict:
    """Fine-tune one stage from the shared init; writes checkpoints/last.pt, model/model.pt, train_summary.json.

    spec.grouped_dir None: random batches streamed from ``spec.urls`` (stage 0). Otherwise every batch comes from
    one pseudo-label group of the re-shard in ``spec.grouped_dir`` (MCL stages >= 1). Every process of a torchrun
    launch calls this with its ``info``; rank 0 writes the files.
    """
    check_precision(spec.loop.precision)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    stage = Path(spec.stage_dir)
    torch_device = device_for(name=spec.device, info=info)
    slots = data_slots(spec, world_size=info.world_size)
    mine = range(info.rank * slots // info.world_size, (info.rank + 1) * slots // info.world_size)
    slot_batch = per_rank_batch(global_batch_size=spec.global_batch_size, world_size=slots)
    batch = slot_batch * len(mine)
    bundle = create_clip(spec=ClipSpec.from_dict(spec.clip), device="cpu")
    if spec.grad_checkpointing:
        bundle.model.set_grad_checkpointing(True)
    counter = SkipCounter(max_skip_fraction=spec.max_skip_fraction, where=f"stage training ({stage.name})")
    decode_workers = resolve_workers(spec.decode_workers)
    # one decode pool a data slot, kept for the stage (its worker processes start once), the workers split; they
    # tokenise the captions too (with workers: off the reading thread, which shares the GIL with training)
    decoder = SampleDecoder(bundle.train_transform, seed=spec.seed, uint8=True,
                            tokenizer=bundle.tokenizer if decode_workers else None)
    pools = [SampleDecodePool(decoder,
                              workers=max(1, decode_workers // len(mine)) if decode_workers else 0) for _ in mine]

    def step_ready(batch: ClipBatch) -> ClipBatch:  # on the engine's reading thread, off the training thread
        on_gpu = torch_device.type == "cuda"  # a GPU normalises the uint8 images in the step
        return ready_for_step(batch, tokenizer=bundle.tokenizer, pin_memory=on_gpu, normalize=not on_gpu)
    if spec.grouped_dir is None:
        total = count_samples(spec.urls, num_samples=spec.num_samples).total
        steps_per_epoch = max(1, total // spec.global_batch_size)

        def batches(epoch: int, start: int):
            streams = [itertools.islice(stream_batches(
                urls=spec.urls, batch_size=slot_batch, transform=bundle.train_transform, counter=counter,
                seed=spec.seed, epoch=epoch, slot=slot, slots=slots, shuffle_buffer=spec.shuffle_buffer,
                uint8=True, pool=pool), start, None) for slot, pool in zip(mine, pools)]
            return map(step_ready, map(concat_batches, zip(*streams)))
        plan_stats: dict = {"cluster_pure": 0}
    else:
        readers = [GroupedBatchReader(directory=Path(spec.grouped_dir), batch_size=slot_batch, slot=slot,
                                      seed=spec.seed, remainder_policy=spec.remainder_policy,
                                      active_streams=spec.active_streams, shuffle_buffer=spec.group_shuffle_buffer)
                   for slot in mine]
        steps_per_epoch = len(readers[0])

        def batches(epoch: int, start: int):
            side_by_side = zip(*(reader.batches(epoch=epoch, start=start, transform=bundle.train_transform,
                                                counter=counter, uint8=True, pool=pool)
                                 for reader, pool in zip(readers, pools)))
            return map(step_ready, map(concat_batches, side_by_side))
        plan_stats = {"cluster_pure": 1, **readers[0].schedule(0)[1]}
    metrics_file = JsonlMetrics(stage / "train_metrics.jsonl")
    recorder = KeyRecorder()
    torch.manual_seed(spec.seed)
    try:
        result = train(task=ClipTask(bundle=bundle, local_loss=spec.local_loss),
                       source=ClipBatchSource(batches, steps_per_epoch), optim=spec.optim, loop=spec.loop,
                       device=torch_device, checkpoint_path=stage / "checkpoints" / "last.pt",
                       callbacks=[metrics_file, *callbacks, *([recorder] if spec.record_keys else [])], info=info,
                       stop_after_steps=stop_after_steps)
    finally:
        for pool in pools:
            pool.close()
    if spec.loop.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, spec.loop.max_steps_per_epoch)
    counter.check()
    if spec.record_keys:
        write_json(stage / f"keys_rank{info.rank}.json", {"batches": recorder.batches,
                                                          "losses": [h["train/loss"] for h in result.history]})
    model_path = stage / "model" / "model.pt"
    summary = {**result.summary(), "steps_per_epoch_planned": steps_per_epoch,
               "world_size": info.world_size, "data_slots": slots, "per_rank_batch": batch, "batch_plan": plan_stats,
               "data": counter.stats(), "model_path": str(model_path)}
    if info.is_main:
        save_stage_model(model=bundle.model, spec=bundle.spec, path=model_path, weights_file=bundle.weights_file)
        write_stage_summary(stage / "train_summary.json", summary)
    return summary


# ---------------------------------------------------------------------------------------------------- export
def export_stage(*, model_path: str, urls: list[str], out_dir: str, batch_size: int, device: str,
                 max_skip_fraction: float, workers: int | None = 0, precision: str = "fp32", info: DistInfo | None = None,
                 progress: Callable[[int, int], None] | None = None) -> dict:
    """Image embeddings of every good training sample with the stage's model, keyed by ``__key__``.

    Uses the eval transform (no augmentation) and the shared export loop (``contrastive.embeddings``): float16
    shards + ids, streamed shard by shard. Under torchrun each rank embeds a contiguous share of the shards (whole
    shards, ``rank_share`` of the url list: img2dataset's shards hold about the same number of samples each) and
    rank 0 writes the manifest in rank order, the same keys in the same order as one process; the skip counts are
    summed over the ranks and ``max_skip_fraction`` is judged on the sums. ``precision``: the stage's
    (``train.precision``: fp16 / bf16 autocast on a GPU); it is part of the train key, which the export key holds.
    """
    info = info or current_info()
    torch_device = device_for(name=device, info=info)
    bundle = load_stage_model(path=Path(model_path), device=torch_device)
    mine = [urls[i] for i in rank_share(len(urls), info=info)]

    def embed(writer) -> dict[str, int]:
        counter = SkipCounter(max_skip_fraction=max_skip_fraction, where="embedding export")
        batches = (ExportBatch(ids=np.asarray(batch.keys), inputs=(batch.images,))
                   for batch in iter_decoded(urls=mine, transform=bundle.eval_transform, counter=counter,
                                             batch_size=batch_size, workers=resolve_workers(workers)))
        compute_embeddings(encode=lambda images: bundle.model.encode_image(images, normalize=True), batches=batches,
                           device=torch_device, writer=writer, precision=precision, progress=progress)
        return {k: v for k, v in counter.stats().items() if k != "skip_fraction"}  # summed over ranks

    def summarize(counts: dict[str, int]) -> dict:
        return {"data": export_data_stats(counts=counts, urls=urls, max_skip_fraction=max_skip_fraction,
                                          out_dir=Path(out_dir))}

    summary = export_ranked(out_dir=Path(out_dir), info=info, embed=embed, summarize=summarize)
    return {key: summary[key] for key in ("dir", "num_samples", "dim", "world_size", "data")} if summary else {}


def export_data_stats(*, counts: dict[str, int], urls: list[str], max_skip_fraction: float, out_dir: Path) -> dict:
    """The export's skip counts over all ranks, judged against ``max_skip_fraction`` (DataError beyond it, or when
    no sample was usable), compared with the shards' stats files and written to ``export_stats.json``."""
    counter = SkipCounter(max_skip_fraction=max_skip_fraction, where="embedding export")
    counter.good = counts.get("good", 0)
    counter.skipped.update({k[len("skipped_"):]: v for k, v in counts.items() if k.startswith("skipped_")})
    counter.check()
    if not counter.good:
        raise DataError(f"no usable samples in {len(urls)} shards: check data.shards")
    stats = counter.stats()
    # A shard cut exactly at a member boundary reads as a shorter, valid tar: only the counts can tell.
    try:
        expected = count_samples(urls).total
    except DataError:
        expected = None
    read = stats["seen"] - stats.get("skipped_tar_error", 0)
    if expected is not None and read < expected:
        log.warning("the shards hold %d samples but their stats files report %d: some shards are incomplete "
                    "(re-download them with img2dataset --incremental)", read, expected)
    stats["expected_from_stats"] = expected if expected is not None else -1
    write_json(Path(out_dir) / "export_stats.json", stats)
    return stats


def export_stage_from_json(*, export: dict, info: DistInfo | None = None) -> dict:
    """Entry point of a torchrun export (``contrastive.engine.launch``)."""
    return export_stage(**export, info=info)


def encode_eval_sets_from_json(*, encode: dict, info: DistInfo | None = None) -> dict:
    """Entry point of the evaluation sets' encoding as a job (one process): :func:`encode_eval_sets`, its path
    written to ``out_dir/ENCODE_SUMMARY`` for the flow."""
    from contrastive.engine.files import write_stage_summary
    from contrastive.engine.launch import ENCODE_SUMMARY
    result = {"path": encode_eval_sets(**encode)}
    write_stage_summary(Path(encode["out_dir"]) / ENCODE_SUMMARY, result)  # relative: the run directory may move
    return result


def reshard_stage(*, pseudo_labels_path: str, urls: list[str], out_dir: str, slots: int, seed: int,
                  spool_bytes: int) -> dict:
    """Group-sorted copy of the training shards for a cluster-pure stage (contrastive.modalities.image_text.grouped)."""
    path = Path(pseudo_labels_path)
    if not path.is_file():
        raise DataError(f"pseudo-labels {path} are missing: rerun the pipeline so the clustering step writes them")
    with zipfile.ZipFile(path) as stored:  # the ids and groups read in slices (NpzColumn), never whole
        return reshard_by_group(urls=urls, keys=NpzColumn(stored, "ids"), groups=NpzColumn(stored, "groups"),
                                out_dir=Path(out_dir), slots=slots, seed=seed, spool_bytes=spool_bytes)


# ---------------------------------------------------------------------------------------------------- evaluation
def make_soup(*, model_paths: list[str], out_path: str) -> str:
    """Average the stage models' trained weights (they share the frozen rest and the init) into one model file. It
    notes the models it was made of (``soup_of``) relative to its own directory: a run directory moves."""
    spec, states = load_stage_states([Path(p) for p in model_paths])
    soup = average_state_dicts(states)
    out = Path(out_path)
    save_torch({"spec": spec, "trainable_state": soup, "weights_fingerprint": None,
                "soup_of": [os.path.relpath(Path(p).resolve(), out.parent.resolve()) for p in model_paths]}, out,
               what="the model soup")
    return str(out)


def encode_eval_sets(*, model_path: str, out_dir: str, mmvp_dir: str | None, heldout_urls: list[str] | None,
                     prompt: str, retrieval_max_samples: int, batch_size: int, device: str,
                     max_skip_fraction: float, precision: str = "fp32") -> str:
    """Encode the MMVP pairs (images + statements) and the held-out retrieval pairs with one model; save
    normalised features to ``out_dir/eval_features.npz`` (what every single-stage, concat and soup score needs)."""
    torch_device = device_for(name=device, info=DistInfo())
    bundle = load_stage_model(path=Path(model_path), device=torch_device)
    arrays: dict[str, np.ndarray] = {}
    if mmvp_dir:
        pairs = read_mmvp(Path(mmvp_dir))
        arrays["mmvp_images"] = encode_images(model=bundle.model, images=pair_images(pairs),
                                              transform=bundle.eval_transform, device=torch_device,
                                              batch_size=batch_size, precision=precision)
        arrays["mmvp_texts"] = encode_texts(model=bundle.model, texts=pair_statements(pairs, prompt=prompt),
                                            tokenizer=bundle.tokenizer, device=torch_device, batch_size=batch_size,
                                            precision=precision)
        arrays["mmvp_categories"] = np.asarray([p.category for p in pairs])
    if heldout_urls:
        counter = SkipCounter(max_skip_fraction=max_skip_fraction, where="retrieval set")
        images, texts, keys = [], [], []
        for batch in iter_decoded(urls=heldout_urls, transform=bundle.eval_transform, counter=counter,
                                  batch_size=batch_size):
            batch = batch.take(retrieval_max_samples - len(keys))
            images.append(encode_images(model=bundle.model, images=batch.images, transform=None,
                                        device=torch_device, precision=precision))
            texts.append(encode_texts(model=bundle.model, texts=batch.texts, tokenizer=bundle.tokenizer,
                                      device=torch_device, precision=precision))
            keys.extend(batch.keys)
            if len(keys) >= retrieval_max_samples:
                break
        counter.check()
        if keys:
            arrays.update(retrieval_images=np.concatenate(images), retrieval_texts=np.concatenate(texts),
                          retrieval_keys=np.asarray(keys))
    if torch_device.type == "cuda":  # the scoring, or k-means on the GPU, may come next in this process
        del bundle
        release_device_memory(torch_device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{EVAL_FEATURES}.tmp.npz"
    np.savez(tmp, **arrays)
    tmp.replace(out / EVAL_FEATURES)
    return str(out / EVAL_FEATURES)


def score_eval_sets(*, feature_files: list[str]) -> dict[str, float]:
    """MMVP and retrieval metrics of one model's features, or of the concatenation of several (per-stage
    normalised, concatenated: the similarity is the sum of the stages' cosine similarities)."""
    loaded = [np.load(path, allow_pickle=False) for path in feature_files]
    metrics: dict[str, float] = {}
    if all("mmvp_images" in f for f in loaded):
        sims = pair_similarities(image_features=concat_stage_features([f["mmvp_images"] for f in loaded]),
                                 text_features=concat_stage_features([f["mmvp_texts"] for f in loaded]))
        metrics.update(mmvp_scores(similarities=sims, categories=loaded[0]["mmvp_categories"].tolist()))
    if all("retrieval_images" in f for f in loaded):
        keys = loaded[0]["retrieval_keys"]
        if any(not np.array_equal(f["retrieval_keys"], keys) for f in loaded[1:]):
            raise DataError("the stages' retrieval features cover different held-out samples; rerun the evaluation")
        metrics.update(retrieval_recall(
            image_features=concat_stage_features([f["retrieval_images"] for f in loaded]),
            text_features=concat_stage_features([f["retrieval_texts"] for f in loaded])))
    return metrics
