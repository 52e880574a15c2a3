"""Whether this machine can hold a plan (the check ``mclpipe run`` makes before its first step): closed forms, a
cached calibration and cheap probes (free disk, available memory), the capacity rule and shards against data slots;
each finding one line naming the fix. Costs well under a second."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contrastive.errors import ConfigError
from planning.model import TIGHT, DataSize, Plan, kmeans_matrices
from planning.probes import available_memory, free_bytes
from planning.report import human_bytes

class InfeasiblePlan(ConfigError):
    """This machine cannot hold the run (disk, memory, the capacity rule, shards): one line naming the fix."""


@dataclass
class Finding:
    level: str  # "error" | "warning"
    message: str


def feasibility(config, plan: Plan) -> list[Finding]:
    """What stops this plan on this machine, from closed forms and cheap probes (free disk, free memory, the
    capacity rule, shards against data slots): errors first, each one line naming the fix."""
    findings: list[Finding] = []
    findings += _disk_findings(config, plan)
    findings += _memory_findings(config, plan)
    findings += _capacity_findings(config, plan.size)
    findings += _shard_findings(config)
    return sorted(findings, key=lambda f: f.level != "error")


def _disk_findings(config, plan: Plan) -> list[Finding]:
    output = sum(r.disk or 0 for r in plan.rows if r.what != "prepare")
    cache = sum(r.disk or 0 for r in plan.rows if r.what == "prepare")
    places = {"output_dir": (Path(config.output_dir), output), "data.cache_dir": (Path(config.data.cache_dir), cache)}
    probes = {key: free_bytes(path) for key, (path, _) in places.items()}
    out: list[Finding] = []
    if all(probes.values()) and probes["output_dir"][1] == probes["data.cache_dir"][1]:
        places = {"output_dir": (places["output_dir"][0], output + cache)}  # one filesystem holds both
    for key, (path, need) in places.items():
        probe = probes[key]
        if probe is None or not need:
            continue
        free = probe[0]
        biggest = max((r for r in plan.rows if r.disk), key=lambda r: r.disk)
        where = f"{key} {path.resolve()}"
        if need > free:
            out.append(Finding("error", f"this pipeline writes about {human_bytes(need)} under {where} (the largest: "
                                        f"{biggest.title}, {human_bytes(biggest.disk)}) and that disk has {human_bytes(free)} free: "
                                        f"point {key} at a disk with {human_bytes(need)} free (--set {key}=...) or free "
                                        f"space there; --force runs anyway"))
        elif need > TIGHT * free:
            out.append(Finding("warning", f"this pipeline writes about {human_bytes(need)} under {where}, which has "
                                          f"{human_bytes(free)} free: little room left for anything else"))
    return out


def _memory_findings(config, plan: Plan) -> list[Finding]:
    """The first step that needs more memory than is available (an error) and the first that needs most of it (a
    warning), errors first: every row is read, so a tight step early never hides a later one that cannot fit."""
    available = available_memory()
    if available is None:
        return []
    found: dict[str, Finding] = {}
    for row in plan.rows:
        if not row.peak_ram:
            continue
        if row.what == "cluster" and plan.size.num_exported and plan.size.dim:
            m, d = plan.size.num_exported, plan.size.dim
            what = f"k-means of {m:,} x {d}"
            fix = ("run it on a machine with more memory, or export fewer or narrower embeddings (a smaller "
                   "data set or model); --force runs anyway")
            if kmeans_matrices(config, row.stage or 0) == 2:
                fix = f"set mcl.kmeans_train_points_per_cluster (e.g. 1024: one matrix, not two), {fix}"
        else:
            what, fix = row.title, "run it on a machine with more memory; --force runs anyway"
        if row.peak_ram > available:
            found.setdefault("error", Finding("error", f"{what} needs ~{human_bytes(row.peak_ram)} of RAM and this machine "
                                                       f"has {human_bytes(available)} available: {fix}"))
        elif row.peak_ram > TIGHT * available:
            found.setdefault("warning", Finding("warning", f"{what} needs ~{human_bytes(row.peak_ram)} of RAM of the "
                                                           f"{human_bytes(available)} available: close to the limit"))
    return [found[level] for level in ("error", "warning") if level in found]


def _capacity_findings(config, size: DataSize) -> list[Finding]:
    """The existing K^N <= M / B rule (``StageClusteringConfig.check_capacity``) when M is known."""
    from contrastive.errors import MclpipeError
    if not size.num_train:
        return []
    batch_key = "train.global_batch_size" if getattr(config, "pipeline", "") == "clip" else "train.batch_size"
    for stage in range(config.mcl.num_stages):
        try:
            config.mcl.check_capacity(stage=stage, num_train=size.num_train,
                                      global_batch=config.global_batch_size(stage), batch_key=batch_key)
        except MclpipeError as exc:
            return [Finding("error", str(exc))]
    return []


def _shard_findings(config) -> list[Finding]:
    """CLIP: every data slot needs a shard to read; fewer shards than slots x decode workers leaves workers idle."""
    if getattr(config, "pipeline", "") != "clip" or config.data.shards is None:
        return []
    from contrastive.data.urls import expand_urls
    shards = len(expand_urls(config.data.shards, check_local=False))
    slots = config.distributed.slots()
    if shards < slots:
        return [Finding("error", f"data.shards gives {shards} shard(s) for {slots} data slots (one a training "
                                 f"process): every slot reads whole shards, so split the data into at least {slots} "
                                 "shards or set distributed.data_slots lower")]
    workers = config.data.decode_workers or 0
    if workers and shards < slots * workers:
        return [Finding("warning", f"{shards} shards for {slots} slots x {workers} decode workers: some workers "
                                   "will wait; more, smaller shards keep them busy")]
    return []

