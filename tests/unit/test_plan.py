"""planning (the cost model, its feasibility check and report): the closed forms, the feasibility check (disk, memory, capacity, shards) and the
projection from a calibration, against hand-computed figures."""
from pathlib import Path

import numpy as np
import pytest

from flows.plan_steps import planned_steps
from planning import feasibility as F
from planning import model as P
from planning import report as R
from pipeline_config.loader import load_config

CC12M = P.DataSize(num_train=12_000_000, num_exported=12_000_000, dim=768, data_bytes=480_000_000_000)


@pytest.fixture
def cc12m(tmp_path):
    config = load_config("clip_cc12m_vitl14", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                               "data.num_samples=12000000"])
    return config, planned_steps(config)


def test_closed_forms_at_cc12m(cc12m):
    config, steps = cc12m
    plan = P.estimate(config, steps, calibration=None, size=CC12M)
    rows = {r.title: r for r in plan.rows}
    assert rows["k-means stage 0"].peak_ram == 12_000_000 * 768 * 4  # the float32 matrix, no calibration
    assert rows["export stage 0"].disk == 12_000_000 * (768 * 2 + P.ID_BYTES)
    assert rows["regroup batches for stage 1 (MCL)"].disk == CC12M.data_bytes
    assert rows["train stage 0"].seconds is None and "not calibrated" in rows["train stage 0"].basis
    # 4 stages (the preset has no control run): 3 k-means, 3 pseudo-labels, 3 re-shards
    assert sum(r.what == "cluster" for r in plan.rows) == 3
    assert sum(r.what == "regroup" for r in plan.rows) == 3
    assert sum(r.what == "train" for r in plan.rows) == 4


def test_a_small_memory_refuses_the_k_means_in_one_line(cc12m, monkeypatch):
    config, steps = cc12m
    monkeypatch.setattr(F, "available_memory", lambda: 24 * 10 ** 9)
    monkeypatch.setattr(F, "free_bytes", lambda path: (10 ** 15, 1))  # disk is not what this test is about
    findings = F.feasibility(config, P.estimate(config, steps, calibration=None, size=CC12M))
    errors = [f.message for f in findings if f.level == "error"]
    assert errors == ["k-means of 12,000,000 x 768 needs ~37 GB of RAM and this machine has 24 GB available: run "
                      "it on a machine with more memory, or export fewer or narrower embeddings (a smaller data set "
                      "or model); --force runs anyway"]
    monkeypatch.setattr(F, "available_memory", lambda: 40 * 10 ** 9)  # fits, but past 80 %: a warning
    findings = F.feasibility(config, P.estimate(config, steps, calibration=None, size=CC12M))
    assert [f.level for f in findings] == ["warning"] and "37 GB of RAM of the 40 GB" in findings[0].message


def test_spherical_k_means_on_every_point_needs_two_matrices_and_the_refusal_names_the_key(tmp_path, monkeypatch):
    """contrastive.mcl.clustering.kmeans normalises a copy of all M points when Lloyd trains on every one of them
    (``mcl.kmeans_train_points_per_cluster: 0``): 74 GB at CC12M, not 37."""
    monkeypatch.setattr(F, "available_memory", lambda: 60 * 10 ** 9)
    monkeypatch.setattr(F, "free_bytes", lambda path: (10 ** 15, 1))
    every = load_config("clip_cc12m_vitl14", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path}",
                                              "data.num_samples=12000000", "mcl.kmeans_train_points_per_cluster=0"])
    rows = [r for r in P.estimate(every, planned_steps(every), calibration=None, size=CC12M).rows
            if r.what == "cluster"]
    assert rows and all(r.peak_ram == 2 * 12_000_000 * 768 * 4 for r in rows)
    [error] = [f.message for f in F.feasibility(every, P.estimate(every, planned_steps(every), calibration=None,
                                                                  size=CC12M)) if f.level == "error"]
    assert error.startswith("k-means of 12,000,000 x 768 needs ~74 GB of RAM and this machine has 60 GB available: "
                            "set mcl.kmeans_train_points_per_cluster")
    sampled = load_config("clip_cc12m_vitl14", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path}",
                                                "data.num_samples=12000000"])
    assert P.kmeans_matrices(sampled, 0) == 1 and P.kmeans_matrices(every, 0) == 2


