"""A few batches of each kind of step, measured on the user's own data and device: what ``mclpipe plan`` scales
(:mod:`planning.model`).

The steps are the pipeline's own library calls (the modality's ``prepare_data``, ``train``, ``export``,
``evaluate``, ...; ``contrastive.mcl.steps``' k-means and pseudo-labels), run in this process without Prefect or
MLflow, in a temporary directory:

- prepare: the real preparation, then again: a run after the plan finds the data prepared, and that second call's
  time is the row's (the first one's is in its note);
- train: ``TRAIN_STEPS`` optimizer steps (``train.max_steps_per_epoch``), each step timed by a training callback:
  the mean step of the second half is the per-step rate (:func:`steady_step_seconds`: the first steps take batches
  the loader's workers prefetched while the model started, so they time the model alone; on trifeature_quick 8
  steps' median said 0.12 s a step and the run took 0.75 s), the rest of the call the fixed cost; twice: stage 0
  as a run's first training (cold: imports, kernels, workers), the last stage's config as its later ones;
- export: the real export of that model, stopped after ``EXPORT_ROWS`` rows (its progress callback), or whole on
  data smaller than that; seconds a row after the first batch, the rest fixed;
- k-means and pseudo-labels: the real steps as their tasks call them (over the modality's sample scope, aligned by
  id, with AMI against its attributes and the cluster-size plot) on the calibration's export when it is whole, else
  on synthetic exports of ``KMEANS_ROWS`` random rows of the export's width, two sizes, so the per-row cost is the
  slope between them and the files each step opens and writes are its fixed cost; each timed warm, apart from a
  first call that pays the imports and a first call at the larger size that touches new memory, as a run's first
  clustering does (``cluster_cold``, ``pseudo_labels_cold``); reading the scope (``scope``, per training sample) is
  timed apart, as both tasks read it;
- re-shard (CLIP): the real re-shard of the first training shard (its samples dealt over K groups), per byte;
- evaluations, encodings, diagnostics, the soup and the final step: once each, on one member.

The result is cached per machine and config hash (``planning.model.calibration_path``); ``--recalibrate`` measures again.

What a run pays besides its steps' computation is measured too, once per machine, by the flows' run probe
(``flows.run_costs.measure_run_costs``, cached in ``planning.model.run_costs_path``; ``--recalibrate`` measures it
again): it runs the flows' own machinery, so it lives with them, above this package. The steps above run in this process, without
Prefect or MLflow; a run wraps each of them in a Prefect task run that records to MLflow, and starts and ends with
its imports, a temporary Prefect server, its MLflow store and bookkeeping task runs: on the tiny presets most of a
run's wall time (issue 46: steps of 0.1 s took 1-20 s as task runs; a 5 s run of steps took 18 s from the
command's start). The run probe (``flows.run_probe``) measures these with the run's own code in a process of its
own (the CLI's imports, ``starting_local_server``, ``Tracker``, a Prefect flow of task runs that record like a step)
rather than taking them from constants or from a user's earlier runs: it is the same machinery on the same machine
under its present load, it exists before the user's first run, and it does not mistake a step's computation for its
overhead (a per-step learning from earlier runs would fold in whatever else those runs shared the machine with).
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from planning.model import Calibration, Rate, calibration_path
from planning.probes import Measured, dir_bytes, machine_id, measured

TRAIN_STEPS = 16
EXPORT_ROWS = 16_384
#: Bounds of the larger synthetic export k-means and pseudo-labels are timed on when the calibration's export is
#: partial (:func:`kmeans_rows`), the bytes of float32 rows it aims at, and the calls timed at each size: at 32-d,
#: 20k and 100k rows took the same time within the calls' noise (a per-row cost of 0 and k-means at 1M projected at
#: half what it took), and single calls of 0.05-0.08 s varied by +-30 ms (2026-11-28).
KMEANS_ROWS = (100_000, 500_000)
KMEANS_BYTES = 64 << 20
KMEANS_REPEATS = 3


class _Enough(Exception):
    """Raised by the export's progress callback once enough rows were timed."""


class _StepTimes:
    """Training callback: the time of every optimizer step (``log_every_steps: 1``)."""

    def __init__(self):
        self.stamps: list[float] = []

    def on_step(self, *, step: int, epoch: int, metrics: dict) -> None:
        self.stamps.append(time.perf_counter())

    def on_epoch_end(self, *, epoch: int, metrics: dict) -> None:
        pass

    def on_checkpoint(self, *, path, step: int) -> None:
        pass


