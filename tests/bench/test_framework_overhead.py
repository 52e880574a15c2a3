"""bench/framework_overhead.py's rows at toy sizes (the benchmark itself runs in `make bench`): each side trains
or exports what it is given, and the rows compute their ratios from the runs, so the code cannot rot."""
import numpy as np
import pytest
import torch

from bench import framework_overhead as fo
from tests.components import OPEN_CLIP, require_modules


def test_the_zero_cost_encoder_is_a_channel_mean_times_a_matrix():
    model = fo.ZeroCostEncoder()
    images = torch.rand(5, 3, 4, 4)
    expected = images.mean(dim=(2, 3)) @ model.weight
    assert torch.allclose(model(images), expected) and model(images).shape == (5, 8)


def test_the_export_row_writes_every_image_and_compares_both_rates(tmp_path, monkeypatch):
    from statistics import median

    import bench.gpu_check
    ours, bare = [], []
    real_export, real_bare = bench.gpu_check.export_through_engine, fo.bare_export_seconds

    def spied_export(**kwargs):
        ours.append(real_export(**kwargs))
        return ours[-1]

    def spied_bare(**kwargs):
        bare.append((len(kwargs["images"]), real_bare(**kwargs)))
        return bare[-1][1]
    monkeypatch.setattr(bench.gpu_check, "export_through_engine", spied_export)
    monkeypatch.setattr(fo, "bare_export_seconds", spied_bare)
    row = fo.export_row(work=tmp_path, num=40, batch=16, size=8, rounds=2)
    timed_ours, timed_bare = ours[1:], [n / s for n, s in bare[1:]]  # the first call of each side is the warm-up
    assert [run.rows for run in ours] == [32, 40, 40] and [n for n, _ in bare] == [32, 40, 40]
    whole, steady, theirs = (median(r.rows / r.seconds for r in timed_ours), median(r.steady for r in timed_ours),
                             median(timed_bare))
    assert np.isclose(row.ratio, whole / theirs) and row.status == "ok"
    assert row.passed is (whole / theirs >= 0.9 and steady / theirs >= 0.9)
    assert f"= {steady / theirs:.2f}x the bare loop" in row.notes[1]
    assert row.notes[0].startswith("images/s (whole call): ours ") and "runs " in row.notes[0]
    assert row.notes[1].startswith("steady rate (first to last batch written): ours ")
    assert not list(tmp_path.glob("export-*"))  # each run's shards removed after it


def _export_at(steady: float):
    """A stand-in for the export adapter: its whole call at 10 images/s for 10 images, ``steady`` images/s after
    the first batch, its output folder made (the row removes it)."""
    import bench.gpu_check

    def export(**kwargs):
        kwargs["out_dir"].mkdir(parents=True)
        return bench.gpu_check.ExportRun(rows=len(kwargs["images"]), seconds=len(kwargs["images"]) / 10, steady=steady)
    return export


def test_the_export_row_fails_when_its_steady_rate_is_below_the_goal_though_its_whole_call_passes(tmp_path,
                                                                                                   monkeypatch):
    import bench.gpu_check
    monkeypatch.setattr(fo, "bare_export_seconds", lambda **kwargs: len(kwargs["images"]) / 10)  # 10 images/s
    monkeypatch.setattr(bench.gpu_check, "export_through_engine", _export_at(steady=8.0))
    row = fo.export_row(work=tmp_path / "slow", num=10, batch=5, size=4, rounds=1)
    assert np.isclose(row.ratio, 1.0) and row.passed is False  # whole call 1.0x, steady 0.8x the bare loop
    monkeypatch.setattr(bench.gpu_check, "export_through_engine", _export_at(steady=9.0))
    assert fo.export_row(work=tmp_path / "at_goal", num=10, batch=5, size=4, rounds=1).passed is True  # 0.9x


def test_the_export_rows_bare_loop_runs_the_same_model_on_every_batch():
    calls = []

    class Counting(torch.nn.Module):
        def forward(self, x):
            calls.append((x.dtype, len(x), float(x.max())))
            return x.mean(dim=(2, 3))
    images = torch.full((10, 3, 2, 2), 255, dtype=torch.uint8)
    assert fo.bare_export_seconds(model=Counting(), images=images, batch=4) > 0
    assert calls == [(torch.float32, 4, 1.0), (torch.float32, 4, 1.0), (torch.float32, 2, 1.0)]


def test_the_clip_rows_train_the_same_steps_through_both_loops(tmp_path):
    require_modules("open_clip_train", fix=OPEN_CLIP)
    rows = fo.clip_rows(work=tmp_path, samples=32, batch=8, samples_per_shard=8, workers=(2,), rounds=1,
                        warmup_steps=1)
    assert [r.name.rsplit(", ", 1)[1] for r in rows] == ["2 worker(s)"]
    assert all(r.ratio > 0 and "4 steps" in r.workload for r in rows)


def test_the_clip_rows_refuse_shards_open_clip_cannot_share_among_its_workers(tmp_path):
    from bench.gpu_check import SizeError
    with pytest.raises(SizeError, match="3 shards for 2 open_clip workers"):
        fo.clip_rows(work=tmp_path, samples=24, batch=8, samples_per_shard=8, workers=(2,), rounds=1)
    assert not (tmp_path / "shards").exists()


def test_the_unimodal_rows_run_both_loops_at_each_thread_count(tmp_path):
    rows = fo.unimodal_rows(work=tmp_path, num_images=128, rounds=1, threads=(1,))
    assert len(rows) == 1 and rows[0].ratio > 0 and "2 steps" in rows[0].workload
    assert rows[0].goal == ">= 1.0x (images/s)"


def test_the_ratio_is_of_the_medians_and_the_goal_decides_the_verdict():
    row = fo._ratio_result(name="n", workload="w", baseline="b", ours=[10.0, 30.0, 20.0], theirs=[20.0, 20.0, 25.0],
                           goal="g", least=1.0)
    assert row.ratio == 1.0 and row.passed is True
    strict = fo._ratio_result(name="n", workload="w", baseline="b", ours=[20.0], theirs=[20.0], goal="g", least=1.0,
                              strictly=True)
    assert strict.passed is False and np.isclose(strict.ratio, 1.0)