def test_disk_refusal_names_the_key_and_the_space_needed(cc12m, monkeypatch):
    config, steps = cc12m
    monkeypatch.setattr(F, "available_memory", lambda: 10 ** 15)
    monkeypatch.setattr(F, "free_bytes", lambda path: (10 ** 12, 7))  # 1 TB free, output_dir and cache on one disk
    plan = P.estimate(config, steps, calibration=None, size=CC12M)
    need = sum(r.disk or 0 for r in plan.rows)
    assert need > 10 ** 12  # 4 exports of 18.6 GB + 3 re-shards of 480 GB
    (error,) = F.feasibility(config, plan)
    assert error.level == "error" and error.message.startswith(f"this pipeline writes about {R.human_bytes(need)} under "
                                                               f"output_dir {(config.output_dir).resolve()}")
    assert "has 1000 GB free: point output_dir at a disk with" in error.message and "--force" in error.message


def test_the_capacity_rule_and_the_shards_refuse_before_compute(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "available_memory", lambda: 10 ** 15)
    config = load_config("clip_cc12m_vitl14", [f"output_dir={tmp_path}", "data.num_samples=4000000"])
    size = P.DataSize(num_train=4_000_000, num_exported=4_000_000, dim=768)
    errors = [f.message for f in F.feasibility(config, P.estimate(config, planned_steps(config), calibration=None,
                                                                   size=size)) if f.level == "error"]
    assert any("MCL needs prod(K) <= M/b" in e for e in errors)  # 10^3 groups > 4M / 8192 = 488
    for i in range(3):
        (tmp_path / f"{i:05d}.tar").write_bytes(b"\0" * 1024)
    config = load_config("clip_cc12m_vitl14", [f"output_dir={tmp_path}", f"data.shards={tmp_path}/{{00000..00002}}.tar",
                                               "data.num_samples=12000000"])
    (finding,) = F._shard_findings(config)
    assert finding.level == "error" and "3 shard(s) for 8 data slots" in finding.message