def _short_training(config, stage_index: int = 0):
    """A stage's config for ``TRAIN_STEPS`` steps, every step logged, no checkpoint in between."""
    stage = config.for_stage(stage_index)
    train = stage.train.model_copy(update={"epochs": 1, "max_steps_per_epoch": TRAIN_STEPS, "log_every_steps": 1,
                                           "checkpoint_every_steps": 10 ** 9})
    return stage.model_copy(update={"train": train})


def resolved_device(config) -> str:
    """The device the stages run on ("auto": a GPU when there is one), as the engine picks it."""
    from contrastive.engine.distributed import device_for
    device = device_for(name=config.device)
    return "cpu" if device.type == "cpu" else f"{device.type} ({_gpu_name(device)})"


def _gpu_name(device) -> str:
    import torch
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def calibrate(config, *, log: Callable[[str], None] = print) -> Calibration:
    """Measure every kind of step ``config``'s pipeline has (module docstring) and cache the result."""
    from contrastive.modalities.registry import modality_for
    modality = modality_for(config.pipeline)
    device = resolved_device(config)
    began = time.perf_counter()
    rates: dict[str, Rate] = {}
    with tempfile.TemporaryDirectory(prefix="mclpipe-plan-") as tmp:
        work = Path(tmp)
        log("calibrating: preparing the data")
        with measured(device) as first:
            data = modality.prepare_data(config, log=lambda _: None)
        with measured(device) as again:  # what a run after this plan spends: the data is prepared now
            modality.prepare_data(config, log=lambda _: None)
        rates["prepare"] = Rate(fixed_s=again.seconds, per_unit_s=0.0, units=1, peak_rss=first.peak_rss,
                                disk=dir_bytes(data["dir"]), note=f"prepared in {first.seconds:.1f} s, "
                                                                  f"found prepared in {again.seconds:.1f} s")
        log(f"calibrating: {TRAIN_STEPS} training steps on {device}")
        model_path = _train(config, modality, data=data, work=work, rates=rates, device=device)
        log("calibrating: export")
        export = _export(config, modality, model_path=model_path, data=data, work=work, rates=rates, device=device)
        if config.mcl.num_stages > 1:
            log("calibrating: k-means and pseudo-labels")
            _clusters(config, modality, data=data, export=export, work=work, rates=rates, device=device)
            if modality.regroups:
                _regroup_rate(config, data, work=work, rates=rates)
        log("calibrating: evaluation")
        _evaluations(config, modality, model_path=model_path, export=export, data=data, work=work, rates=rates,
                     device=device)
    calibration = Calibration(
        machine=machine_id(), device=device, measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        config_hash=config.config_hash(), seconds=time.perf_counter() - began, num_train=int(data["num_train"]),
        num_exported=export["rows_total"], dim=export["dim"], data_bytes=_data_bytes(data),
        id_bytes=export.get("id_bytes"), rates=rates)
    path = calibration_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(calibration.to_json())
    return calibration


def _data_bytes(data: dict) -> int | None:
    """Bytes of the training shards (what a re-shard copies), when they are local files."""
    urls = data.get("train_urls")
    if not urls:
        return None
    paths = [Path(u.removeprefix("file:")) for u in urls]
    return sum(p.stat().st_size for p in paths) if all(p.is_file() for p in paths) else None


def _train(config, modality, *, data: dict, work: Path, rates: dict, device: str) -> str:
    """Two trainings of TRAIN_STEPS steps: stage 0 first, which pays what a process pays once (imports, kernels,
    worker start-up: ``train_cold``, the first training of a run), then the last stage's config (on random
    batches) for what every later stage pays (``train``). The later stages' own config, not stage 0's again: a
    stage override of the batch size changes a step's cost by less than the batch ratio (trifeature_quick's stage 1
    at batch 32: 0.2 s a step against stage 0's 0.18 s at 64, 2026-11-28), so the ratio is applied only to a
    config the calibration did not train. Returns stage 0's model (what the export and evaluations use)."""
    model_path = None
    for name, index in (("train_cold", 0), ("train", config.mcl.num_stages - 1)):
        stage = _short_training(config, index)
        out_dir = work / name
        spec = modality.train_spec(stage, stage=index, seed=config.seed, out_dir=str(out_dir), data=data,
                                   batches_path=None, init_model_path=None)
        timer = _StepTimes()
        with measured(device) as m:
            summary = modality.train(spec, callbacks=[timer])
        model_path = model_path or summary["model_path"]
        per_step = steady_step_seconds(timer.stamps, total=m.seconds)
        steps = max(len(timer.stamps), 1)
        rates[name] = Rate(fixed_s=max(0.0, m.seconds - steps * per_step), per_unit_s=per_step, units=steps,
                           peak_rss=m.peak_rss, disk=dir_bytes(out_dir), gpu_mem=m.gpu_mem,
                           batch=stage.global_batch_size(index))
    return model_path


