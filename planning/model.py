"""The cost model of ``mclpipe plan``: what a pipeline will cost before it runs, one row per step.

Three inputs, joined here into one row per step:

- the steps, as the flow builds them (``flows.plan_steps.planned_steps``: the specs of the pipeline's own stage loop,
  the same the runner executes, so the list cannot drift from the pipeline);
- the data's size from the config and cheap probes (:func:`data_size`: sample counts the config states, shard
  statistics files, the embedding width the model config implies);
- a calibration (:mod:`planning.calibrate`): a few batches of each kind of step measured on the user's own data and
  device, cached per machine and config. Without one, only the closed forms below are filled in.

Closed forms, exact where they are used: k-means holds the (M, D) embeddings as float32 (M x D x 4 bytes); an
export writes M x D float16 plus the ids; the re-shard writes a copy of the training shards. Seconds are the
calibration's fixed cost plus its per-unit cost times the units of the step (optimizer steps, exported rows,
clustered rows), the per-unit part grown along the step's measured log-log slope from ``make bench-scale``
(:data:`BENCH_SCALE_SLOPES`, read from ``bench_scale_slopes.json``, never below linear).

Nothing here imports Prefect, MLflow, ``flows`` or ``tasks`` (``tests/unit/test_layers.py``): the planning package
sits above the library (``contrastive``) and the typed config (``pipeline_config``) and below the flows.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from planning.probes import machine_id

#: Where ``make bench-scale`` writes the log-log slopes of seconds against M it measured, per pipeline and step
#: category (``bench/scale.py --slopes``); committed, so a plan reads the latest measured ones.
SLOPES_FILE = Path(__file__).with_name("bench_scale_slopes.json")


def load_slopes(path: Path = SLOPES_FILE) -> dict[tuple[str, str], float]:
    """{(pipeline, category): slope} from the slopes file ({} when it is missing: every category grows linearly)."""
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text())
    return {(pipeline, category): float(slope) for pipeline, slopes in saved["slopes"].items()
            for category, slope in slopes.items()}


def save_slopes(slopes: dict[tuple[str, str], float], *, written_by: str, path: Path = SLOPES_FILE) -> None:
    """Merge ``slopes`` into the slopes file (a pipeline or step measured now replaces its old value; the others
    stay), with a line saying what measured them."""
    saved = json.loads(path.read_text()) if path.is_file() else {"slopes": {}}
    for (pipeline, category), slope in slopes.items():
        saved["slopes"].setdefault(pipeline, {})[category] = round(float(slope), 2)
    saved["written_by"] = written_by
    path.write_text(json.dumps({"written_by": saved["written_by"], "slopes": saved["slopes"]}, indent=1) + "\n")


#: log-log slopes of seconds against M measured by ``make bench-scale`` (BENCHMARKS.md), per step category and
#: pipeline; a calibration at n samples grows its per-unit cost by (M / n) ** (max(slope, 1) - 1) on top of linear:
#: every step touches every sample, so a slope under 1 only says fixed costs still weighed at the measured sizes
#: (bench/scale.py's projection makes the same choice).
BENCH_SCALE_SLOPES = load_slopes()
#: A plan is tight (a warning, not a refusal) when it needs more than this share of what is free.
TIGHT = 0.8
#: Bytes of one sample's id as an export or a clustering stores it when nothing measured says otherwise
#: (StringDType, a short key; docs/clip.md).
ID_BYTES = 16


def growth(pipeline: str, category: str) -> float:
    """The exponent a category's per-unit cost grows with M beyond linear (0: linear)."""
    return max(1.0, BENCH_SCALE_SLOPES.get((pipeline, category), 1.0)) - 1.0