def test_a_calibration_scales_train_by_steps_and_batch_and_export_by_rows(tmp_path):
    config = load_config("trifeature_quick", [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path}"])
    calibration = P.Calibration(
        machine="m", device="cpu", measured_at="now", config_hash=config.config_hash(), seconds=1.0, num_train=8000,
        num_exported=10_000, dim=256, data_bytes=None, id_bytes=8.0,
        rates={"train": P.Rate(fixed_s=2.0, per_unit_s=0.1, units=8, batch=64),
               "train_cold": P.Rate(fixed_s=9.0, per_unit_s=0.1, units=8, batch=64),
               "export": P.Rate(fixed_s=1.0, per_unit_s=0.001, units=10_000),
               "eval": P.Rate(fixed_s=0.0, per_unit_s=3.0, units=1)})
    plan = P.estimate(config, planned_steps(config), calibration=calibration)
    rows = {r.title: r for r in plan.rows}
    # the run's first training pays the cold start (imports, kernels, workers): 3 epochs of 8000 / 64 steps
    assert rows["train stage 0"].seconds == pytest.approx(9.0 + 3 * 125 * 0.1)
    # stage 1 trains on batches of 32 (stage_overrides): twice the steps, each half the samples
    assert rows["train stage 1 (MCL)"].seconds == pytest.approx(2.0 + 3 * 250 * 0.05)
    assert rows["export stage 0"].seconds == pytest.approx(1.0 + 10_000 * 0.001)
    assert rows["export stage 0"].disk == 10_000 * (256 * 2 + 8)
    assert rows["probe MCL concat"].seconds == pytest.approx(6.0)  # two members
    assert rows["diagnose stage 0"].seconds == pytest.approx(3.0) and "assumed alike" in rows["diagnose stage 0"].basis
    critical = [r.title for r in plan.rows if r.critical]
    assert critical == ["prepare data", "train stage 0", "export stage 0", "k-means stage 0",
                        "pseudo-labels for stage 1", "train stage 1 (MCL)", "export stage 1 (MCL)", "probe MCL concat"]
    assert plan.total_s > plan.critical_s


def test_growth_beyond_the_calibration_follows_the_bench_scale_slope(monkeypatch):
    rate = P.Rate(fixed_s=0.0, per_unit_s=1.0, units=1)
    monkeypatch.setitem(P.BENCH_SCALE_SLOPES, ("image", "export"), 1.09)
    # a measured slope of 1.09: 10x the samples costs 10 ** 1.09 times, not 10
    assert P._scaled(rate, 10, pipeline="image", category="export", n=1, m=10) == pytest.approx(10 ** 1.09)
    # a slope under 1 (fixed costs at the measured sizes) grows linearly
    assert P._scaled(rate, 10, pipeline="clip", category="export", n=1, m=10) == pytest.approx(10)


def test_run_refuses_before_any_step_and_force_skips_the_check(tmp_path, monkeypatch):
    """flows.cli.run_pipeline: the check runs before the flow (InfeasiblePlan, nothing started); --force skips it."""
    import contextlib

    import flows.cli as cli
    import flows.pipeline
    started = []
    monkeypatch.setattr(cli, "starting_local_server", contextlib.nullcontext)
    monkeypatch.setattr(flows.pipeline, "mcl_pipeline", lambda config, rerun_from=None: started.append(config) or {})
    monkeypatch.setattr(F, "free_bytes", lambda path: (1000, 1))  # 1 kB free
    config = load_config("trifeature_tiny", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                             f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    with pytest.raises(F.InfeasiblePlan, match="this pipeline writes about .* under output_dir"):
        cli.run_pipeline(config)
    assert started == [] and not (tmp_path / "runs").exists()
    cli.run_pipeline(config, force=True)
    assert started == [config]


def test_the_run_probe_marks_give_start_task_run_and_end():
    """flows.run_probe's marks: start = spawn to the first task call, task = mean task call, end = last task to
    exit."""
    marks = {"tasks": [[110.0, 111.0], [111.0, 111.5], [111.5, 112.5]], "flow_end": 113.0}
    start, task, end = P.run_costs_from_marks(marks, spawned=100.0, exited=115.0)
    assert (start, task, end) == pytest.approx((10.0, 2.5 / 3, 2.5))


def test_a_run_has_two_bookkeeping_task_runs_a_stage_run_and_five_more():
    """Measured on embeddings_tiny (2026-11-27 23:39): 3 stage runs, 11 task runs that are not steps (open-pipeline-
    run, 3 open-stage-run, summarize, log pipeline model, link prefect and mlflow, 4 close-run). The stage runs are
    those the runner's steps log into: the planned steps of embeddings_tiny name them."""
    steps = planned_steps(load_config("embeddings_tiny"))
    assert {(s.kind, s.stage) for s in steps if s.kind != "pipeline"} - {(None, None)} == {
        ("mcl", 0), ("mcl", 1), ("control", 1)}
    assert P.bookkeeping_tasks(steps) == 11


def test_the_total_projects_the_run_with_its_task_runs_start_and_end(tmp_path):
    """With the run probe's costs: each projected row + one task run, the total + start + bookkeeping + end; rows
    not projected stay unknown (no task run is added to nothing)."""
    config = load_config("trifeature_quick", [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path}"])
    calibration = P.Calibration(
        machine="m", device="cpu", measured_at="now", config_hash=config.config_hash(), seconds=1.0, num_train=8000,
        num_exported=10_000, dim=256, data_bytes=None, id_bytes=8.0,
        rates={"train": P.Rate(fixed_s=2.0, per_unit_s=0.1, units=8, batch=64),
               "train_cold": P.Rate(fixed_s=9.0, per_unit_s=0.1, units=8, batch=64)})
    costs = P.RunCosts(machine="m", measured_at="now", start_s=12.0, task_s=0.5, end_s=3.0, tasks=6)
    steps = planned_steps(config)
    bare = P.estimate(config, steps, calibration=calibration)
    plan = P.estimate(config, steps, calibration=calibration, run_costs=costs)
    trainings = [r for r in bare.rows if r.what == "train"]
    assert len(trainings) == 3 and bare.overhead == {} and bare.total_s == pytest.approx(sum(r.seconds for r in
                                                                                              trainings))
    rows = {r.title: r for r in plan.rows}
    assert rows["train stage 0"].seconds == pytest.approx(9.0 + 3 * 125 * 0.1 + 0.5)
    assert "0.50 s task run and records" in rows["train stage 0"].basis
    assert rows["export stage 0"].seconds is None  # not calibrated: still unknown, not 0.5 s
    # 3 trainings (stage 0, stage 1 of MCL and of the control) x (their seconds + 0.5 s) + start 12 s
    # + (2 x 3 + 5) bookkeeping runs x 0.5 s + end 3 s
    assert plan.overhead == pytest.approx({"start": 12.0, "bookkeeping": 5.5, "end": 3.0})
    assert plan.total_s == pytest.approx(bare.total_s + 3 * 0.5 + 12.0 + 5.5 + 3.0)
    assert "the run's start, bookkeeping and end (20.5 s)" in R.summary_lines(plan)[0]
    # progress is the steps' share: the last step done is 100 %, the first (prepare, not projected) 0 %
    assert R.progress_percent(plan, len(plan.rows)) == 100.0 and R.progress_percent(plan, 1) == 0.0


def test_the_step_rate_is_the_second_half_after_the_prefetched_batches():
    """planning.calibrate.steady_step_seconds: a loader with 4 batches prefetched makes steps 2-5 take 0.1 s
    while the model alone runs, then every step waits for its batch (1 s): the rate is 1 s, not a median of both."""
    from planning.calibrate import steady_step_seconds
    stamps = [0.0, 5.0, 5.1, 5.2, 5.3, 5.4, 6.4, 7.4, 8.4, 9.4]
    assert steady_step_seconds(stamps, total=10.0) == pytest.approx(1.0)
    assert steady_step_seconds([3.0], total=6.0) == 6.0 and steady_step_seconds([], total=6.0) == 6.0


def test_the_later_stages_rate_is_measured_on_their_own_config(tmp_path):
    """planning.calibrate._train: the cold training is stage 0's, the warm one the last stage's config
    (trifeature_quick's stage 1 trains on batches of 32), so the plan does not scale stage 0's step by a batch ratio
    the step does not follow; the export gets stage 0's model."""
    from planning import calibrate as C
    config = load_config("trifeature_quick", [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path}"])
    trained = []

    class Fake:
        def train_spec(self, stage_config, *, stage, out_dir, **_):
            return {"stage": stage, "batch": stage_config.global_batch_size(stage), "out_dir": out_dir}

        def train(self, spec, *, callbacks):
            trained.append((spec["stage"], spec["batch"]))
            for step in range(C.TRAIN_STEPS):
                callbacks[0].on_step(step=step, epoch=0, metrics={})
            return {"model_path": spec["out_dir"] + "/model.pt"}

    rates = {}
    model = C._train(config, Fake(), data={}, work=tmp_path, rates=rates, device="cpu")
    assert trained == [(0, 64), (1, 32)]
    assert (rates["train_cold"].batch, rates["train"].batch) == (64, 32)
    assert model == str(tmp_path / "train_cold") + "/model.pt"


def test_the_time_left_says_what_the_plan_projects_and_never_a_made_up_zero():
    def plan_of(*seconds):
        rows = [P.PlanRow(title=f"step {i}", what="train", kind="mcl", stage=0, seconds=s, peak_ram=None, disk=None,
                          gpu_mem=None, basis="") for i, s in enumerate(seconds)]
        return P.Plan(rows=rows, size=None, calibration=None, assumptions=[])

    assert R.time_left(plan_of(1.0, 2.0, 3.0), 1) == "about 5.0 s left by the plan"
    assert R.time_left(plan_of(1.0, None, 300.0), 1) == "at least 5.0 min left by the plan"
    assert R.time_left(plan_of(1.0, None, None), 1).startswith("time left not projected (no calibration")
    assert R.time_left(plan_of(None, None), 2) == "no step left by the plan"


def test_a_step_timed_at_two_sizes_splits_its_fixed_and_per_row_cost():
    """The k-means and pseudo-labels of a partial export are timed at two sizes: 1 s + 0.1 ms a row measured at
    10k and 40k rows is 2 s and 5 s; noise that makes the larger faster gives no negative cost."""
    from planning.calibrate import two_point_rate
    rate = two_point_rate([(10_000, 2.0, 5), (40_000, 5.0, 7)], note="n")
    assert (rate.fixed_s, rate.per_unit_s, rate.units, rate.peak_rss) == pytest.approx((1.0, 1e-4, 40_000, 7))
    noisy = two_point_rate([(10_000, 0.3, None), (40_000, 0.2, None)], note="n")
    assert noisy.per_unit_s == 0.0 and noisy.fixed_s == pytest.approx(0.2)


def test_the_keys_of_a_shard_are_its_samples_in_order(tmp_path):
    """A webdataset tar's samples are the runs of members sharing a name up to the first dot (what the re-shard
    reads as ``__key__``)."""
    from contrastive.modalities.image_text.data import write_tiny_shards
    from planning.calibrate import shard_keys
    urls = write_tiny_shards(directory=tmp_path, num_samples=12, samples_per_shard=12, image_size=8,
                             corrupt=False)["urls"]
    keys = shard_keys(Path(urls[0].removeprefix("file:")))
    assert len(keys) == 12 and len(set(keys.tolist())) == 12 and list(keys) == sorted(keys)


def test_the_clustering_rates_are_warm_and_a_runs_first_pays_its_cold_call(tmp_path, monkeypatch):
    """planning.calibrate._clusters on a partial export: the process's first call (the smaller size, cold:
    faiss, scikit-learn and matplotlib imported) and the larger size's first (memory never touched before) are kept
    apart, so the per-row cost is the slope between the two warm sizes' medians; a first call slower than the
    larger size's (what made the slope 0 and the projection at 1M -93 %) lands in ``cluster_cold``, whose per-row
    cost adds the first touch of the larger size's memory."""
    from planning import calibrate as C
    config = load_config("clip_tiny", [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path}"])
    small, large = C.kmeans_rows(8)
    assert (small, large) == (C.KMEANS_ROWS[1] // 5, C.KMEANS_ROWS[1])  # 8-d rows: the most rows
    assert C.kmeans_rows(768) == (C.KMEANS_ROWS[0] // 5, C.KMEANS_ROWS[0])  # 768-d rows: the fewest
    # (k-means, pseudo-labels) seconds of each call: cold at the small size, warm there (one outlier), the larger
    # size's first call (2e-6 s a row more), warm there (one outlier)
    late = (1.0 + (large - small) * 1e-5, 0.1 + (large - small) * 1e-6)
    first = (late[0] + (large - small) * 2e-6, late[1])
    script = iter([(3.0, 0.5), (1.0, 0.1), (9.0, 9.0), (1.0, 0.1), first, late, (0.0, 0.0), late])
    monkeypatch.setattr(C, "_synthetic_export", lambda directory, **_: (directory, None, None))
    monkeypatch.setattr(C, "_cluster_steps", lambda *_, **__: (lambda k, p: [("cluster", k, 1), ("pseudo_labels",
                                                                                                p, 2)])(*next(script)))

    class NoScope:
        def sample_scope(self, data):
            return None, None

    rates = {}
    C._clusters(config, NoScope(), data={}, export={"dir": None, "dim": 8, "rows_total": None}, work=tmp_path,
                rates=rates, device="cpu")
    assert next(script, None) is None  # every call made
    assert rates["cluster"].per_unit_s == pytest.approx(1e-5)
    assert rates["cluster"].fixed_s == pytest.approx(1.0 - small * 1e-5)
    assert rates["cluster_cold"].fixed_s == pytest.approx(3.0 - small * 1e-5)
    assert rates["cluster_cold"].per_unit_s == pytest.approx(1e-5 + 2e-6)
    assert rates["pseudo_labels"].per_unit_s == pytest.approx(1e-6)
    assert rates["pseudo_labels_cold"].fixed_s == pytest.approx(0.5 - small * 1e-6)
    assert rates["pseudo_labels_cold"].per_unit_s == pytest.approx(1e-6)
    assert "scope" not in rates  # CLIP clusters every exported sample: nothing to read first


def test_a_synthetic_scope_is_made_of_the_real_ids_and_aligned_by_id(tmp_path):
    """The synthetic export of a modality that clusters its training split: ids made from the real split's ids
    (their length and order: what the task's join by id sorts), the scope the training share of them in the export's
    order (so the join runs, as for a split within an export of every split), each attribute's labels from that
    attribute's values."""
    from contrastive.embeddings import load_embedding_ids
    from planning.calibrate import _synthetic_export
    real = np.array(["b/2.jpg", "a/1.jpg", "c/3.jpg"], dtype=np.dtypes.StringDType())
    directory, scope, labels = _synthetic_export(tmp_path / "e", rows=8, dim=4, scope_ids=real, kept=0.75,
                                                 attributes={"shape": np.array([3, 7, 7, -1])})
    stored = load_embedding_ids(directory=directory)
    assert stored.tolist() == ["b/2.jpg", "a/1.jpg", "c/3.jpg", "b/2.jpg~1", "a/1.jpg~1", "c/3.jpg~1", "b/2.jpg~2",
                               "a/1.jpg~2"]
    assert scope.dtype == real.dtype and scope.size == 6 and set(scope.tolist()) < set(stored.tolist())
    assert scope.tolist() == [i for i in stored.tolist() if i in set(scope.tolist())]  # the export's order
    assert set(labels["shape"].tolist()) <= {3, 7, -1} and labels["shape"].shape == (6,)
    assert _synthetic_export(tmp_path / "f", rows=5, dim=4, scope_ids=None)[1:] == (None, None)


def test_the_first_k_means_of_a_run_is_cold_and_both_clustering_steps_read_the_scope(tmp_path):
    config = load_config("trifeature_quick", [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path}",
                                              "mcl.num_stages=3", "mcl.clusters=4"])
    rates = {"cluster": P.Rate(fixed_s=0.5, per_unit_s=1e-5, units=100_000),
             "cluster_cold": P.Rate(fixed_s=2.5, per_unit_s=1e-5, units=100_000),
             "pseudo_labels": P.Rate(fixed_s=0.1, per_unit_s=1e-6, units=100_000),
             "scope": P.Rate(fixed_s=0.0, per_unit_s=2e-6, units=8000)}
    calibration = P.Calibration(machine="m", device="cpu", measured_at="now", config_hash=config.config_hash(),
                                seconds=1.0, num_train=8000, num_exported=10_000, dim=256, data_bytes=None,
                                id_bytes=8.0, rates=rates)
    rows = {r.title: r for r in P.estimate(config, planned_steps(config), calibration=calibration).rows}
    scope = 8000 * 2e-6
    assert rows["k-means stage 0"].seconds == pytest.approx(2.5 + 10_000 * 1e-5 + scope)
    assert "cold" in rows["k-means stage 0"].basis
    assert rows["k-means stage 1 (MCL)"].seconds == pytest.approx(0.5 + 10_000 * 1e-5 + scope)
    assert rows["pseudo-labels for stage 1"].seconds == pytest.approx(0.1 + 10_000 * 1e-6 + scope)


def test_a_warning_step_before_an_error_step_is_still_refused(tmp_path, monkeypatch):
    """_memory_findings reads every row: a step at 85 % of the free memory (a warning) must not hide a later step
    that needs far more than there is (issue 57: the loop stopped at the first warning and the run went ahead)."""
    config = load_config("trifeature_tiny", [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path}"])
    monkeypatch.setattr(F, "available_memory", lambda: 100 * 10 ** 9)
    row = dict(what="train", kind="mcl", stage=0, seconds=None, disk=None, gpu_mem=None, basis="")
    plan = P.Plan(rows=[P.PlanRow(title="train stage 0", peak_ram=85 * 10 ** 9, **row),
                        P.PlanRow(title="train stage 1 (MCL)", peak_ram=300 * 10 ** 9, **row)],
                  size=P.DataSize(), calibration=None, assumptions=[])
    findings = F._memory_findings(config, plan)
    assert [(f.level, f.message.split(" needs")[0]) for f in findings] == [
        ("error", "train stage 1 (MCL)"), ("warning", "train stage 0")]


def test_the_calibration_stops_an_export_that_reports_progress_and_reads_its_width_from_it(tmp_path):
    """planning.calibrate._export: a modality whose export reports ``progress(rows, dim)``
    (``Modality.export_reports_progress``) is stopped after EXPORT_ROWS rows, its width D taken from the progress
    (the export hands nothing back); one that does not is called without ``progress`` and timed whole (issue 57:
    the width came from a traceback frame's local ``writer``, the choice from a TypeError's message)."""
    from planning import calibrate as C

    class Reporting:
        export_reports_progress = True
        calls: list = []

        def export_kwargs(self, config, **kwargs):
            return {"out_dir": kwargs["out_dir"]}

        def export(self, *, out_dir, progress):
            for _ in range(10 * C.EXPORT_ROWS // 512):
                self.calls.append(512)
                progress(512, 48)
            raise AssertionError("the calibration should have stopped the export")

    class Whole(Reporting):
        export_reports_progress = False

        def export(self, *, out_dir):  # no progress parameter: passing one would raise TypeError
            return {"num_samples": 300, "dim": 24}

    config = load_config("trifeature_tiny", [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path}"])
    rates = {}
    stopped = C._export(config, Reporting(), model_path="m", data={}, work=tmp_path, rates=rates, device="cpu")
    assert stopped == {"rows_total": None, "dim": 48, "dir": None}
    assert sum(Reporting.calls) == C.EXPORT_ROWS and rates["export"].units == C.EXPORT_ROWS
    whole = C._export(config, Whole(), model_path="m", data={}, work=tmp_path / "w", rates=rates, device="cpu")
    assert (whole["rows_total"], whole["dim"]) == (300, 24) and rates["export"].note == "whole export"