def steady_step_seconds(stamps: list[float], *, total: float) -> float:
    """Seconds an optimizer step takes once the loader's prefetched batches are used up: the mean gap between the
    step stamps of the second half (from the middle stamp to the last); one stamp or none: the whole call."""
    if len(stamps) < 2:
        return total / max(len(stamps), 1)
    middle = len(stamps) // 2
    return (stamps[-1] - stamps[middle]) / (len(stamps) - 1 - middle)


def _export(config, modality, *, model_path: str, data: dict, work: Path, rates: dict, device: str) -> dict:
    """The real export, stopped after EXPORT_ROWS rows where the modality's export reports its progress
    (``Modality.export_reports_progress``), else whole: {"rows_total" (None when stopped), "dim", "dir", ...}."""
    out_dir = work / "export" / "embeddings"
    kwargs = modality.export_kwargs(config.for_stage(0), model_path=model_path, data=data, out_dir=str(out_dir))
    timer = _ExportTimer()
    whole, result = True, {}
    with measured(device) as m:
        try:
            result = modality.export(**kwargs, **({"progress": timer} if modality.export_reports_progress else {}))
        except _Enough:
            whole = False
    rows = timer.rows or int(_export_summary(out_dir, result).get("num_samples") or 0)
    per_row = timer.per_row(total=m.seconds, rows=rows)
    rates["export"] = Rate(fixed_s=max(0.0, m.seconds - rows * per_row), per_unit_s=per_row, units=rows,
                           peak_rss=m.peak_rss, gpu_mem=m.gpu_mem,
                           note="whole export" if whole else f"first {rows:,} rows")
    if not whole:
        return {"rows_total": None, "dim": timer.dim or None, "dir": None}
    dim = int(_export_summary(out_dir, result).get("dim") or 0) or None
    out = {"rows_total": rows, "dim": dim, "dir": str(out_dir)}
    if dim and rows:
        out["id_bytes"] = max(0.0, (dir_bytes(out_dir) - rows * dim * 2) / rows)
    return out


class _ExportTimer:
    """The export's ``progress(rows, dim)``: stamps each batch written (time, rows so far), keeps D, and stops the
    export (``_Enough``) once ``EXPORT_ROWS`` rows were timed."""

    def __init__(self):
        self.stamps: list[tuple[float, int]] = []
        self.dim = 0

    @property
    def rows(self) -> int:
        return self.stamps[-1][1] if self.stamps else 0

    def __call__(self, rows: int, dim: int) -> None:
        self.dim = dim or self.dim
        self.stamps.append((time.perf_counter(), self.rows + rows))
        if self.rows >= EXPORT_ROWS:
            raise _Enough

    def per_row(self, *, total: float, rows: int) -> float:
        """Seconds a row after the first batch (its model load and warm-up are the fixed part); one batch or none
        timed: the whole call over its rows."""
        if len(self.stamps) >= 2:
            (first, first_rows), (last, last_rows) = self.stamps[0], self.stamps[-1]
            return (last - first) / max(last_rows - first_rows, 1)
        return total / max(rows, 1)


def _export_summary(out_dir: Path, result: dict) -> dict:
    import json
    path = out_dir / "export_summary.json"
    return json.loads(path.read_text()) if path.is_file() else result