# ---------------------------------------------------------------------------------------------------- the steps
@dataclass(frozen=True)
class PlannedStep:
    """One step of the pipeline as the runner builds it: ``what`` is the runner's step name (train, export, cluster,
    pseudo_labels, regroup, soup, hyper, eval.<name>, encode.<name>, diagnose.<name>; prepare for the flow's first
    task), ``title`` the name of its Prefect task run, ``kind`` mcl / control / pipeline (a step of the parent run),
    ``members`` the representations an evaluation concatenates (or a soup averages)."""
    what: str
    title: str
    stage: int | None = None
    kind: str = "pipeline"
    members: int = 1
    step_dir: str = ""  # its directory under output_dir/steps (prefix-key)
    run: str | None = None  # the stage run it logs into ("mcl stage 1"); None: the parent run

    @property
    def category(self) -> str:
        """train, export, cluster, pseudo_labels, regroup, eval, encode, diagnose, soup, hyper, prepare."""
        return self.what.split(".", 1)[0]


# ---------------------------------------------------------------------------------------------------- data size
@dataclass
class DataSize:
    """What the plan scales by: training samples M, samples an export embeds (train and held-out), the embedding
    width D, the bytes of the training data (what a re-shard copies), and where each came from."""
    num_train: int | None = None
    num_exported: int | None = None
    dim: int | None = None
    data_bytes: int | None = None
    sources: dict = field(default_factory=dict)


def data_size(config, *, calibration: "Calibration | None" = None) -> DataSize:
    """The data's size from the config and cheap probes (no data is read or written); a calibration's prepared data
    wins where it measured the same thing."""
    size = DataSize()
    section = getattr(config.data, getattr(config.data, "kind", "") or "", None)
    if getattr(config, "pipeline", "") == "clip":
        _clip_size(config, size)
    elif section is not None and getattr(section, "num_train", None):
        size.num_train = int(section.num_train)
        size.num_exported = size.num_train + int(getattr(section, "num_test", 0) or 0)
        size.sources["M"] = f"data.{config.data.kind}.num_train"
    size.dim = embedding_dim(config)
    if size.dim:
        size.sources["D"] = "the model config"
    if calibration is not None:
        for name, value in (("num_train", calibration.num_train), ("num_exported", calibration.num_exported),
                            ("dim", calibration.dim), ("data_bytes", calibration.data_bytes)):
            if value:
                setattr(size, name, value)
        size.sources.update({"M": "the prepared data (calibration)", "D": "the calibration's export"})
    return size


def _clip_size(config, size: DataSize) -> None:
    d = config.data
    if d.shards is None:
        size.num_train, size.num_exported = d.synthetic.num_train, d.synthetic.num_train
        size.sources["M"] = "data.synthetic.num_train"
        return
    from contrastive.data.urls import expand_urls, is_remote
    from contrastive.errors import MclpipeError
    from contrastive.modalities.image_text.data import count_samples
    urls = expand_urls(d.shards, check_local=False)
    try:
        count = count_samples(urls, num_samples=d.num_samples)
    except MclpipeError:
        return
    size.num_train = size.num_exported = int(count.total)
    size.sources["M"] = f"the shards' {count.source}"
    local = [Path(u.removeprefix("file:")) for u in urls if not is_remote(u)]
    if local and len(local) == len(urls) and all(p.is_file() for p in local):
        size.data_bytes = sum(p.stat().st_size for p in local)
        size.sources["data bytes"] = "the shard files' sizes"


#: Widths of the image backbones whose features an export writes (small_cnn: its last width).
_IMAGE_WIDTHS = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "vit_tiny": 192, "vit_small": 384,
                 "vit_base": 768}


def embedding_dim(config) -> int | None:
    """D of a stage's export as the model config implies it, or None when only a calibration can tell (a modality
    registered from outside mclpipe may have no ``model`` section at all)."""
    model = getattr(config, "model", None)
    pipeline = config.pipeline
    if model is None:
        return None
    if pipeline == "clip":
        return _open_clip_embed_dim(model.name)
    if pipeline == "image":
        return model.widths[-1] if model.encoder == "small_cnn" else _IMAGE_WIDTHS.get(model.encoder)
    if (getattr(model, "encoder", "tiny") == "tiny" or pipeline == "embeddings") and hasattr(model, "dim"):
        return int(model.dim)
    return None


