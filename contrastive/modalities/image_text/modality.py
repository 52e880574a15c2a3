"""The image-text modality (``pipeline: clip``, MCL paper Sec. 5.5): open_clip fine-tuned stage by stage from the
same init on webdataset shards; cluster-pure batches read from a copy of the shards re-written sorted by group;
scored by MMVP pairs and held-out retrieval, encoded once per model; the model soup of the stages beside them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from contrastive.modalities.base import Launch, Member, Modality, ResultsTable, ServingInput, SweepMetric


class ImageTextModality(Modality):
    name = "clip"
    title = "image-text pairs"
    step_prefix = "clip-"
    launch = Launch(train_entry="contrastive.modalities.image_text.steps:train_stage_from_json",
                    export_entry="contrastive.modalities.image_text.steps:export_stage_from_json",
                    encode_entry="contrastive.modalities.image_text.steps:encode_eval_sets_from_json")
    clusters_dataset = False  # every exported sample of the shards, no attributes
    regroups = True
    encodes_for_eval = True
    serving = ServingInput(dtype="uint8", shape=(-1, -1, -1, -1),
                           description="RGB uint8 images (n, H, W, 3) or (n, 3, H, W): their image embeddings",
                           requirements=("torch", "torchvision", "numpy", "open_clip_torch", "webdataset"))
    sweep_metric = SweepMetric(prefix="mmvp", label="MMVP-VLM pair accuracy (%)", percent=True)

    # ------------------------------------------------------------------------------------------ checks and data
    def preflight(self, config) -> None:
        from contrastive.modalities.image_text.config import check_clip_pretrained
        check_clip_pretrained(config)

    def prepare_data(self, config, *, log: Callable[[str], None]) -> dict:
        """Resolve (or write the synthetic) shards, the held-out set and the MMVP directory; check K^N <= M/B and
        that the init weights resolve, before any training."""
        from contrastive.modalities.image_text.config import check_clip_feasible, check_clip_pretrained
        from contrastive.data.urls import expand_urls
        from contrastive.modalities.image_text.data import count_samples, data_fingerprint
        from contrastive.modalities.image_text.model import file_fingerprint, resolve_pretrained
        from contrastive.modalities.image_text.steps import prepare_synthetic_data
        from contrastive.data.dataset import params_hash
        check_clip_pretrained(config)
        d, e = config.data, config.eval
        synthetic = None
        if d.shards is None:
            s = d.synthetic
            root = Path(d.cache_dir).resolve() / f"clip-synthetic-{params_hash(s.model_dump(mode='json'))}"
            synthetic = prepare_synthetic_data(
                root=root, num_train=s.num_train, num_heldout=s.num_heldout, samples_per_shard=s.samples_per_shard,
                image_size=s.image_size, num_colors=s.num_colors, num_shapes=s.num_shapes,
                num_textures=s.num_textures, corrupt=s.corrupt, mmvp_pairs_per_category=s.mmvp_pairs_per_category,
                seed=s.seed)
            log(f"synthetic image-text shards in {root}")
        train_urls = synthetic["train_urls"] if synthetic else expand_urls(d.shards)
        heldout_urls = expand_urls(d.heldout_shards) if d.heldout_shards else (synthetic or {}).get("heldout_urls")
        mmvp_dir = str(e.mmvp_dir) if e.mmvp_dir else (synthetic or {}).get("mmvp_dir")
        count = count_samples(train_urls, num_samples=d.num_samples)
        check_clip_feasible(config, num_train=count.total)
        weights, _ = resolve_pretrained(model_name=config.model.name, pretrained=config.model.pretrained,
                                        cache_dir=config.model.cache_dir)
        if not mmvp_dir:
            log("no MMVP directory (eval.mmvp_dir): MMVP scores are skipped")
        if not heldout_urls:
            log("no held-out shards (data.heldout_shards): retrieval recall is skipped")
        digest = params_hash({"train": data_fingerprint(train_urls), "heldout": data_fingerprint(heldout_urls or []),
                            "mmvp": _dir_fingerprint(mmvp_dir), "weights": file_fingerprint(weights)}, length=16)
        return {"dir": str(Path(train_urls[0]).parent), "train_urls": train_urls, "heldout_urls": heldout_urls,
                "mmvp_dir": mmvp_dir, "num_train": count.total, "count_source": count.source, "digest": digest}

    # ------------------------------------------------------------------------------------------ training
    def train_content(self, config, *, stage: int, seed: int, data: dict, batches_key: str | None,
                      inherit_key: str | None) -> dict:
        """What a stage's weights depend on: init, training settings, world size, data, and its batches' groups."""
        reader = config.mcl.model_dump(include={"remainder_policy", "active_streams", "group_shuffle_buffer"}) \
            if batches_key else None
        d = config.distributed
        return {"step": "clip-train", "model": config.model.content(), "train": config.train_key_content(),
                "world_size": d.nproc_per_node, "local_loss": d.local_loss,
                **({"data_slots": d.data_slots} if d.data_slots else {}),
                "seed": seed, "data": data["digest"], "grouped": batches_key, "reader": reader,
                "shuffle_buffer": config.data.shuffle_buffer, "max_skip_fraction": config.data.max_skip_fraction}

    def train_spec(self, config, *, stage: int, seed: int, out_dir: str, data: dict, batches_path: str | None,
                   init_model_path: str | None):
        from contrastive.modalities.image_text.steps import ClipStageSpec
        t, m = config.train, config.mcl
        return ClipStageSpec(
            clip=clip_spec(config).to_dict(), urls=data["train_urls"], grouped_dir=batches_path, stage_dir=out_dir,
            global_batch_size=t.global_batch_size, optim=t.optim_spec(), loop=t.loop_spec(),
            grad_checkpointing=t.grad_checkpointing, device=config.device, seed=seed,
            remainder_policy=m.remainder_policy, active_streams=m.active_streams,
            group_shuffle_buffer=m.group_shuffle_buffer, shuffle_buffer=config.data.shuffle_buffer,
            decode_workers=config.data.decode_workers, max_skip_fraction=config.data.max_skip_fraction,
            num_samples=config.data.num_samples, local_loss=config.distributed.local_loss,
            data_slots=config.distributed.data_slots, threads=t.threads)

    def train(self, spec, *, callbacks: list) -> dict:
        from contrastive.modalities.image_text.steps import train_stage
        return train_stage(spec, callbacks=callbacks)

    def train_metrics(self, summary: dict) -> dict[str, float]:
        return {f"data/{k}": v for k, v in summary["data"].items() if isinstance(v, (int, float))}

    # ------------------------------------------------------------------------------------------ export
    def export_content(self, config, *, train_key: str) -> list:
        return ["clip-export", train_key, config.data.max_skip_fraction]

    def export_kwargs(self, config, *, model_path: str, data: dict, out_dir: str) -> dict:
        """Image embeddings of every good training sample, keyed by ``__key__``, under the stage's precision (part
        of the train key, so of this export's key)."""
        return {"model_path": model_path, "urls": data["train_urls"], "out_dir": out_dir,
                "batch_size": config.eval.export_batch_size, "device": config.device,
                "max_skip_fraction": config.data.max_skip_fraction, "workers": config.data.decode_workers,
                "precision": config.train.precision}

    export_reports_progress = True

    def export(self, **kwargs) -> dict:
        from contrastive.modalities.image_text.steps import export_stage
        return export_stage(**kwargs)

    def export_metrics(self, result: dict) -> dict[str, float]:
        return result["data"]

    # ------------------------------------------------------------------------------------------ between stages
    def regroup_content(self, config, *, stage: int, seed: int, pseudo_key: str, data: dict) -> list:
        return ["clip-reshard", pseudo_key, data["digest"], config.distributed.slots(), seed]

    def regroup(self, config, *, stage: int, seed: int, pseudo_labels_path: str, data: dict, out_dir: str) -> dict:
        """A group-sorted copy of the training shards for cluster-pure stage ``stage`` (one sequential pass)."""
        from contrastive.modalities.image_text.grouped import MANIFEST
        from contrastive.modalities.image_text.steps import reshard_stage
        grouped_dir = Path(out_dir) / "grouped"
        manifest = reshard_stage(pseudo_labels_path=pseudo_labels_path, urls=data["train_urls"],
                                 out_dir=str(grouped_dir), slots=config.distributed.slots(), seed=seed,
                                 spool_bytes=config.mcl.spool_mb << 20)
        stats = {k: v for k, v in manifest.items() if isinstance(v, (int, float)) and k != "seed"}
        return {"path": str(grouped_dir), "stats": stats, "artifacts": [grouped_dir / MANIFEST]}

    # ------------------------------------------------------------------------------------------ evaluation
    def encode_content(self, config, *, model_key: str, data: dict) -> list:
        e = config.eval
        return ["clip-encode", model_key, data["digest"], e.mmvp_prompt, e.retrieval_max_samples]

    def encode_kwargs(self, config, *, model_path: str, data: dict, out_dir: str) -> dict:
        e = config.eval
        return {"model_path": model_path, "out_dir": out_dir, "mmvp_dir": data["mmvp_dir"],
                "heldout_urls": data["heldout_urls"], "prompt": e.mmvp_prompt,
                "retrieval_max_samples": e.retrieval_max_samples, "batch_size": e.batch_size,
                "device": config.device, "max_skip_fraction": config.data.max_skip_fraction}

    def encode_for_eval(self, **kwargs) -> str:
        """MMVP and held-out retrieval features of one model (a stage or the soup)."""
        from contrastive.modalities.image_text.steps import encode_eval_sets
        return encode_eval_sets(**kwargs)

    def eval_content(self, config, *, member_keys: list[str]) -> list:
        return ["clip-score", member_keys]

    def evaluate(self, config, *, members: list[Member], data: dict, out_dir: str) -> dict[str, float]:
        """MMVP per category + average and retrieval R@1/5/10 of one model or of the concatenation of several."""
        from contrastive.modalities.image_text.steps import score_eval_sets
        return score_eval_sets(feature_files=[m.features for m in members])

    def combines_models(self, config) -> bool:
        return config.eval.soup

    def combine_models(self, *, model_paths: list[str], out_path: str) -> str:
        """The model soup: the weight average of the stage models."""
        from contrastive.modalities.image_text.steps import make_soup
        return make_soup(model_paths=model_paths, out_path=out_path)

    # ------------------------------------------------------------------------------------------ reporting
    def tables(self, config, summary: dict) -> list[ResultsTable]:
        results = summary["results"]
        return [ResultsTable(title=f"{config.name}: MMVP-VLM pair accuracy (%)", rows=results, metric="mmvp",
                             percent=True),
                ResultsTable(title="zero-shot retrieval recall (%)", rows=results, metric="retrieval",
                             percent=True)]

    def plots(self, config, *, results: dict[str, dict], out: Path) -> list[Path]:
        from contrastive.modalities.image_text.evaluate import plot_metric_groups
        paths = []
        if any(k.startswith("mmvp/") for m in results.values() for k in m):
            paths.append(plot_metric_groups(results=results, prefix="mmvp", path=out / "mmvp.png",
                                            title="MMVP-VLM pair accuracy per category"))
        if any(k.startswith("retrieval/") for m in results.values() for k in m):
            paths.append(plot_metric_groups(results=results, prefix="retrieval", path=out / "retrieval.png",
                                            title="zero-shot retrieval recall@k (held-out)", ylabel="recall (%)"))
        return paths

    # ------------------------------------------------------------------------------------------ serving
    def serving_file(self, model_path: str, *, out_dir: Path) -> str:
        from contrastive.modalities.image_text.serving import write_serving_file
        return write_serving_file(model_path, out_dir=out_dir)

    def load_encoder(self, model_path: str):
        from contrastive.modalities.image_text.serving import load_encoder
        return load_encoder(model_path)

    def embed(self, encoder, inputs):
        from contrastive.modalities.image_text.serving import embed
        return embed(encoder, inputs)


def clip_spec(config):
    """The one init every stage starts from."""
    from contrastive.modalities.image_text.model import ClipSpec
    m = config.model
    return ClipSpec(model_name=m.name, pretrained=m.pretrained, init_seed=m.init_seed,
                    trainable_image_blocks=m.trainable_image_blocks, lock_text=m.lock_text,
                    train_logit_scale=m.train_logit_scale, cache_dir=m.cache_dir)


def _dir_fingerprint(directory: str | None) -> list | None:
    if not directory:
        return None
    root = Path(directory)
    return sorted([str(p.relative_to(root)), p.stat().st_size] for p in root.rglob("*") if p.is_file())


MODALITY = ImageTextModality()