def _clusters(config, modality, *, data: dict, export: dict, work: Path, rates: dict, device: str) -> None:
    """k-means and pseudo-labels as their tasks call them: over the samples the modality clusters (its
    ``sample_scope``: the training split, aligned by id, and its attributes, each scored by AMI), the cluster-size
    plot included. The first call of each is a run's first (it imports faiss, scikit-learn and matplotlib:
    ``cluster_cold`` / ``pseudo_labels_cold``), the rates are warm calls after it."""
    from contrastive.mcl import steps
    spec = config.mcl.kmeans_spec(0, seed=config.seed)
    scope_ids, attributes = _scope(modality, data, rates=rates, device=device)
    if export["dir"] is not None:  # the real steps on the calibration's whole export, cold then warm
        rows, embeddings_dir = export["rows_total"], Path(export["dir"])
        timed = {"cluster": [], "pseudo_labels": []}
        for call in ("cold", "warm"):
            for kind, seconds, peak in _cluster_steps(steps, config, spec=spec, embeddings_dir=embeddings_dir,
                                                      out_dir=work / f"clusters-{call}", ids=scope_ids,
                                                      attributes=attributes, device=device):
                timed[kind].append((seconds, peak))
        for kind, ((cold, _), (warm, peak)) in timed.items():
            rates[kind] = Rate(fixed_s=0.0, per_unit_s=warm / rows, units=rows, peak_rss=peak,
                               note="the real step on the whole export")
            rates[f"{kind}_cold"] = Rate(fixed_s=max(0.0, cold - warm), per_unit_s=warm / rows, units=rows,
                                         peak_rss=peak, note="the real step on the whole export, a run's first")
        return
    if not export["dim"]:
        return
    # A partial export: the real steps on synthetic exports of two sizes, so a per-row cost is told apart from the
    # step's fixed one (opening and writing its files, the cluster-size plot, k-means' training sample).
    sizes = kmeans_rows(export["dim"])
    kept = data["num_train"] / (data["num_train"] + data["num_test"]) if data.get("num_test") else 1.0
    exports = {rows: _synthetic_export(work / f"synthetic-export-{rows}", rows=rows, dim=export["dim"],
                                       scope_ids=scope_ids, kept=kept, attributes=attributes) for rows in sizes}
    # cold: the process's first call (imports); then the smaller size warm; then the larger one, whose first call
    # also touches memory this process never held (page faults of the larger arrays: at 1M x 256, 1.2-2 s of a
    # first k-means that took 1.5-1.8 s warm), then warm.
    small, large = sizes
    calls = [("cold", small), *[("warm", small)] * KMEANS_REPEATS,
             ("first", large), *[("warm", large)] * KMEANS_REPEATS]
    times: dict[tuple[str, str, int], list[tuple[float, int | None]]] = {}
    for number, (call, rows) in enumerate(calls):
        embeddings_dir, ids, labels = exports[rows]
        for kind, seconds, peak in _cluster_steps(steps, config, spec=spec, embeddings_dir=embeddings_dir,
                                                  out_dir=work / f"synthetic-clusters-{number}", ids=ids,
                                                  attributes=labels, device=device):
            times.setdefault((kind, call, rows), []).append((seconds, peak))
    for kind in ("cluster", "pseudo_labels"):
        warm = [(rows, *_median(times[(kind, "warm", rows)])) for rows in sizes]
        note = f"the real step on {small:,} and {large:,} random rows of width {export['dim']}, " \
               f"the median of {KMEANS_REPEATS} calls each"
        rates[kind] = two_point_rate(warm, note=note)
        imports = max(0.0, times[(kind, "cold", small)][0][0] - warm[0][1])
        first_touch = max(0.0, (times[(kind, "first", large)][0][0] - warm[1][1]) / (large - small))
        rates[f"{kind}_cold"] = Rate(**{**asdict(rates[kind]), "fixed_s": rates[kind].fixed_s + imports,
                                        "per_unit_s": rates[kind].per_unit_s + first_touch,
                                        "note": f"{note}; a run's first: + {imports:.2f} s (imports) + "
                                                f"{first_touch * 1e6:.2f} us a row (memory first touched)"})


