"""bench/scale.py's verdicts: the log-log slope, the peak-RSS bound and the records bound, the last on what the
pipeline's own recording code (``tasks.steps.finish_cluster_record``) writes to a sqlite MLflow store at two sizes."""
import math
from pathlib import Path

import numpy as np
import pytest

from bench.scale import RECORD_RATIO, StepResult, judge, loglog_slope, mlflow_counts, report_markdown


def _result(size: int, *, seconds: float, rss: int = 500 << 20, records: dict | None = None, step: str = "export"):
    return StepResult(pipeline="clip", step=step, size=size, seconds=seconds, peak_rss=rss, rss_before=400 << 20,
                      bytes_written=size * 100, records=records or {"mlflow_params": 3}, info={"dim": 64})


def test_the_slope_is_the_exponent_of_the_growth():
    sizes = [1_000, 3_000, 10_000]
    assert math.isclose(loglog_slope(sizes, [2e-3 * m for m in sizes]), 1.0, abs_tol=1e-9)
    assert math.isclose(loglog_slope(sizes, [1e-6 * m * m for m in sizes]), 2.0, abs_tol=1e-9)
    assert math.isnan(loglog_slope(sizes[:1], [1.0]))


def test_time_and_memory_goals_fail_on_quadratic_time_and_memory_that_grows_with_m():
    linear = judge([_result(m, seconds=m * 1e-3 * math.log(m) / math.log(1e5)) for m in (100_000, 1_000_000)],
                   "clip", "export")
    assert linear.time_ok and linear.rss_ok and 1.0 < linear.slope < 1.1  # M log M passes
    quadratic = judge([_result(m, seconds=(m / 1e5) ** 2) for m in (100_000, 1_000_000)], "clip", "export")
    assert quadratic.time_ok is False and math.isclose(quadratic.slope, 2.0)
    growing = judge([_result(m, seconds=m * 1e-3, rss=(400 << 20) + m * 200) for m in (100_000, 1_000_000)],
                    "clip", "export")
    assert growing.rss_ok is False  # 420 MiB -> 590 MiB: more than 1.3x + 64 MiB
    exempt = judge([_result(m, seconds=m * 1e-3, rss=(400 << 20) + m * 200, step="kmeans")
                    for m in (100_000, 1_000_000)], "clip", "kmeans")
    assert exempt.rss_ok is None and exempt.projection["rss"] > growing.projection["rss"]  # 768 / 64 more per sample
    assert judge([_result(100_000, seconds=1.0)], "clip", "export").time_ok is None  # one size: not judged


@pytest.fixture
def tracker(tmp_path):
    from tasks.tracking import Tracker
    return Tracker(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="scale-test",
                   artifact_root=tmp_path / "mlartifacts")


def _clustered_and_recorded(tmp_path: Path, tracker, *, size: int, per_sample_params: bool) -> dict:
    """k-means on ``size`` random embeddings, recorded by the cluster task's own code; returns what the run holds."""
    from contrastive.embeddings import save_embeddings
    from contrastive.mcl.steps import KMeansSpec, cluster_stage
    from tasks.steps import finish_cluster_record

    out = tmp_path / f"m{size}"
    ids = np.array([f"k{i:07d}" for i in range(size)])
    save_embeddings(embeddings=np.random.default_rng(size).normal(size=(size, 8)).astype(np.float32), ids=ids,
                    directory=out / "emb")
    summary = cluster_stage(embeddings_dir=out / "emb", out_dir=out / "clusters",
                            kmeans_spec=KMeansSpec(k=4, seed=0, niter=5), earlier_cluster_dirs=[])
    run_id = tracker.start_run(name=f"m{size}", tags={"bench": "scale"})
    finish_cluster_record(tracker=tracker, mlflow_run_id=run_id, key=f"k{size}", out_dir=str(out), stage=0, k=4,
                          summary=summary)
    if per_sample_params:  # the bug the check is for: one MLflow param a sample
        tracker.log_params(run_id, {f"sample/{key}": 1 for key in ids[: size // 10]})
    return mlflow_counts(tracker, run_id)


@pytest.mark.parametrize("per_sample_params", [False, True])
def test_the_records_bound_passes_on_the_cluster_task_and_fails_on_a_per_sample_param(tmp_path, tracker,
                                                                                      per_sample_params):
    results = [StepResult(pipeline="image", step="kmeans", size=size, seconds=size * 1e-4, peak_rss=1 << 30,
                          rss_before=1 << 29, bytes_written=size * 50,
                          records=_clustered_and_recorded(tmp_path, tracker, size=size,
                                                          per_sample_params=per_sample_params))
               for size in (200, 2_000)]
    small, large = results[0].records, results[1].records
    assert small["mlflow_metric_keys"] >= 3 and small["mlflow_artifact_files"] >= 2  # kmeans/*, clusters/
    assert large["mlflow_artifact_bytes"] > small["mlflow_artifact_bytes"]  # the assignments: data, not judged
    verdict = judge(results, "image", "kmeans")
    if per_sample_params:
        assert verdict.records_ok is False
        assert any(g.startswith("mlflow_params ") for g in verdict.growing_records)
    else:
        assert verdict.records_ok, verdict.growing_records
        assert all(large[k] <= small[k] * RECORD_RATIO for k in ("mlflow_params", "mlflow_metric_points",
                                                                   "mlflow_tags"))
    text = report_markdown(results, [verdict], started="today", minutes=1.0, machine="test", sizes=[200, 2_000])
    growth = f"mlflow_params {small['mlflow_params']} -> {large['mlflow_params']}"
    assert "| image | kmeans | 2,000 |" in text and (f"| FAIL (" in text and growth in text) == per_sample_params


def test_the_measured_slopes_go_to_the_file_the_plan_grows_along(tmp_path):
    """``make bench-scale --slopes FILE``: each step judged at two sizes replaces its plan category's slope (k-means:
    ``cluster``, the re-shard: ``regroup``), a step measured at one size or another pipeline keeps the old value,
    and ``planning.model.load_slopes`` reads back what the plan scales by (issue 57: copied by hand before)."""
    from bench.scale import write_slopes
    from planning.model import load_slopes, save_slopes
    path = tmp_path / "slopes.json"
    save_slopes({("clip", "cluster"): 0.33, ("clip", "export"): 0.94, ("image", "export"): 1.0}, path=path,
                written_by="before")
    verdicts = [judge([_result(m, seconds=(m / 1e5) ** 1.5, step="kmeans") for m in (100_000, 1_000_000)],
                      "clip", "kmeans"),
                judge([_result(100_000, seconds=1.0)], "clip", "export")]  # one size: not judged, kept
    assert write_slopes(verdicts, path, started="now", machine="here") == 1
    assert load_slopes(path) == {("clip", "cluster"): 1.5, ("clip", "export"): 0.94, ("image", "export"): 1.0}