def _open_clip_embed_dim(name: str) -> int | None:
    """embed_dim from the open_clip model config JSON (ours or open_clip's), read without importing open_clip."""
    import importlib.util
    here = Path(__file__).resolve().parent.parent / "contrastive" / "modalities" / "image_text" / "model_configs"
    candidates = [here / f"{name}.json"]
    spec = importlib.util.find_spec("open_clip")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "model_configs" / f"{name}.json")
    for path in candidates:
        if path.is_file():
            return int(json.loads(path.read_text())["embed_dim"])
    return None


# ---------------------------------------------------------------------------------------------------- calibration
@dataclass
class Rate:
    """One kind of step as the calibration measured it: ``fixed_s`` + ``per_unit_s`` x units (units: optimizer
    steps of ``batch`` samples for train, rows for export and k-means, members for an evaluation), measured over
    ``units`` of them; peak RSS of the calibration's process during it, bytes it wrote, peak GPU memory per
    device."""
    fixed_s: float
    per_unit_s: float
    units: float
    peak_rss: int | None = None
    disk: int | None = None
    gpu_mem: int | None = None
    batch: int | None = None
    note: str = ""


@dataclass
class Calibration:
    """The measured rates of one config on one machine (JSON in the cache, :func:`calibration_path`)."""
    machine: str
    device: str
    measured_at: str
    config_hash: str
    seconds: float
    num_train: int | None
    num_exported: int | None
    dim: int | None
    data_bytes: int | None
    id_bytes: float | None
    rates: dict[str, Rate]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        raw = json.loads(text)
        raw["rates"] = {k: Rate(**v) for k, v in raw["rates"].items()}
        return cls(**raw)


def calibration_path(config) -> Path:
    """Where the calibration of ``config`` on this machine is cached: <data.cache_dir>/plan-calibration/."""
    return Path(config.data.cache_dir).resolve() / "plan-calibration" / f"{machine_id()}-{config.config_hash()}.json"


def cached_calibration(config) -> Calibration | None:
    path = calibration_path(config)
    if not path.is_file():
        return None
    try:
        return Calibration.from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None  # an older format: calibrate again


@dataclass
class RunCosts:
    """What ``mclpipe run`` pays besides its steps' computation, measured on this machine by the run probe
    (``flows.run_probe``: the run's imports, its temporary Prefect server, a fresh MLflow store, a flow run of task
    runs that record like a step; cached per machine, :func:`run_costs_path`):

    - ``start_s``: from the process's spawn to the flow's first task call (imports, the server's start, the MLflow
      store, the flow run's creation);
    - ``task_s``: one task run with a step's records (an MLflow run opened, a batch of metrics, an artifact, the run
      closed), as the flow waits for it: the mean of the probe's task runs;
    - ``end_s``: from the flow's last task run to the process's exit (the flow run's end, the server's stop)."""
    machine: str
    measured_at: str
    start_s: float
    task_s: float
    end_s: float
    tasks: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def run_costs_from_marks(marks: dict, *, spawned: float, exited: float) -> tuple[float, float, float]:
    """(start_s, task_s, end_s) from the probe's wall-clock marks (``flows.run_probe``: ``tasks``, each task call's
    [start, end] as the flow saw it; ``flow_end``) and the parent's spawn and exit times."""
    spans = marks["tasks"]
    if not spans:
        raise ValueError("the run probe ran no task")
    start_s = spans[0][0] - spawned
    task_s = sum(end - began for began, end in spans) / len(spans)
    end_s = exited - spans[-1][1]
    return start_s, task_s, end_s


def run_costs_path(config) -> Path:
    """Where this machine's run costs are cached: one file a machine (not a config) in the calibration's folder."""
    return calibration_path(config).parent / f"{machine_id()}-run-costs.json"


