"""bench/framework_overhead.py's rows at toy sizes (the benchmark itself runs in `make bench`): each side trains
or exports what it is given, and the rows compute their ratios from the runs, so the code cannot rot."""
import numpy as np
import pytest
import torch

from bench import framework_overhead as fo


def test_the_zero_cost_encoder_is_a_channel_mean_times_a_matrix():
    model = fo.ZeroCostEncoder()
    images = torch.rand(5, 3, 4, 4)
    expected = images.mean(dim=(2, 3)) @ model.weight
    assert torch.allclose(model(images), expected) and model(images).shape == (5, 8)


def test_the_export_row_writes_every_image_and_compares_both_rates(tmp_path):
    row = fo.export_row(work=tmp_path, num=40, batch=16, size=8, rounds=2)
    assert row.ratio > 0 and row.passed in (True, False) and row.status == "ok"
    assert row.notes[0].startswith("images/s (whole call): ours ") and "runs " in row.notes[0]
    assert row.notes[1].startswith("steady rate (first to last batch written): ours ")
    assert not list(tmp_path.glob("export-*"))  # each run's shards removed after it


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
    pytest.importorskip("open_clip_train")
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
