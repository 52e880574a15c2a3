"""How the data path of a pipeline grows with the number of samples M: ``make bench-scale`` (``python -m bench.scale``).

Two pipelines, each at M = 100k, 300k and 1M synthetic samples (``--sizes``):

- CLIP (``pipeline: clip``, the ``clip_tiny`` preset with the tiny model, K = 10): prepare (resolve and count the
  shards), export, k-means, pseudo-labels, re-shard, and one epoch of the group-stream reader (decode + tokenise, no
  training);
- images (``pipeline: mcl``, the ``image_folder_simclr_hex`` preset on a folder of JPEG files, ``storage: files``,
  K = 10): prepare (index the folder), export, k-means, pseudo-labels, and one epoch of the cluster-pure reader
  (``stage_sampler`` + ``BatchReader``, decoded, no augmentation, no training).

Every step but the readers is the pipeline's own Prefect task (``tasks.steps``) run in a Prefect flow against a
Prefect server this benchmark starts, recording into a local sqlite MLflow store, each in its own Python process,
so peak memory is per step. The readers have no task of their own (the train task reads them): they are wired as
the stage's training wires them (``contrastive.modalities.image_text.steps._train_stage``,
``contrastive.modalities.image.steps.train_stage``) and record what ``finish_train_record`` logs of them (the batch
plan). Decoding runs in the measured process (``decode_workers: 0``, ``train.workers: 0``), so its peak RSS covers
all of it.

Per step and size: seconds (the task call), peak RSS (VmHWM of the step's process, reset just before the call) and
its growth over the RSS before the call, bytes written (the step's output directory), and what it recorded: MLflow
params, tags, metric keys and points, dataset inputs, artifact files and bytes of its run; Prefect artifacts, logs
and task runs of its flow run and the bytes of the persisted task result. From these: the log-log slope of each
step between sizes and three goals (``GOALS``), a projection to CC12M, a table on stdout and a section in
BENCHMARKS.md (between ``MARK_BEGIN`` and ``MARK_END``; ``make bench`` keeps it).

Synthetic data: 24 px JPEGs drawn from a pool of 512 pre-encoded ones (decoding cost is per image, not per
distinct image), captions of a few words, img2dataset-style shards of 10,000 samples (CC12M's), and image files in
class folders of 1,000 files a subfolder. Generating it is not a pipeline step and is not timed with the steps. The
whole work directory (``--work``) is deleted at the end unless ``--keep``.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import replace_section

ROOT = Path(__file__).resolve().parent.parent
MARK_BEGIN, MARK_END = "<!-- bench-scale:begin -->", "<!-- bench-scale:end -->"
SIZES = (100_000, 300_000, 1_000_000)
CC12M = 12_000_000
CC12M_DIM = 768
PIPELINES = {
    "clip": ("prepare", "export", "kmeans", "pseudo_labels", "reshard", "reader"),
    "image": ("prepare", "export", "kmeans", "pseudo_labels", "reader"),
}
#: The plan's step category (``planning.model.PlannedStep.category``) each measured step's slope stands for: the
#: reader's epoch is what a training's time grows with.
PLAN_CATEGORIES = {"prepare": "prepare", "export": "export", "kmeans": "cluster", "pseudo_labels": "pseudo_labels",
                   "reshard": "regroup", "reader": "train"}
SAMPLES_PER_SHARD = 10_000
FILES_PER_FOLDER = 1_000
CLASSES = 10
IMAGE_PX = 24
POOL = 512
K = 10
STEP_TIMEOUT_S = 3_600

#: The goals judged on the measurements (stated in the report).
MAX_SLOPE = 1.1  # seconds ~ M log M between 100k and 1M is a slope of about 1.1 (log factor 1.2x over 10x)
RSS_FLAT_RATIO = 1.3  # the step's RSS growth (peak minus RSS before the call) at the largest size within 1.3x of
#                       the smallest's ...
RSS_FLAT_SLACK = 64 << 20  # ... give or take 64 MiB (allocator noise on steps of a few MiB)
RECORD_RATIO = 1.1  # every recorded count and byte total within 1.1x from the smallest to the largest size
RSS_EXEMPT = {"kmeans"}  # k-means holds the (M, D) embeddings by design (docs/clip.md, memory note)
#: Recorded figures that are the step's data itself, expected to grow with M (reported, not judged).
DATA_RECORDS = {"mlflow_artifact_bytes", "mlflow_artifact_files"}
GOALS = (f"time: log-log slope of seconds between the sizes <= {MAX_SLOPE} (M log M over 100k..1M is ~1.1)",
         f"memory: the step's RSS growth (its peak minus the process's RSS before the call: imports and Prefect "
         f"excluded) at the largest size <= {RSS_FLAT_RATIO} x the smallest size's + {RSS_FLAT_SLACK >> 20} MiB, "
         f"every step except k-means",
         f"records: every MLflow / Prefect count and byte total within {RECORD_RATIO}x from the smallest to the "
         "largest size, except the artifacts' files and bytes (the step's output files: hard links in a local "
         "store, uploaded to a tracking server's; reported, not judged)")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- data
def jpeg_pool(*, size: int = IMAGE_PX, count: int = POOL, seed: int = 0) -> list[bytes]:
    """``count`` distinct small JPEGs (noise over a random colour), encoded once."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(count):
        base = rng.integers(0, 256, 3)
        pixels = np.clip(base + rng.normal(0, 40, (size, size, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
        pool.append(buffer.getvalue())
    return pool


WORDS = ("red", "green", "blue", "small", "large", "striped", "dotted", "circle", "square", "star")


def caption(i: int) -> bytes:
    return f"a {WORDS[i % 5]} {WORDS[5 + (i // 5) % 3]} {WORDS[7 + (i // 15) % 3]}".encode()


def write_shards(directory: Path, *, num_samples: int) -> list[str]:
    """img2dataset-style shards (``<n>.tar`` + ``<n>_stats.json``) of ``num_samples`` jpg + txt + json samples."""
    from contrastive.modalities.image_text.data import STATS_SUFFIX, TAR_END, sample_members

    directory.mkdir(parents=True, exist_ok=True)
    pool = jpeg_pool()
    urls = []
    for shard in range(-(-num_samples // SAMPLES_PER_SHARD)):
        rows = range(shard * SAMPLES_PER_SHARD, min(num_samples, (shard + 1) * SAMPLES_PER_SHARD))
        payload = bytearray()
        for i in rows:
            key = f"{shard:05d}{i - rows.start:05d}"
            payload += sample_members({"__key__": key, "jpg": pool[i % POOL], "txt": caption(i),
                                       "json": json.dumps({"key": key, "status": "success"}).encode()})
        name = f"{shard:05d}"
        (directory / f"{name}.tar").write_bytes(bytes(payload) + TAR_END)
        (directory / f"{name}{STATS_SUFFIX}").write_text(json.dumps(
            {"count": len(rows), "successes": len(rows), "failed_to_download": 0, "failed_to_resize": 0}))
        urls.append(str(directory / f"{name}.tar"))
    return urls


def write_image_folder(directory: Path, *, num_samples: int) -> None:
    """``c<class>/b<block>/<i>.jpg``: CLASSES class folders, FILES_PER_FOLDER files a subfolder."""
    pool = jpeg_pool()
    for i in range(num_samples):
        folder = directory / f"c{i % CLASSES}" / f"b{i // (CLASSES * FILES_PER_FOLDER):05d}"
        if i < CLASSES * FILES_PER_FOLDER or i % (CLASSES * FILES_PER_FOLDER) < CLASSES:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:08d}.jpg").write_bytes(pool[i % POOL])


def write_data(pipeline: str, work: Path, *, size: int) -> None:
    """The pipeline's synthetic data of ``size`` samples in ``work`` (shards or an image folder) and ``size.json``,
    which :func:`config_for` reads."""
    (work / "size.json").write_text(json.dumps({"size": size}))
    if pipeline == "clip":
        write_shards(work / "shards", num_samples=size)
    else:
        write_image_folder(work / "images", num_samples=size)


# ---------------------------------------------------------------------------------------------------- one step
@dataclass
class StepResult:
    pipeline: str
    step: str
    size: int
    status: str = "ok"  # ok | skipped | error
    seconds: float | None = None
    peak_rss: int | None = None  # bytes, VmHWM of the step's process during the call
    rss_before: int | None = None  # bytes, VmRSS just before the call
    bytes_written: int | None = None
    records: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    note: str = ""

    @property
    def rss_growth(self) -> int | None:
        return None if self.peak_rss is None or self.rss_before is None else self.peak_rss - self.rss_before


def _status_bytes(name: str) -> int | None:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    return None


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (a hard link counted once per name, as du --count-links)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def config_for(pipeline: str, work: Path):
    from pipeline_config.loader import load_config

    common = [f"output_dir={work / 'runs'}", f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
              "tracking.experiment=bench-scale", "device=cpu", f"mcl.clusters={K}", "mcl.num_stages=2"]
    if pipeline == "clip":
        size = int(json.loads((work / "size.json").read_text())["size"])
        last = -(-size // SAMPLES_PER_SHARD) - 1
        shards = f"{work / 'shards'}/{{00000..{last:05d}}}.tar" if last else f"{work / 'shards'}/00000.tar"
        return load_config("clip_tiny", [*common, f"data.shards={shards}",
                                         "data.decode_workers=0", "eval.export_batch_size=512",
                                         f"data.cache_dir={work / 'cache'}", "mcl.kmeans_niter=25"])
    return load_config("image_folder_simclr_hex", [
        *common, f"data.image_folder.source={work / 'images'}", f"data.image_folder.image_size={IMAGE_PX}",
        "data.image_folder.storage=files", f"data.cache_dir={work / 'cache'}", "train.workers=0"])


def _record(work: Path, name: str):
    from tasks.records import (ClusterRecord, ExportRecord, PseudoLabelRecord, RegroupRecord, TrainRecord,
                               finished_record)
    kinds = {"train": TrainRecord, "export": ExportRecord, "kmeans": ClusterRecord,
             "pseudo_labels": PseudoLabelRecord, "reshard": RegroupRecord}
    record = finished_record(work / "steps" / name, kinds[name])
    if record is None:
        raise RuntimeError(f"step {name} has no finished record in {work / 'steps' / name}")
    return record


def _untrained_model(pipeline: str, config, work: Path, run_id: str):
    """A stage-0 TrainRecord over an untrained model (what the export reads; its weights do not change its cost)."""
    from tasks.records import TrainRecord

    out = work / "steps" / "train"
    path = out / "model" / "model.pt"
    if pipeline == "clip":
        from contrastive.modalities.image_text.model import create_clip, save_stage_model
        from contrastive.modalities.image_text.modality import clip_spec
        bundle = create_clip(spec=clip_spec(config), device="cpu")
        save_stage_model(model=bundle.model, spec=bundle.spec, path=path, weights_file=bundle.weights_file)
    else:
        import torch
        from contrastive.methods import build_method
        model = config.model.model_dump(mode="json")
        method = config.method.model_dump(mode="json")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": build_method(model_kwargs=model, method_kwargs=method).state_dict(),
                    "model_kwargs": model, "method_kwargs": method}, path)
    return TrainRecord(key="untrained", dir=str(out), stage=0, mlflow_run_id=run_id, model_path=str(path),
                       summary={}).save()


def clip_reader_epoch(config, work: Path, *, grouped_dir: str, tracker, run_id: str) -> dict:
    """One epoch of stage 1's cluster-pure batches as ``_train_stage`` reads them (one data slot, decoding and
    tokenising on this thread: ``decode_workers: 0``), then the batch-plan metrics ``finish_train_record`` logs."""
    from contrastive.data.skips import SkipCounter
    from contrastive.engine.distributed import per_rank_batch
    from contrastive.modalities.image_text.data import SampleDecodePool, SampleDecoder, ready_for_step
    from contrastive.modalities.image_text.grouped import GroupedBatchReader
    from contrastive.modalities.image_text.model import create_clip
    from contrastive.modalities.image_text.modality import clip_spec
    from tasks.steps import numeric_metrics, stage_seed

    stage = config.for_stage(1)
    bundle = create_clip(spec=clip_spec(stage), device="cpu")
    seed = stage_seed(config, 1)
    reader = GroupedBatchReader(directory=Path(grouped_dir), batch_size=per_rank_batch(
        global_batch_size=stage.train.global_batch_size, world_size=1), slot=0, seed=seed,
        remainder_policy=stage.mcl.remainder_policy, active_streams=stage.mcl.active_streams,
        shuffle_buffer=stage.mcl.group_shuffle_buffer)
    counter = SkipCounter(max_skip_fraction=stage.data.max_skip_fraction, where="bench-scale reader")
    pool = SampleDecodePool(SampleDecoder(bundle.train_transform, seed=seed, uint8=True, tokenizer=None), workers=0)
    samples = batches = 0
    try:
        for batch in reader.batches(epoch=0, transform=bundle.train_transform, counter=counter, uint8=True, pool=pool):
            batch = ready_for_step(batch, tokenizer=bundle.tokenizer, pin_memory=False, normalize=True)
            samples += len(batch.keys)
            batches += 1
    finally:
        pool.close()
    plan = {"cluster_pure": 1, **reader.schedule(0)[1]}
    tracker.log_metrics(run_id, numeric_metrics("batch_plan", plan))
    return {"samples": samples, "batches": batches}


def image_reader_epoch(config, work: Path, *, data: dict, pseudo_labels_path: str, tracker, run_id: str) -> dict:
    """One epoch of stage 1's cluster-pure batches as ``contrastive.modalities.image.steps.train_stage`` reads them
    (``stage_sampler`` + ``BatchReader`` + ``ImageBatchSource``, decoding in this process: ``train.workers: 0``),
    without the augmentation; then the batch-plan metrics ``finish_train_record`` logs."""
    from contrastive.data.dataset import RowsOf
    from contrastive.data.loading import BatchReader, load_dataset
    from contrastive.engine.distributed import DistInfo
    from contrastive.mcl.steps import stage_sampler
    from contrastive.modalities.image.adapter import ImageBatchSource
    from contrastive.modalities.image.steps import read_image_batches
    from tasks.steps import numeric_metrics, stage_seed

    stage = config.for_stage(1)
    dataset = load_dataset(data["dir"])
    rows, sampler, groups = stage_sampler(dataset=dataset, pseudo_labels_path=pseudo_labels_path,
                                          batch_size=stage.train.batch_size, seed=stage_seed(config, 1),
                                          remainder_policy=stage.mcl.remainder_policy)
    reader = BatchReader(dataset, workers=0)
    source = ImageBatchSource(sampler=sampler, ids=RowsOf(dataset.ids, rows), groups=groups, info=DistInfo(),
                              read_batches=lambda planned: read_image_batches(reader=reader, rows_in_split=rows,
                                                                              planned=planned))
    samples = batches = 0
    try:
        for batch in source.batches(epoch=0, start=0):
            samples += len(batch.rows)
            batches += 1
    finally:
        reader.close()
    tracker.log_metrics(run_id, numeric_metrics("batch_plan", sampler.stats))
    return {"samples": samples, "batches": batches}


def run_step(pipeline: str, step: str, work: Path) -> dict:
    """The body of one step, in a Prefect flow; returns {"seconds", "peak_rss", "rss_before", "info"}."""
    import tasks.steps as t
    from prefect import flow
    from prefect.runtime import flow_run

    config = config_for(pipeline, work)
    tracker = t.tracker_for(config)
    run_id = tracker.start_run(name=f"{pipeline}-{step}", tags={"bench": "scale"})
    data_file = work / "data.json"
    data = json.loads(data_file.read_text()) if data_file.exists() else None
    steps_dir = work / "steps"
    kwargs = {"config": config, "key": f"{pipeline}-{step}", "out_dir": str(steps_dir / step), "mlflow_run_id": run_id}

    def call():
        if step == "prepare":
            return t.prepare_data(config=config)
        if step == "export":
            trained = _untrained_model(pipeline, config, work, run_id)
            _reset_peak()  # the untrained model above is set-up, not the export
            return t.export_embeddings(**kwargs, trained=trained, data=data)
        if step == "kmeans":
            return t.cluster_embeddings(**kwargs, stage=0, exported=_record(work, "export"), earlier=[], data=data)
        if step == "pseudo_labels":
            return t.make_pseudo_labels(**kwargs, for_stage=1, clusters=[_record(work, "kmeans")],
                                        exports=[_record(work, "export")], data=data)
        if step == "reshard":
            return t.regroup_batches(**kwargs, stage=1, pseudo=_record(work, "pseudo_labels"), data=data)
        if step == "reader" and pipeline == "clip":
            return clip_reader_epoch(config, work, grouped_dir=_record(work, "reshard").path, tracker=tracker,
                                     run_id=run_id)
        if step == "reader":
            return image_reader_epoch(config, work, data=data, pseudo_labels_path=_record(work, "pseudo_labels").path,
                                      tracker=tracker, run_id=run_id)
        raise ValueError(f"unknown step {pipeline}:{step}")

    @flow(name=f"bench-scale-{pipeline}-{step}")
    def one_step() -> dict:
        import gc
        gc.collect()
        before = _status_bytes("VmRSS")
        _reset_peak()
        started = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "peak_rss": _status_bytes("VmHWM"), "rss_before": before,
                "flow_run_id": str(flow_run.get_id()), "result": result}

    measured = one_step()
    result = measured.pop("result")
    if step == "prepare":
        data_file.write_text(json.dumps(result))
        info = {"num_train": result["num_train"]}
    elif isinstance(result, dict):
        info = result
    else:
        info = {k: v for k, v in result.model_dump().items() if isinstance(v, (int, float))}
    out = steps_dir / step
    measured["bytes_written"] = dir_bytes(out) if out.exists() else 0
    if step == "prepare" and pipeline == "image":
        measured["bytes_written"] = dir_bytes(Path(result["dir"]))
    measured["records"] = {**mlflow_counts(tracker, run_id), **prefect_counts(measured.pop("flow_run_id"))}
    measured["info"] = info
    return measured


def mlflow_counts(tracker, run_id: str) -> dict:
    """What the step recorded in its MLflow run: counts and bytes of params, tags (ours and MLflow's own at creation
    excluded), metric keys and points, dataset inputs, artifact files and bytes."""
    client = tracker.client
    run = client.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") and k != "bench"}
    points = sum(len(client.get_metric_history(run_id, key)) for key in run.data.metrics)
    inputs = run.inputs.dataset_inputs if run.inputs else []
    artifacts = tracker.local_artifact_dir(run_id)
    files = [p for p in artifacts.rglob("*") if p.is_file()] if artifacts and artifacts.exists() else []
    return {"mlflow_params": len(run.data.params),
            "mlflow_param_bytes": sum(len(k) + len(v) for k, v in run.data.params.items()),
            "mlflow_tags": len(tags), "mlflow_tag_bytes": sum(len(k) + len(v) for k, v in tags.items()),
            "mlflow_metric_keys": len(run.data.metrics), "mlflow_metric_points": points,
            "mlflow_dataset_inputs": len(inputs),
            "mlflow_dataset_bytes": sum(len(i.dataset.profile or "") + len(i.dataset.source or "") for i in inputs),
            "mlflow_artifact_files": len(files), "mlflow_artifact_bytes": sum(p.stat().st_size for p in files)}


def prefect_counts(flow_run_id: str) -> dict:
    """What the step's flow run recorded in Prefect: artifacts (and their bytes), log lines, task runs, and the
    bytes of the persisted task results (the local result storage of this step's process)."""
    import httpx
    from prefect.settings import PREFECT_API_URL, PREFECT_LOCAL_STORAGE_PATH

    # Plain REST calls: this Prefect's client sends null for unset filter fields, which its server refuses (422).
    def query(path: str, body: dict) -> list[dict]:
        found: list[dict] = []
        while True:
            response = httpx.post(f"{PREFECT_API_URL.value().rstrip('/')}/{path}",
                                  json={**body, "limit": 200, "offset": len(found)}, timeout=60)
            response.raise_for_status()
            found += response.json()
            if len(response.json()) < 200:
                return found

    from prefect.logging.handlers import APILogWorker
    APILogWorker.drain_all(timeout=30)  # the flow's log lines reach the server in the background

    this_run = {"any_": [flow_run_id]}
    artifacts = query("artifacts/filter", {"artifacts": {"flow_run_id": this_run}})
    logs = query("logs/filter", {"logs": {"flow_run_id": this_run}})
    task_runs = query("task_runs/filter", {"flow_runs": {"id": this_run}})
    storage = Path(PREFECT_LOCAL_STORAGE_PATH.value())
    return {"prefect_artifacts": len(artifacts),
            "prefect_artifact_bytes": sum(len(json.dumps(a.get("data"), default=str)) for a in artifacts),
            "prefect_logs": len(logs), "prefect_log_bytes": sum(len(line["message"]) for line in logs),
            "prefect_task_runs": len(task_runs),
            "prefect_result_bytes": dir_bytes(storage) if storage.exists() else 0}


def child_main(pipeline: str, step: str, work: Path, out: Path) -> int:
    """``python -m bench.scale --child PIPELINE:STEP --work DIR --out FILE`` (one step in its own process)."""
    try:
        if step == "data":
            started = time.perf_counter()
            write_data(pipeline, work, size=int(json.loads((work / "size.json").read_text())["size"]))
            result = {"seconds": time.perf_counter() - started}
        else:
            result = run_step(pipeline, step, work)
        out.write_text(json.dumps(result, default=str))
        return 0
    except Exception:  # noqa: BLE001 - the driver turns it into an "error" row
        out.write_text(json.dumps({"error": traceback.format_exc()[-3000:]}))
        return 1


# ---------------------------------------------------------------------------------------------------- driver
def start_prefect_server(work: Path) -> tuple[object, dict]:
    """A Prefect server for the whole benchmark (its database in ``work``); the steps' processes talk to it."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start(timeout=300)
    return server, {"PREFECT_API_URL": server.api_url}


def run_child(pipeline: str, step: str, work: Path, env: dict, *, timeout: float) -> dict:
    out = work / f"result-{step}.json"
    command = [sys.executable, "-m", "bench.scale", "--child", f"{pipeline}:{step}", "--work", str(work),
               "--out", str(out)]
    child_env = {**os.environ, **env, "PREFECT_LOCAL_STORAGE_PATH": str(work / "prefect-results" / step),
                 "PYTHONPATH": str(ROOT)}
    try:
        completed = subprocess.run(command, cwd=ROOT, env=child_env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout:.0f} s and was stopped"}
    if not out.exists():
        return {"error": f"exited with code {completed.returncode}: {completed.stderr[-2000:]}"}
    result = json.loads(out.read_text())
    if "error" in result:
        return result
    return result


def run_pipeline(pipeline: str, size: int, work: Path, env: dict, *, deadline: float,
                 earlier: list[StepResult]) -> list[StepResult]:
    """Every step of ``pipeline`` at ``size``; a step projected (linearly from the largest size done) to end after
    ``deadline`` is skipped with every step after it."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "size.json").write_text(json.dumps({"size": size}))
    results: list[StepResult] = []
    log(f"{pipeline} M={size:,}: writing the synthetic data")
    data = run_child(pipeline, "data", work, env, timeout=STEP_TIMEOUT_S)
    if "error" in data:
        return [StepResult(pipeline, s, size, status="error", note=f"data: {data['error']}")
                for s in PIPELINES[pipeline]]
    log(f"{pipeline} M={size:,}: data written in {data['seconds']:.0f} s ({fmt_bytes(dir_bytes(work))})")
    stopped = ""
    for step in PIPELINES[pipeline]:
        if stopped:
            results.append(StepResult(pipeline, step, size, status="skipped", note=stopped))
            continue
        done = [r for r in earlier if r.step == step and r.status == "ok"]
        if done:
            last = max(done, key=lambda r: r.size)
            projected = last.seconds * size / last.size + 30
            if time.time() + projected > deadline:
                stopped = (f"not run: projected {projected:.0f} s (linear from M={last.size:,}) would pass the time "
                           "budget (--budget-min)")
                results.append(StepResult(pipeline, step, size, status="skipped", note=stopped))
                continue
        result = run_child(pipeline, step, work, env, timeout=max(60.0, min(STEP_TIMEOUT_S, deadline - time.time())))
        if "error" in result:
            log(f"{pipeline} M={size:,} {step}: ERROR {result['error'][-600:]}")
            stopped = f"not run: {step} failed"
            results.append(StepResult(pipeline, step, size, status="error", note=result["error"][-600:]))
            continue
        r = StepResult(pipeline, step, size, seconds=result["seconds"], peak_rss=result["peak_rss"],
                       rss_before=result["rss_before"], bytes_written=result["bytes_written"],
                       records=result["records"], info=result["info"])
        log(f"{pipeline} M={size:,} {step}: {r.seconds:.1f} s, peak RSS {fmt_bytes(r.peak_rss)} (+"
            f"{fmt_bytes(r.rss_growth)}), wrote {fmt_bytes(r.bytes_written)}")
        results.append(r)
    return results


# ---------------------------------------------------------------------------------------------------- analysis
def loglog_slope(sizes: list[float], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(size): 1.0 = linear. nan with fewer than two sizes."""
    import numpy as np

    if len(sizes) < 2:
        return float("nan")
    slope, _ = np.polyfit(np.log(np.asarray(sizes, float)), np.log(np.maximum(np.asarray(values, float), 1e-9)), 1)
    return float(slope)


@dataclass
class Verdict:
    pipeline: str
    step: str
    sizes: list[int]
    seconds: list[float]
    slope: float
    time_ok: bool | None
    rss: list[int]
    rss_ok: bool | None
    bytes_slope: float
    records_ok: bool | None
    growing_records: list[str]
    projection: dict


def judge(results: list[StepResult], pipeline: str, step: str) -> Verdict:
    """The three goals for one step over the sizes it ran at (None: fewer than two sizes, not judged)."""
    ok = sorted((r for r in results if r.pipeline == pipeline and r.step == step and r.status == "ok"),
                key=lambda r: r.size)
    sizes = [r.size for r in ok]
    seconds = [r.seconds for r in ok]
    rss = [r.peak_rss for r in ok]
    judged = len(ok) >= 2
    slope = loglog_slope(sizes, seconds)
    bytes_slope = loglog_slope(sizes, [max(r.bytes_written, 1) for r in ok])
    growing = []
    if judged:
        first, last = ok[0].records, ok[-1].records
        for name in sorted(first):
            if name in DATA_RECORDS:
                continue
            low, high = first[name], last.get(name, 0)
            if high > max(low, 0) * RECORD_RATIO and high - low > 0:
                growing.append(f"{name} {low} -> {high}")
    rss_ok = None
    if judged and step not in RSS_EXEMPT:
        rss_ok = ok[-1].rss_growth <= RSS_FLAT_RATIO * ok[0].rss_growth + RSS_FLAT_SLACK
    return Verdict(pipeline=pipeline, step=step, sizes=sizes, seconds=seconds, slope=slope,
                   time_ok=slope <= MAX_SLOPE if judged else None, rss=rss, rss_ok=rss_ok, bytes_slope=bytes_slope,
                   records_ok=not growing if judged else None, growing_records=growing,
                   projection=project(ok, step=step, slope=slope))


def project(ok: list[StepResult], *, step: str, slope: float) -> dict:
    """The step at CC12M (12M samples, 768-d embeddings) along its measured log-log line (at least linear); memory:
    the smallest size's peak plus the step's RSS growth per sample (between the smallest and largest size) times
    the samples added. k-means' seconds and memory and the export's bytes scale with D too (768 / the measured D)."""
    if len(ok) < 2:
        return {}
    last = ok[-1]
    scale = (CC12M / last.size)
    # Every step touches every sample, so a slope below 1 only says that fixed costs (imports, building the model)
    # still weigh at the measured sizes: the projection grows at least linearly.
    seconds = last.seconds * scale ** max(slope, 1.0)
    per_sample = max(0, last.rss_growth - ok[0].rss_growth) / (last.size - ok[0].size)
    dim = next((r.info.get("dim") for r in ok if r.info.get("dim")), None)
    d_factor = CC12M_DIM / dim if dim else 1.0
    # k-means' time and memory go with D (distances, the (M, D) matrix); the export's bytes are the (M, D) float16.
    seconds *= d_factor if step == "kmeans" else 1.0
    rss_factor = d_factor if step == "kmeans" else 1.0
    bytes_factor = d_factor if step == "export" else 1.0
    return {"seconds": seconds, "rss": ok[0].peak_rss + per_sample * (CC12M - ok[0].size) * rss_factor,
            "rss_per_sample": per_sample, "bytes": last.bytes_written * scale * bytes_factor, "dim": dim}


# ---------------------------------------------------------------------------------------------------- report
def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 3600:.1f} h" if value >= 3 * 3600 else f"{value / 60:.1f} min" if value >= 300 else \
        f"{value:.1f} s"


def verdict_text(ok: bool | None) -> str:
    return "-" if ok is None else "PASS" if ok else "FAIL"


RECORD_COLUMNS = ("mlflow_params", "mlflow_tags", "mlflow_metric_points", "mlflow_dataset_inputs",
                  "mlflow_artifact_files", "prefect_artifacts", "prefect_logs", "prefect_result_bytes")


def report_markdown(results: list[StepResult], verdicts: list[Verdict], *, started: str, minutes: float,
                    machine: str, sizes: list[int]) -> str:
    lines = [MARK_BEGIN, f"### `make bench-scale`: data path at M = {', '.join(f'{s:,}' for s in sizes)}, {started} "
                         f"({minutes:.0f} min)", "",
             f"Machine: {machine}. Not part of `make bench` (its wall time: {minutes:.0f} min). bench/scale.py says "
             "how each figure is measured; each step ran in its own process. Goals (PASS / FAIL per step; `-`: "
             "measured at fewer than two sizes):", ""]
    lines += [f"- {goal}" for goal in GOALS]
    lines += ["", "| pipeline | step | M | seconds | peak RSS (growth in the step) | bytes written | MLflow: params / "
              "tags / metric points / inputs / artifact files | Prefect: artifacts / logs / result bytes |",
              "|---|---|---:|---:|---|---:|---|---|"]
    for r in sorted(results, key=lambda r: (r.pipeline, list(PIPELINES[r.pipeline]).index(r.step), r.size)):
        if r.status != "ok":
            lines.append(f"| {r.pipeline} | {r.step} | {r.size:,} | {r.status} | {r.note[:160]} | - | - | - |")
            continue
        c = {name: r.records.get(name, "-") for name in RECORD_COLUMNS}
        artifact_bytes = r.records.get("mlflow_artifact_bytes")
        lines.append(
            f"| {r.pipeline} | {r.step} | {r.size:,} | {fmt_s(r.seconds)} | {fmt_bytes(r.peak_rss)} "
            f"(+{fmt_bytes(r.rss_growth)}) | {fmt_bytes(r.bytes_written)} | {c['mlflow_params']} / {c['mlflow_tags']}"
            f" / {c['mlflow_metric_points']} / {c['mlflow_dataset_inputs']} / {c['mlflow_artifact_files']} "
            f"({fmt_bytes(artifact_bytes)}) | {c['prefect_artifacts']} / {c['prefect_logs']} / "
            f"{c['prefect_result_bytes']} |")
    lines += ["", "| pipeline | step | slope (time) | time | peak RSS | records | slope (bytes) | at CC12M (12M, "
              "768-d), projected |", "|---|---|---:|---|---|---|---:|---|"]
    for v in verdicts:
        p = v.projection
        projection = (f"{fmt_s(p['seconds'])}, peak RSS {fmt_bytes(p['rss'])}, writes {fmt_bytes(p['bytes'])}"
                      if p else "-")
        records = verdict_text(v.records_ok) + (f" ({'; '.join(v.growing_records)})" if v.growing_records else "")
        slope = "-" if math.isnan(v.slope) else f"{v.slope:.2f}"
        bslope = "-" if math.isnan(v.bytes_slope) else f"{v.bytes_slope:.2f}"
        rss = verdict_text(v.rss_ok) if v.step not in RSS_EXEMPT else "exempt"
        lines.append(f"| {v.pipeline} | {v.step} | {slope} | {verdict_text(v.time_ok)} | {rss} | {records} | "
                     f"{bslope} | {projection} |")
    lines += ["", "Projection: seconds along the step's measured log-log line from the largest size, at least linear "
              "(a slope below 1 means fixed costs still weigh at the measured sizes); peak RSS = the "
              "smallest size's + its growth per sample times 12M; k-means' and the export's embedding-sized figures "
              "times 768 / the measured D. On this shared 2-core machine absolute seconds are context only.",
              MARK_END]
    return "\n".join(lines) + "\n"


def write_report(markdown: str, path: Path) -> None:
    """Replace the bench-scale section of ``path`` (between its markers), or append one."""
    replace_section(path, markdown, begin=MARK_BEGIN, end=MARK_END)


def print_summary(verdicts: list[Verdict]) -> None:
    print(f"{'pipeline':<8} {'step':<14} {'sizes':<28} {'slope':>6} {'time':>5} {'rss':>6} {'records':>8}")
    for v in verdicts:
        print(f"{v.pipeline:<8} {v.step:<14} {','.join(str(s) for s in v.sizes):<28} "
              f"{v.slope:>6.2f} {verdict_text(v.time_ok):>5} "
              f"{'exempt' if v.step in RSS_EXEMPT else verdict_text(v.rss_ok):>6} {verdict_text(v.records_ok):>8}"
              + (f"  growing: {'; '.join(v.growing_records)}" if v.growing_records else ""))


def write_slopes(verdicts: list[Verdict], path: Path, *, started: str, machine: str) -> int:
    """The time slopes measured at two sizes or more into the slopes file ``mclpipe plan`` reads
    (``planning.model.BENCH_SCALE_SLOPES``), merged over what it held; returns how many were written."""
    from planning.model import save_slopes
    slopes = {(v.pipeline, PLAN_CATEGORIES[v.step]): v.slope for v in verdicts
              if v.time_ok is not None and not math.isnan(v.slope)}
    if slopes:
        sizes = sorted({size for v in verdicts for size in v.sizes})
        save_slopes(slopes, path=path, written_by=f"make bench-scale (bench/scale.py --slopes), {started}, M = "
                    f"{', '.join(f'{s:,}' for s in sizes)}; {machine}; BENCHMARKS.md")
    return len(slopes)


def finish(results: list[StepResult], *, pipelines: list[str], sizes: list[int], started: str, minutes: float,
           machine: str, report: Path | None, json_path: Path | None, slopes: Path | None = None) -> int:
    """Judge, print, save and report; exit status 1 when a step failed to run or a goal failed."""
    verdicts = [judge(results, p, s) for p in pipelines for s in PIPELINES[p]]
    if slopes:
        print(f"wrote {write_slopes(verdicts, slopes, started=started, machine=machine)} slopes to {slopes}")
    print_summary(verdicts)
    print(f"{minutes:.1f} min in all")
    if json_path:
        json_path.write_text(json.dumps({"results": [asdict(r) for r in results], "pipelines": pipelines,
                                         "sizes": sizes, "minutes": minutes, "started": started, "machine": machine},
                                        indent=1, default=float))
    if report:
        write_report(report_markdown(results, verdicts, started=started, minutes=minutes, machine=machine,
                                     sizes=sizes), report)
        print(f"wrote {report}")
    failed = any(v is False for x in verdicts for v in (x.time_ok, x.rss_ok, x.records_ok))
    return 1 if failed or any(r.status == "error" for r in results) else 0


def report_from_json(path: Path, *, report: Path | None, slopes: Path | None = None) -> int:
    saved = json.loads(Path(path).read_text())
    results = [StepResult(**r) for r in saved["results"]]
    pipelines = saved.get("pipelines") or sorted({r.pipeline for r in results}, key=list(PIPELINES).index)
    sizes = saved.get("sizes") or sorted({r.size for r in results})
    return finish(results, pipelines=pipelines, sizes=sizes, started=saved["started"], minutes=saved["minutes"],
                  machine=saved["machine"], report=report, json_path=None, slopes=slopes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make bench-scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="comma-separated sample counts")
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help="comma-separated, of clip,image")
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the generated data and outputs")
    parser.add_argument("--report", type=Path, default=None, help="write the section into this file "
                        "(make bench-scale: BENCHMARKS.md)")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--slopes", type=Path, default=None, help="merge the measured time slopes into this file "
                        "(make bench-scale: planning/bench_scale_slopes.json, what mclpipe plan grows along)")
    parser.add_argument("--budget-min", type=float, default=24 * 60, help="skip a step projected to end later")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--from-json", type=Path, default=None,
                        help="judge and report the measurements a --json run saved, without measuring")
    args = parser.parse_args(argv)
    if args.from_json:
        return report_from_json(args.from_json, report=args.report, slopes=args.slopes)
    if args.child:
        pipeline, step = args.child.split(":")
        return child_main(pipeline, step, args.work, args.out)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    unknown = sorted(set(pipelines) - set(PIPELINES))
    if unknown:
        parser.error(f"unknown pipelines {unknown}: use {', '.join(PIPELINES)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    begin = time.time()
    deadline = begin + args.budget_min * 60
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect-home"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    server, env = start_prefect_server(work)
    results: list[StepResult] = []
    try:
        for pipeline in pipelines:
            for size in sizes:
                run_dir = work / f"{pipeline}-{size}"
                results += run_pipeline(pipeline, size, run_dir, env, deadline=deadline, earlier=results)
                if not args.keep:
                    shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        server.stop()
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    minutes = (time.time() - begin) / 60
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
               f"{os.getloadavg()[0]:.1f} at the end")
    return finish(results, pipelines=pipelines, sizes=sizes, started=started, minutes=minutes, machine=machine,
                  report=args.report, json_path=args.json, slopes=args.slopes)


if __name__ == "__main__":
    sys.exit(main())