def cached_run_costs(config) -> RunCosts | None:
    path = run_costs_path(config)
    if not path.is_file():
        return None
    try:
        return RunCosts(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None  # an older format: measured again by the next calibration


def bookkeeping_tasks(steps: list[PlannedStep]) -> int:
    """Task runs of a run that are not steps: opening and closing each stage run the steps log into (their ``run``,
    as the stage graph names it), and five of the flow's own: opening the pipeline's MLflow run, the summary, the
    pipeline's model, the links between Prefect and MLflow, and closing the pipeline's run."""
    stage_runs = {step.run for step in steps if step.run is not None}
    return 2 * len(stage_runs) + 5


def overhead_seconds(costs: RunCosts, steps: list[PlannedStep]) -> dict[str, float]:
    """What a run adds to its steps' rows, by part: the start, the bookkeeping task runs, the end."""
    return {"start": costs.start_s, "bookkeeping": bookkeeping_tasks(steps) * costs.task_s, "end": costs.end_s}


# ---------------------------------------------------------------------------------------------------- estimates
@dataclass
class PlanRow:
    """One step's projection; None: not known (the basis says why)."""
    title: str
    what: str
    kind: str
    stage: int | None
    seconds: float | None
    peak_ram: int | None
    disk: int | None
    gpu_mem: int | None
    basis: str
    critical: bool = False


@dataclass
class Plan:
    rows: list[PlanRow]
    size: DataSize
    calibration: Calibration | None
    assumptions: list[str]
    #: what the run adds to its steps (:func:`overhead_seconds`: start, bookkeeping task runs, end); empty when the
    #: run probe has not measured this machine
    overhead: dict[str, float] = field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        return sum(self.overhead.values())

    @property
    def total_s(self) -> float:
        """The projected wall time of ``mclpipe run``: every step one after another (the flow runs them so), each
        with its task run and records, plus the run's start, its bookkeeping task runs and its end."""
        return sum(r.seconds or 0.0 for r in self.rows) + self.overhead_s

    @property
    def critical_s(self) -> float:
        return sum(r.seconds or 0.0 for r in self.rows if r.critical) + self.overhead_s

    @property
    def disk(self) -> int:
        return sum(r.disk or 0 for r in self.rows)

    @property
    def peak_ram(self) -> int:
        return max((r.peak_ram or 0 for r in self.rows), default=0)

    @property
    def unknown(self) -> list[str]:
        return [r.title for r in self.rows if r.seconds is None]


def on_critical_path(step: PlannedStep, steps: list[PlannedStep]) -> bool:
    """The chain every later step waits for: prepare, MCL's train / export / k-means / pseudo-labels / regroup of
    every stage, and the evaluation of MCL's concatenation (the last step that needs the last stage). The control
    run and the other evaluations depend on it but nothing depends on them."""
    if step.category == "prepare":
        return True
    if step.kind == "mcl" or (step.stage == 0 and step.category in ("train", "export")):
        return step.category in ("train", "export", "cluster", "pseudo_labels", "regroup")
    return step.what == "eval.mcl_concat"


def estimate(config, steps: list[PlannedStep], *, calibration: Calibration | None,
             size: DataSize | None = None, run_costs: RunCosts | None = None) -> Plan:
    """One row per step: seconds, peak RAM, disk written and GPU memory per device, with what each rests on; with
    the machine's ``run_costs``, each step's task run and records and the run's start, bookkeeping and end too
    (``Plan.total_s``: the projected wall time of ``mclpipe run``)."""
    size = size or data_size(config, calibration=calibration)
    firsts = {}  # the run's first step of each category pays the process's one-time start-up (cold)
    for i, step in enumerate(steps):
        firsts.setdefault(step.category, i)
    rows = [_row(config, step, size=size, cal=calibration, cold=firsts[step.category] == i)
            for i, step in enumerate(steps)]
    for row, step in zip(rows, steps):
        row.critical = on_critical_path(step, steps)
    if run_costs is not None:
        with_task_runs(rows, run_costs)
    assumptions = [f"M = {size.num_train:,} training samples ({size.sources.get('M', '?')})" if size.num_train
                   else "M unknown before the data is prepared: `mclpipe plan` prepares it to calibrate",
                   f"D = {size.dim} ({size.sources.get('D', '?')})" if size.dim else "D unknown"]
    if calibration is not None:
        assumptions.append(f"rates measured {calibration.measured_at} on {calibration.machine} ({calibration.device})"
                           f" in {calibration.seconds:.0f} s on this config's own data")
        assumptions.append("growth beyond the calibration's size along make bench-scale's slopes (BENCHMARKS.md)")
    else:
        assumptions.append("no calibration: closed forms only (run `mclpipe plan` to measure the rates)")
    overhead = overhead_seconds(run_costs, steps) if run_costs is not None else {}
    if run_costs is not None:
        assumptions.append(
            f"a run's own costs measured {run_costs.measured_at} by the run probe (the run's imports, a temporary "
            f"Prefect server, a fresh MLflow store, {run_costs.tasks} task runs that record like a step): start "
            f"{run_costs.start_s:.1f} s, {run_costs.task_s:.2f} s a task run (each step's row includes one; "
            f"{bookkeeping_tasks(steps)} more open, close and summarize runs), end {run_costs.end_s:.1f} s"
            + ("; PREFECT_API_URL is set, so a run starts no server of its own and starts faster"
               if os.environ.get("PREFECT_API_URL") else ""))
    else:
        assumptions.append("a run's own start, bookkeeping and end not measured yet (`mclpipe plan` measures them "
                           "once per machine): the total is the steps' alone")
    return Plan(rows=rows, size=size, calibration=calibration, assumptions=assumptions, overhead=overhead)


def with_task_runs(rows: list[PlanRow], costs: RunCosts) -> None:
    """Each projected step as the run makes it: its computation plus one task run with its records."""
    for row in rows:
        if row.seconds is not None:
            row.seconds += costs.task_s
            row.basis = "; ".join(filter(None, [row.basis, f"+ {costs.task_s:.2f} s task run and records "
                                                             "(run probe)"]))


def _scaled(rate: Rate, units: float, *, pipeline: str, category: str, n: float | None, m: float | None) -> float:
    """fixed + per-unit x units, the per-unit part grown along the bench-scale slope from n to m samples."""
    factor = (m / n) ** growth(pipeline, category) if n and m and m > n else 1.0
    return rate.fixed_s + rate.per_unit_s * units * factor


@dataclass
class StepCase:
    """What an estimator reads about one step: the step, the config, the data's size, the calibration and the rate
    measured for the step's kind (:func:`measured_rate`)."""
    config: Any
    step: PlannedStep
    size: DataSize
    cal: Calibration | None
    rate: Rate | None
    cold: bool
    assumed: bool = False  # the rate is another kind's (eval's), stated in the basis

    @property
    def pipeline(self) -> str:
        return self.config.pipeline

    @property
    def stage(self) -> int:
        return self.step.stage or 0

    @property
    def exported(self) -> int | None:
        """Rows an export writes and k-means reads (every split the export embeds)."""
        return self.size.num_exported or self.size.num_train

    @property
    def device(self) -> str:
        return self.cal.device if self.cal is not None else self.config.device

    @property
    def id_bytes(self) -> float:
        return self.cal.id_bytes if self.cal is not None and self.cal.id_bytes else ID_BYTES


@dataclass
class Estimate:
    """One step's figures (None: not known) and what each rests on."""
    seconds: float | None = None
    peak: int | None = None
    disk: int | None = None
    gpu: int | None = None
    basis: list[str] = field(default_factory=list)


#: Kinds of step with no rate of their own measured by every calibration, projected at the evaluation's rate (they
#: read the held-out sets like it); the basis says so.
LIKE_EVAL = ("diagnose", "hyper")


def measured_rate(cal: Calibration | None, category: str, *, cold: bool) -> tuple[Rate | None, bool]:
    """(the calibration's rate for a kind of step, whether it is the evaluation's standing in): ``<kind>_cold`` for
    the run's first step of the kind when one was measured, else ``<kind>``, else eval's for :data:`LIKE_EVAL`."""
    if cal is None:
        return None, False
    if cold and f"{category}_cold" in cal.rates:
        return cal.rates[f"{category}_cold"], False
    if category in cal.rates:
        return cal.rates[category], False
    if category in LIKE_EVAL and "eval" in cal.rates:
        return cal.rates["eval"], True
    return None, False


def _train_estimate(case: StepCase) -> Estimate:
    """Optimizer steps x the calibrated step, scaled by the stage's batch against the calibrated one."""
    out = Estimate()
    stage_config = case.config.for_stage(case.stage)
    m = case.size.num_train
    units = _train_steps(case.config, stage_config, case.stage, m)
    rate = case.rate
    if rate is None or units is None:
        out.basis.append("not calibrated")
        return out
    batch = stage_config.global_batch_size(case.stage)
    per_step = Rate(rate.fixed_s, rate.per_unit_s * batch / (rate.batch or 1), rate.units)
    n_cal = case.cal.num_train if case.cal is not None else None
    out.seconds = _scaled(per_step, units, pipeline=case.pipeline, category="train", n=n_cal, m=m)
    out.basis.append(f"{units:,} steps x {per_step.per_unit_s * 1000:.1f} ms a step of {batch} + {rate.fixed_s:.1f} s "
                     f"start{' (the first training: cold)' if case.cold else ''}, measured on {case.device}")
    out.peak, out.disk, out.gpu = rate.peak_rss, rate.disk, rate.gpu_mem
    return out


def _export_estimate(case: StepCase) -> Estimate:
    """Rows x the calibrated row; disk: M x D float16 plus the ids (closed form)."""
    out, rate, exported, d = Estimate(), case.rate, case.exported, case.size.dim
    if rate is not None and exported:
        n_cal = case.cal.num_train if case.cal is not None else None
        out.seconds = _scaled(rate, exported, pipeline=case.pipeline, category="export", n=n_cal,
                              m=case.size.num_train)
        out.basis.append(f"{exported:,} rows x {rate.per_unit_s * 1e6:.0f} us measured on {case.device}")
        out.peak, out.gpu = rate.peak_rss, rate.gpu_mem
    if exported and d:
        out.disk = int(exported * (d * 2 + case.id_bytes))
        out.basis.append(f"disk = {exported:,} x {d} x 2 B + ids (closed form)")
    return out


def _cluster_estimate(case: StepCase) -> Estimate:
    """k-means: RAM = the (M, D) float32 matrices it holds (closed form) + the process; seconds: rows x the
    calibrated row, plus reading the scope."""
    out, rate, exported, d = Estimate(), case.rate, case.exported, case.size.dim
    if exported and d:
        copies = kmeans_matrices(case.config, case.stage)
        warm = case.cal.rates.get("cluster") if case.cal is not None else None
        out.peak = int(copies * exported * d * 4) + ((warm.peak_rss or 0) if warm is not None else 0)
        out.disk = int(exported * (8 + case.id_bytes) + case.config.mcl.clusters_after(case.stage) * d * 4)
        out.basis.append(f"RAM = {exported:,} x {d} x 4 B (the float32 matrix"
                         f"{', twice: Lloyd on every point normalises a copy' if copies == 2 else ''}, closed form) "
                         "+ the process")
    if rate is not None and exported:
        cold = case.cold and "cluster_cold" in case.cal.rates
        out.basis.append(f"{rate.per_unit_s * 1e6:.2f} us a row measured on {rate.units:,.0f} rows"
                         f"{' (the first k-means: cold)' if cold else ''}")
        out.seconds = _scaled(rate, exported, pipeline=case.pipeline, category="cluster", n=rate.units,
                              m=exported) + _scope_seconds(case.cal, case.size.num_train, out.basis)
    return out


def _pseudo_labels_estimate(case: StepCase) -> Estimate:
    """Pseudo-labels: rows x the calibrated row, plus reading the scope; disk: a label and an id a row."""
    out, rate, exported = Estimate(), case.rate, case.exported
    if exported:
        out.disk = int(exported * (8 + case.id_bytes))
    if rate is not None and exported:
        out.basis.append(f"measured on {rate.units:,.0f} rows, linear")
        out.seconds = _scaled(rate, exported, pipeline=case.pipeline, category="pseudo_labels", n=rate.units,
                              m=exported) + _scope_seconds(case.cal, case.size.num_train, out.basis)
        out.peak = rate.peak_rss
    return out


def _regroup_estimate(case: StepCase) -> Estimate:
    """The re-shard: a copy of the training shards (closed form), at the calibrated bytes a second."""
    out, rate, data_bytes = Estimate(), case.rate, case.size.data_bytes
    if data_bytes:
        out.disk = data_bytes
        out.basis.append("disk = a copy of the training shards (closed form)")
    if rate is not None and data_bytes:
        out.seconds = rate.fixed_s + rate.per_unit_s * data_bytes
        out.peak = rate.peak_rss
        out.basis.append(f"{1 / rate.per_unit_s / 1e6:.0f} MB/s of shards, the re-shard measured on the first shard")
    return out


def _prepare_estimate(case: StepCase) -> Estimate:
    """The data's preparation as a run after the plan finds it: measured (the calibration prepared it)."""
    rate = case.rate
    if rate is None:
        return Estimate()
    return Estimate(seconds=rate.fixed_s, peak=rate.peak_rss, disk=rate.disk,
                    basis=[f"measured ({rate.note}: a run after this plan reuses it)"])


def _held_out_estimate(case: StepCase) -> Estimate:
    """Evaluations, encodings, diagnostics, the soup, the final step: they read held-out sets, not M; seconds a
    member (an evaluation of a concatenation reads each)."""
    rate, members = case.rate, case.step.members
    if rate is None:
        return Estimate(basis=["not calibrated"])
    source = "eval's rate (assumed alike)" if case.assumed else "measured"
    return Estimate(seconds=rate.fixed_s + rate.per_unit_s * members, peak=rate.peak_rss, disk=rate.disk,
                    gpu=rate.gpu_mem, basis=[f"{source}, {members} member(s)"])


#: One estimator per kind of step (``PlannedStep.category``); every other kind reads held-out sets
#: (:func:`_held_out_estimate`).
ESTIMATORS: dict[str, Callable[[StepCase], Estimate]] = {
    "train": _train_estimate, "export": _export_estimate, "cluster": _cluster_estimate,
    "pseudo_labels": _pseudo_labels_estimate, "regroup": _regroup_estimate, "prepare": _prepare_estimate}


def _row(config, step: PlannedStep, *, size: DataSize, cal: Calibration | None, cold: bool = False) -> PlanRow:
    """One step's projection by its kind's estimator; ``cold``: the run's first step of its kind (a training, a
    k-means, ...), which pays the process's one-time start-up when the calibration measured one
    (``<category>_cold``)."""
    rate, assumed = measured_rate(cal, step.category, cold=cold)
    case = StepCase(config=config, step=step, size=size, cal=cal, rate=rate, cold=cold, assumed=assumed)
    found = ESTIMATORS.get(step.category, _held_out_estimate)(case)
    return PlanRow(title=step.title, what=step.what, kind=step.kind, stage=step.stage, seconds=found.seconds,
                   peak_ram=found.peak, disk=found.disk, gpu_mem=found.gpu if _is_gpu(case.device) else None,
                   basis="; ".join(found.basis))


def _scope_seconds(cal: Calibration, m: int | None, basis: list[str]) -> float:
    """Seconds the clustering steps' tasks spend reading the samples they cluster (the training split's ids and
    labels: ``Modality.sample_scope``), M x the calibration's rate a training sample; 0 where it has none (CLIP
    clusters every exported sample as exported)."""
    scope = cal.rates.get("scope")
    if scope is None or not m:
        return 0.0
    basis.append(f"+ the training split's ids and labels read at {scope.per_unit_s * 1e6:.2f} us a sample "
                 f"(M = {m:,})")
    return scope.per_unit_s * m


def kmeans_matrices(config, stage: int) -> int:
    """(M, D) float32 matrices k-means holds at once: one (the loaded embeddings; Lloyd trains on a sample and the
    points are normalised and assigned a chunk at a time), or two when it trains spherical k-means on every point
    (``mcl.kmeans_train_points_per_cluster: 0``), which normalises a copy of them all
    (``contrastive.mcl.clustering.kmeans``)."""
    spec = config.mcl.kmeans_spec(stage, seed=0)
    return 2 if spec.spherical and spec.max_train_points is None else 1


def _is_gpu(device: str) -> bool:
    return str(device).startswith("cuda")


def _train_steps(config, stage_config, stage: int, m: int | None) -> int | None:
    if m is None:
        return None
    from contrastive.modalities.registry import modality_for
    modality = modality_for(config.pipeline)
    return modality.total_steps(stage_config, stage=stage, data={"num_train": m})