def kmeans_rows(dim: int) -> tuple[int, int]:
    """The two sizes of the synthetic exports: the larger holds about ``KMEANS_BYTES`` of float32 rows (within
    ``KMEANS_ROWS``), so a narrow export's per-row cost (ids, a few bytes of vectors) still adds up to more than the
    calls' timing noise between the two; the smaller a fifth of it."""
    low, high = KMEANS_ROWS
    large = int(min(max(KMEANS_BYTES // (4 * max(dim, 1)), low), high))
    return large // 5, large


def _median(samples: list[tuple[float, int | None]]) -> tuple[float, int | None]:
    """(median seconds, largest peak RSS) of repeated calls."""
    return float(np.median([seconds for seconds, _ in samples])), max((p or 0 for _, p in samples), default=None)


def _scope(modality, data: dict, *, rates: dict, device: str) -> tuple[np.ndarray | None, dict | None]:
    """The modality's ``sample_scope`` of the calibration's data (what both steps' tasks read first: the training
    ids and attribute labels of the dataset), timed per training sample (``scope``)."""
    with measured(device) as m:
        ids, attributes = modality.sample_scope(data)
    if ids is not None and len(ids):
        rates["scope"] = Rate(fixed_s=0.0, per_unit_s=m.seconds / len(ids), units=len(ids), peak_rss=m.peak_rss,
                              note="the training split's ids and labels read from the prepared data")
    return ids, attributes


def _synthetic_export(directory: Path, *, rows: int, dim: int, scope_ids: np.ndarray | None, kept: float = 1.0,
                      attributes: dict | None = None) -> tuple[Path, np.ndarray | None, dict | None]:
    """An export of ``rows`` random rows: (its directory, the scope's ids, the scope's labels). Without a scope
    (CLIP clusters every exported sample): short made-up ids and no scope. With one (``scope_ids``, the real
    training split's ids): ids made from the real ones (``id`` then ``id~1``, ``id~2``, ... once they run out), so
    the tasks' alignment by id sorts and compares strings of the user's own length and order; the scope the
    ``kept`` share of them in the export's order (a training split within an export of every split), and labels
    drawn from each attribute's own values (AMI costs what the number of values makes it)."""
    from contrastive.embeddings import save_embeddings
    rng = np.random.default_rng(rows)
    base = [str(i) for i in scope_ids] if scope_ids is not None else []
    if base:
        ids = np.array([base[i] if i < len(base) else f"{base[i % len(base)]}~{i // len(base)}"
                        for i in range(rows)])
    else:
        ids = np.array([f"s{i:09d}" for i in range(rows)])
    save_embeddings(embeddings=rng.standard_normal((rows, dim), dtype=np.float32), ids=ids, directory=directory)
    if not base:
        return directory, None, None
    position = np.arange(rows) * kept
    scope = ids[np.floor(position + kept) > np.floor(position)].astype(scope_ids.dtype)  # spread evenly
    labels = {name: rng.choice(np.unique(values), size=scope.size) for name, values in (attributes or {}).items()
              if len(values)}
    return directory, scope, labels


def _cluster_steps(steps, config, *, spec, embeddings_dir: Path, out_dir: Path, ids, attributes,
                   device: str) -> list[tuple[str, float, int | None]]:
    """k-means (with its plot) then the pseudo-labels of its clusters, each timed: [(kind, seconds, peak RSS)]."""
    clusters = out_dir / "clusters"
    with measured(device) as k:
        _cluster_and_plot(steps, embeddings_dir=embeddings_dir, out_dir=clusters, spec=spec, ids=ids,
                          attributes=attributes)
    with measured(device) as p:
        steps.build_pseudo_labels(cluster_dirs=[clusters], embeddings_dirs=[embeddings_dir],
                                  out_path=out_dir / "pseudo" / "pseudo_labels.npz",
                                  min_group_size=config.global_batch_size(1),
                                  small_group_policy=config.mcl.small_group_policy, ids=ids)
    return [("cluster", k.seconds, k.peak_rss), ("pseudo_labels", p.seconds, p.peak_rss)]


def _cluster_and_plot(steps, *, embeddings_dir: Path, out_dir: Path, spec, ids=None, attributes=None) -> None:
    """The clustering step as a run makes it: k-means and its records, and the cluster-size plot the task draws
    (``tasks.steps.finish_cluster_record``; a second or so of matplotlib that k-means of a tiny model does not)."""
    from contrastive.evaluate import plot_cluster_sizes
    summary = steps.cluster_stage(embeddings_dir=embeddings_dir, out_dir=out_dir, kmeans_spec=spec,
                                  earlier_cluster_dirs=[], ids=ids, attributes=attributes)
    plot_cluster_sizes(sizes_by_stage={"stage 0": summary["sizes"]}, path=out_dir / "cluster_sizes.png")


def two_point_rate(points: list[tuple[int, float, int | None]], *, note: str) -> Rate:
    """fixed + per-unit from a step timed at two sizes ((units, seconds, peak RSS) each): the per-unit cost is the
    slope between them (never below 0: timing noise on a step of milliseconds), the rest of the larger one fixed."""
    (n1, t1, _), (n2, t2, peak) = points[0], points[-1]
    per_unit = max(0.0, (t2 - t1) / (n2 - n1))
    return Rate(fixed_s=max(0.0, t2 - per_unit * n2), per_unit_s=per_unit, units=n2, peak_rss=peak, note=note)


def _regroup_rate(config, data: dict, *, work: Path, rates: dict) -> None:
    """Seconds a byte of the re-shard: the real step (``reshard_by_group``: tar members read, spooled to a staging
    file, shuffled and appended to their group files) over the first training shard, its samples dealt over the
    config's K groups."""
    from contrastive.modalities.image_text.grouped import reshard_by_group
    urls = data.get("train_urls") or []
    source = Path(urls[0].removeprefix("file:")) if urls else None
    if source is None or not source.is_file():
        return
    keys = shard_keys(source)
    groups = np.arange(len(keys)) % max(config.mcl.clusters, 1)
    with measured("cpu") as m:
        reshard_by_group(urls=[str(source)], keys=keys, groups=groups, out_dir=work / "regroup",
                         slots=config.distributed.slots(), seed=config.seed, spool_bytes=config.mcl.spool_mb << 20)
    size = source.stat().st_size
    rates["regroup"] = Rate(fixed_s=0.0, per_unit_s=m.seconds / max(size, 1), units=size, peak_rss=m.peak_rss,
                            note=f"the real re-shard of the first shard ({len(keys):,} samples)")


def shard_keys(path: Path) -> np.ndarray:
    """The ``__key__`` of every sample of a webdataset tar, in order, as the re-shard reads them."""
    from contrastive.modalities.image_text.data import iter_raw_samples
    return np.array([sample["__key__"] for sample in iter_raw_samples([str(path)])])


def _evaluations(config, modality, *, model_path: str, export: dict, data: dict, work: Path, rates: dict,
                 device: str) -> None:
    from contrastive.modalities.base import Member
    member = None
    if modality.encodes_for_eval:
        kwargs = modality.encode_kwargs(config, model_path=model_path, data=data, out_dir=str(work / "encode"))
        with measured(device) as m:
            features = modality.encode_for_eval(**kwargs)
        rates["encode"] = _once(m, work / "encode")
        member = Member(model_path=model_path, features=features)
    elif export["dir"] is not None:
        member = Member(model_path=model_path, embeddings_dir=export["dir"])
    if member is not None:
        with measured(device) as m:
            modality.evaluate(config, members=[member], data=data, out_dir=str(work / "eval"))
        rates["eval"] = _once(m, work / "eval")
    if modality.diagnoses and export["dir"] is not None:
        with measured(device) as m:
            modality.diagnose(config, stage=0, model_path=model_path, embeddings_dir=export["dir"], clusters_dir=None,
                              data=data, out_dir=str(work / "diagnose"), title="calibration")
        rates["diagnose"] = _once(m, work / "diagnose")
    if config.mcl.num_stages > 1 and modality.combines_models(config):
        with measured(device) as m:
            modality.combine_models(model_paths=[model_path, model_path], out_path=str(work / "soup" / "model.pt"))
        rates["soup"] = Rate(fixed_s=0.0, per_unit_s=m.seconds / 2, units=2, peak_rss=m.peak_rss,
                             disk=dir_bytes(work / "soup"))
    if modality.has_final_step(config):
        with measured(device) as m:
            modality.final_metrics(config, model_paths=[model_path], data=data, out_dir=str(work / "final"))
        rates[modality.final_name] = _once(m, work / "final")


def _once(m: Measured, out_dir: Path) -> Rate:
    """A step measured once on one member: its seconds a member (evaluations of a concatenation read each)."""
    return Rate(fixed_s=0.0, per_unit_s=m.seconds, units=1, peak_rss=m.peak_rss, disk=dir_bytes(out_dir),
                gpu_mem=m.gpu_mem)
