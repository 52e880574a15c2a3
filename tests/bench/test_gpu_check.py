"""`make gpu-check` (bench/gpu_check.py) on a machine without CUDA: one "not measured" line per row and exit 0;
the parts that run on a CPU (argument parsing, the baseline and the engine's SimCLR loops, MFU, the report
writer, the k-means row's refusal without a faiss GPU) do what the GPU rows rely on."""
import pytest
import torch

from bench import gpu_check


def test_without_cuda_every_row_is_not_measured_and_it_exits_0(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{row}: not measured: no CUDA device" for row in gpu_check.ROWS]


def test_rows_are_checked():
    assert gpu_check.parse_args(["--rows", "kmeans, simclr"]).rows == ["kmeans", "simclr"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--rows", "kmean"])


def test_the_baseline_and_the_engine_run_the_same_simclr_on_cpu(tmp_path):
    """Both loops, tiny (ResNet-18, 32 px, 4 images a view, 2 steps, bf16 autocast on the CPU): images/s > 0."""
    views = tuple(torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last) for _ in range(2))
    cpu = torch.device("cpu")
    theirs = gpu_check.plain_simclr_steps(arch="resnet18", device=cpu, views=views, steps=2, compile=False)
    ours = gpu_check.engine_simclr_steps(arch="resnet18", device=cpu, views=views, steps=2, compile=False,
                                         work=tmp_path)
    assert theirs > 0 and ours > 0
    model, _ = gpu_check.simclr_parts(arch="resnet18", device=cpu)
    assert model.fc[-1].out_features == 128 and model.conv1.weight.is_contiguous(memory_format=torch.channels_last)


def test_mfu_uses_the_dense_bf16_peak_of_the_device():
    # 1,000 img/s of ResNet-50 training = 24.6 TFLOP/s = 2.49 % of an H100's 989 TFLOP/s
    assert gpu_check.mfu(images_per_second=1000, device_name="NVIDIA H100 80GB HBM3") == pytest.approx(0.02487, abs=1e-4)
    assert gpu_check.mfu(images_per_second=1000, device_name="Some GPU") is None


def test_the_report_replaces_its_own_section_only(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\nthe CPU rows\n")
    rows = [gpu_check.Row(name="kmeans", baseline="faiss-cpu", figures={"K=10": "GPU 1.0 s"})]
    gpu_check.write_report(gpu_check.report_markdown(rows, device="H100", date="2026-11-24", seconds=60), path)
    first = path.read_text()
    assert first.startswith("# Benchmarks\n\nthe CPU rows\n\n<!-- gpu-check:begin -->")
    assert "| kmeans | faiss-cpu | ok | K=10: GPU 1.0 s |" in first
    rows[0].figures["K=10"] = "GPU 0.5 s"
    gpu_check.write_report(gpu_check.report_markdown(rows, device="H100", date="2026-11-25", seconds=60), path)
    second = path.read_text()
    assert second.count("gpu-check:begin") == 1 and "GPU 0.5 s" in second and "GPU 1.0 s" not in second
    assert second.startswith("# Benchmarks\n\nthe CPU rows\n")


def test_kmeans_without_a_faiss_gpu_says_how_to_get_one():
    import faiss
    if getattr(faiss, "get_num_gpus", lambda: 0)() > 0:
        pytest.skip("this faiss has a GPU")
    row = gpu_check.kmeans_row(num=1000, dim=8)
    assert row.status == "not measured" and "install faiss-gpu" in row.figures["why"]


def test_make_bench_keeps_the_gpu_rows(tmp_path):
    from bench.run_all import keep_gpu_check_section
    path = tmp_path / "BENCHMARKS.md"
    rows = [gpu_check.Row(name="simclr", baseline="plain loop", figures={"compile off": "1.05x"})]
    previous = "# Benchmarks\n\nold CPU rows\n\n" + gpu_check.report_markdown(rows, device="H100", date="2026-11-24",
                                                                            seconds=300)
    path.write_text("# Benchmarks\n\nnew CPU rows\n")  # what make bench just wrote
    keep_gpu_check_section(previous, path)
    text = path.read_text()
    assert "new CPU rows" in text and "old CPU rows" not in text and "| simclr | plain loop | ok | compile off: 1.05x |" in text
