"""`make gpu-check` (bench/gpu_check.py) on a machine without CUDA: one "not measured" line per row and exit 0;
the parts that run on a CPU (argument parsing, the baseline and the engine's SimCLR loops, MFU, the report
writer, the k-means row's refusal without a faiss GPU, the DDP row's stages and comparison, both export loops, the
CLIP runner shared with make bench, the checkpoint measurement) do what the GPU rows rely on."""
import pytest
import torch

from bench import gpu_check
from tests.components import OPEN_CLIP, require_modules


def test_without_cuda_every_row_is_not_measured_and_it_exits_0(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{row}: not measured: no CUDA device" for row in gpu_check.ROWS]


def test_rows_are_checked():
    assert gpu_check.parse_args(["--rows", "kmeans, simclr"]).rows == ["kmeans", "simclr"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--rows", "kmean"])


def test_the_baseline_and_the_engine_run_the_same_simclr_on_cpu(tmp_path):
    """Both loops, tiny (ResNet-18, 32 px, 4 images a view, 3 steps, bf16 autocast on the CPU), from the same
    initial weights: the same loss at every step (the same model, loss, views and SGD update), images/s > 0."""
    views = tuple(torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last) for _ in range(2))
    cpu = torch.device("cpu")
    theirs_losses, ours_losses = [], []
    torch.manual_seed(0)
    theirs = gpu_check.plain_simclr_steps(arch="resnet18", device=cpu, views=views, steps=2, compile=False,
                                          losses=theirs_losses)
    torch.manual_seed(0)
    ours = gpu_check.engine_simclr_steps(arch="resnet18", device=cpu, views=views, steps=2, compile=False,
                                         work=tmp_path, losses=ours_losses)
    assert theirs > 0 and ours > 0
    assert len(theirs_losses) == len(ours_losses) == 3
    # the steps after the first see the updated weights: the same update rule or the losses part
    assert ours_losses == pytest.approx(theirs_losses, rel=1e-3)
    assert theirs_losses[0] != pytest.approx(theirs_losses[2], rel=1e-3)
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
    assert "| kmeans | 2026-11-24, H100 | faiss-cpu | ok | K=10: GPU 1.0 s |" in first
    rows[0].figures["K=10"] = "GPU 0.5 s"
    gpu_check.write_report(gpu_check.report_markdown(rows, device="H100", date="2026-11-25", seconds=60), path)
    second = path.read_text()
    assert second.count("gpu-check:begin") == 1 and "GPU 0.5 s" in second and "GPU 1.0 s" not in second
    assert second.startswith("# Benchmarks\n\nthe CPU rows\n")


def test_a_run_of_some_rows_keeps_the_others_with_their_date(tmp_path):
    """`--rows clip` on a machine after a full run: the clip row is replaced, the other rows stay with the run that
    measured them; a section written before the `measured` column gets its heading's date and device."""
    path = tmp_path / "BENCHMARKS.md"
    old_format = ("# Benchmarks\n\n<!-- gpu-check:begin -->\n### `make gpu-check` on NVIDIA H200, 2026-11-26 (8.1 min)"
                  "\n\n| row | baseline | status | figures |\n|---|---|---|---|\n"
                  "| simclr | plain loop | ok | compile off: 0.98x |\n| clip | open_clip | ok | 0.66x |\n"
                  "<!-- gpu-check:end -->\n")
    path.write_text(old_format)
    builders = {"clip": lambda: gpu_check.Row(name="clip", baseline="open_clip", figures={"4 decoders": "0.95x"}),
                "kmeans": lambda: gpu_check.Row(name="kmeans", baseline="faiss-cpu", figures={"K=10": "1 s"})}
    gpu_check.run_rows(["clip"], builders=builders, report=path, device_name="NVIDIA H100")
    text = path.read_text()
    assert "| simclr | 2026-11-26, NVIDIA H200 | plain loop | ok | compile off: 0.98x |" in text
    assert "0.66x" not in text and "| 4 decoders: 0.95x |" in text and "NVIDIA H100 | open_clip | ok" in text
    gpu_check.run_rows(["kmeans"], builders=builders, report=path, device_name="NVIDIA H100")
    again = path.read_text()
    table = [line.split(" | ")[0] for line in again.splitlines() if line.startswith("| ") and "---" not in line]
    assert table == ["| row", "| kmeans", "| simclr", "| clip"]  # this run's rows, then the kept ones in ROWS order
    assert "| simclr | 2026-11-26, NVIDIA H200 |" in again and "| 4 decoders: 0.95x |" in again


def test_kmeans_without_any_gpu_says_how_to_get_one():
    import faiss
    if getattr(faiss, "get_num_gpus", lambda: 0)() > 0 or torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    row = gpu_check.kmeans_row(num=1000, dim=8, ks=(10,), compared=500)
    assert row.status == "not measured" and "faiss-gpu or a CUDA build of torch" in row.figures["why"]


def test_kmeans_row_on_a_cuda_device_without_faiss_gpu_runs_torch_against_faiss_cpu(monkeypatch):
    """CUDA simulated on the CPU (torch's Lloyd on the CPU in its place): both K, the backend named, the same
    seeds so the assignments agree."""
    import faiss

    from contrastive.mcl import clustering
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(clustering, "_cuda_device_count", lambda: 1)
    real_train_torch = clustering._train_torch
    monkeypatch.setattr(clustering, "_train_torch",
                        lambda *, device, **kwargs: real_train_torch(device=torch.device("cpu"), **kwargs))
    row = gpu_check.kmeans_row(num=5_000, dim=8, ks=(300, 10), compared=3_000)
    assert row.status == "ok" and list(row.figures) == ["K=300", "K=10"]
    for figure in row.figures.values():
        assert figure.startswith("GPU (torch-cuda) 5,000 points: ") and "on 3,000 points GPU" in figure
        assert "vs faiss-cpu" in figure
        assert float(figure.split("AMI ")[1].split(" ")[0]) > 0.95


def test_make_bench_keeps_the_gpu_rows(tmp_path):
    from bench.run_all import keep_gpu_check_section
    path = tmp_path / "BENCHMARKS.md"
    rows = [gpu_check.Row(name="simclr", baseline="plain loop", figures={"compile off": "1.05x"})]
    previous = "# Benchmarks\n\nold CPU rows\n\n" + gpu_check.report_markdown(rows, device="H100", date="2026-11-24",
                                                                            seconds=300)
    path.write_text("# Benchmarks\n\nnew CPU rows\n")  # what make bench just wrote
    keep_gpu_check_section(previous, path)
    text = path.read_text()
    assert "new CPU rows" in text and "old CPU rows" not in text
    assert "| simclr | 2026-11-24, H100 | plain loop | ok | compile off: 1.05x |" in text


def test_ddp_with_one_gpu_is_not_measured(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    row = gpu_check.ddp_row(work=tmp_path)
    assert row.status == "not measured" and row.figures["why"] == "needs 2 GPUs, 1 visible"


def test_the_ddp_stages_are_specs_a_torchrun_launch_takes(tmp_path):
    """Both stages of the DDP row round-trip through JSON (as spawned ranks receive them) and record losses."""
    from contrastive.modalities.image.steps import ImageStageSpec
    from contrastive.modalities.image_text.steps import ClipStageSpec
    image = gpu_check.image_stage_spec(dataset_dir=tmp_path, stage_dir=tmp_path / "s", pseudo_labels=tmp_path / "p",
                                       device="cuda")
    clip = gpu_check.clip_stage_spec(urls=["a.tar"], stage_dir=tmp_path / "c", device="cuda")
    assert ImageStageSpec.from_json(image.to_json()) == image and image.record_keys
    assert ClipStageSpec.from_json(clip.to_json()) == clip and clip.record_keys


def test_stage_difference_compares_losses_and_every_weight(tmp_path):
    import json
    for run, (losses, weight) in {"one": ([1.0, 0.5], 1.0), "two": ([1.0, 0.25], 1.5)}.items():
        (tmp_path / run / "model").mkdir(parents=True)
        (tmp_path / run / "keys_rank0.json").write_text(json.dumps({"losses": losses}))
        torch.save({"state_dict": {"w": torch.full((2,), weight), "steps": torch.tensor(3)}},
                   tmp_path / run / "model" / "model.pt")
    diff = gpu_check.stage_difference(single=tmp_path / "one", double=tmp_path / "two")
    assert diff == {"steps": 2, "first_loss": 0.0, "loss": 0.25, "weight": 0.5}


def test_the_export_through_the_engine_and_the_model_only_loop_on_cpu(tmp_path):
    """The export row's two sides, tiny (ResNet-18, 32 px, 10 images in batches of 4 - a short last batch):
    every row written once, and the baseline times the same model."""
    import numpy as np
    cpu = torch.device("cpu")
    model = gpu_check.resnet50_encoder(arch="resnet18", device=cpu)
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        run = gpu_check.export_through_engine(model=model, images=images, batch=4, device=cpu, precision=precision,
                                              out_dir=out)
        assert run.rows == 10 and run.seconds > 0 and run.steady > 0
        assert gpu_check.model_only_images_per_second(model=model, images=images, batch=4, device=cpu,
                                                      precision=precision) > 0
    with torch.inference_mode():
        expected = model(images.float() / 255).numpy()
    shards = sorted((tmp_path / "fp32").glob("part-*.npy"))
    written = np.concatenate([np.load(s) for s in shards])
    assert written.shape == (10, 512) and np.allclose(written, expected, atol=1e-2)


def test_the_checkpoint_stall_is_measured_on_a_real_save(tmp_path):
    stall = gpu_check.checkpoint_stall_seconds(arch="resnet18", device=torch.device("cpu"),
                                               path=tmp_path / "last.pt", saves=2)
    # ResNet-18 weights and momentum: 2 x 11.7M float32 = ~89 MB
    assert stall["seconds"] > 0 and 80 < stall["mb"] < 100


def test_clip_runs_ours_and_open_clip_train_on_the_same_shards_on_cpu(tmp_path, monkeypatch):
    """The CLIP row's runner (bench/engine_throughput.py clip_runs, the CPU row's too), tiny: the tiny ViT, 2 steps
    of 8, one round, bf16 autocast on both sides: both sides train the same steps, and each side's steady rate is
    its own batches' arrivals in the loop, first to last, which the row's time split then reports."""
    require_modules("open_clip_train", fix=OPEN_CLIP)
    import bench.engine_throughput as engine_throughput
    from contrastive.modalities.image_text.data import write_tiny_shards
    from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec
    arrivals = []  # (arrival times, batch) of each call, in order: open_clip's warm-up, then ours, then open_clip's
    real_steady_rate = engine_throughput.steady_rate

    def recorded(times, *, batch):
        arrivals.append((list(times), batch))
        return real_steady_rate(times, batch=batch)
    monkeypatch.setattr(engine_throughput, "steady_rate", recorded)
    urls = write_tiny_shards(directory=tmp_path / "shards", num_samples=16, samples_per_shard=8, image_size=32,
                             corrupt=False)["urls"]
    runs = engine_throughput.clip_runs(work=tmp_path, clip_spec=ClipSpec(model_name=TINY_MODEL,
                                                                         trainable_image_blocks=1),
                                       urls=urls, device="cpu", precision="bf16", batch=8, steps=2, rounds=1,
                                       warmup_steps=1, threads=1)
    assert [r["steps"] for r in runs["ours"]] == [2] and [r["batches"] for r in runs["open_clip"]] == [2]
    ours = runs["ours"][0]  # timed without its end-of-epoch checkpoint, as train_one_epoch writes none
    assert ours["checkpoint_seconds"] > 0 and ours["samples_per_second"] > ours["samples_per_second_with_checkpoint"]
    assert [(len(times), batch) for times, batch in arrivals] == [(1, 8), (2, 8), (2, 8)]
    for side, (times, _) in zip(("ours", "open_clip"), arrivals[1:]):  # one batch of 8 from the first to the last
        run = runs[side][0]
        assert run["steady_samples_per_second"] == pytest.approx(8 / (times[1] - times[0]))
        assert 0 < run["first_batch_s"] < run["seconds"]
    split = gpu_check.clip_time_split(runs)
    steady = [runs[side][0]["steady_samples_per_second"] for side in ("ours", "open_clip")]
    assert split.startswith(f"steady {steady[0]:,.0f} vs {steady[1]:,.0f} samples/s = {steady[0] / steady[1]:.2f}x;")
    assert "first batch after" in split and "ours waited for input" in split


def test_the_steady_rate_counts_the_batches_after_the_first_over_the_time_between_first_and_last():
    from bench.engine_throughput import steady_rate
    assert steady_rate([10.0, 10.5, 11.0, 12.0], batch=128) == 3 * 128 / 2.0
    assert steady_rate([10.0], batch=128) is None and steady_rate([], batch=128) is None


def _steady(figure: str) -> tuple[float, int]:
    """(views/s, % waited for data) of the steady windows in an input row's figure."""
    steady = figure.partition(" steady (inside epochs); ")[0]
    views, _, waited = steady.partition(" views/s, GPU waited for data ")
    return float(views.replace(",", "")), int(waited.removesuffix("%"))


def test_the_input_row_trains_a_stage_from_jpegs_per_worker_count_on_cpu(tmp_path, monkeypatch):
    """The input row as it runs on a GPU, shrunk (a small CNN at 32 px, batch 8, 2 steps, fp32): one real stage a
    worker count through train_stage, each reporting its views/s and the share it waited for data; then a stage
    with ``train.resample_on_gpu`` whose reader resamples every batch (on the CPU here, the GPU's code path) and
    the pixels of a batch resampled there against the workers'."""
    from contrastive.data import loading
    resampled = []
    real_resample = loading.resample_squares
    monkeypatch.setattr(loading, "resample_squares", lambda flat, sides, size: resampled.append(len(sides)) or
                        real_resample(flat, sides, size=size))
    row = gpu_check.input_row(device=torch.device("cpu"), work=tmp_path, workers=(0, 1), batch=8, steps=2,
                              image_size=32, arch="small_cnn", precision="fp32", epochs=2, log_every_steps=1,
                              resample_workers=(1,))
    assert list(row.figures) == ["warm-up stage", "0 workers", "1 workers", "1 workers, GPU resample",
                                 "GPU resample pixels"] and row.status == "ok"
    assert sum(resampled) == 2 * 12 + 8  # 2 epochs of the 12 training images of 16, then the pixel check's batch
    largest = int(row.figures["GPU resample pixels"].split()[1])
    assert largest <= 2, row.figures["GPU resample pixels"]
    for name in ("0 workers", "1 workers", "1 workers, GPU resample"):
        assert _steady(row.figures[name])[0] > 0
        rest = row.figures[name].partition(" steady (inside epochs); epochs' first windows waited ")[2]
        starts, _, stage = rest.partition("; ")
        assert len(starts.split(", ")) == 2 and stage.endswith("over the stage (start-up included)")
    summary = (tmp_path / "input" / "w1" / "train_summary.json").read_text()
    assert '"steps": 4' in summary and '"epochs": 2' in summary and '"global_batch": 8' in summary
    spec = gpu_check.input_stage_spec(dataset_dir=tmp_path, stage_dir=tmp_path, workers=8, device="cuda", batch=256,
                                      steps=16)
    assert spec.model["encoder"] == "resnet50" and spec.model["stem"] == "imagenet" and spec.workers == 8
    assert spec.loop.precision == "bf16" and spec.loop.channels_last and spec.augment["crop_scale"] == (0.08, 1.0)


@pytest.mark.parametrize("slow", ["feed", "step"])
def test_the_input_rows_wait_share_is_the_time_the_step_waited_for_its_batch(tmp_path, monkeypatch, slow):
    """0.4 s added to every batch's read: the steady windows wait for data most of the time; 0.4 s added to every
    step instead: the next batch is read while the step runs, and the wait is near zero."""
    import time

    from contrastive.modalities.image import steps as stages
    from contrastive.modalities.image.adapter import ImageContrastiveTask
    if slow == "feed":
        real_read = stages.read_image_batches

        def read_slowly(**kwargs):
            for batch in real_read(**kwargs):
                time.sleep(0.4)
                yield batch
        monkeypatch.setattr(stages, "read_image_batches", read_slowly)
    else:
        real_inputs = ImageContrastiveTask.inputs
        monkeypatch.setattr(ImageContrastiveTask, "inputs",
                            lambda self, batch, **kwargs: time.sleep(0.4) or real_inputs(self, batch, **kwargs))
    row = gpu_check.input_row(device=torch.device("cpu"), work=tmp_path, workers=(0,), batch=8, steps=3,
                              image_size=32, arch="small_cnn", precision="fp32", epochs=1, log_every_steps=1,
                              resample_workers=())
    waited = _steady(row.figures["0 workers"])[1]
    assert waited >= 60 if slow == "feed" else waited <= 15, row.figures["0 workers"]


def test_the_input_row_names_its_cuda_device_as_the_config_does(tmp_path, monkeypatch):
    """On a GPU the row runs on torch.device("cuda", 0); its stages get the config's device name ("cuda"), which
    device_for accepts ("cuda:0" is a ConfigError)."""
    from contrastive.data import loading
    from contrastive.engine.distributed import DEVICES
    from contrastive.modalities.image import steps as stages
    specs = []
    unpatched = []  # whether the stage reads the real resample_device (nothing patched on a GPU)
    monkeypatch.setattr(stages, "train_stage", lambda spec, callbacks=(): specs.append(spec) or unpatched.append(
        stages.resample_device is loading.resample_device) or {"views_per_second": 1.0, "data_wait_share": 0.0})
    monkeypatch.setattr(gpu_check, "resampled_pixel_difference", lambda **_: (0, 0.0))  # reads on the GPU
    gpu_check.input_row(device=torch.device("cuda", 0), work=tmp_path, workers=(4,), batch=2, steps=2,
                        image_size=16, arch="small_cnn", precision="fp32", log_every_steps=1, resample_workers=(4,))
    # the warm-up, the timed, the timed with train.resample_on_gpu (resample_device not patched on CUDA)
    assert [spec.device for spec in specs] == ["cuda", "cuda", "cuda"] and "cuda" in DEVICES
    assert [spec.resample_on_gpu for spec in specs] == [False, False, True]
    assert unpatched == [True, True, True]


def test_the_report_is_rewritten_after_every_row(tmp_path):
    """A run stopped after its first row (a command limit) leaves that row in BENCHMARKS.md marked partial; a row
    that raises is a failed row and the next still runs."""
    path = tmp_path / "BENCHMARKS.md"
    seen = []

    def second():
        seen.append(path.read_text())
        raise RuntimeError("CUDA error: out of memory")

    builders = {"kmeans": lambda: gpu_check.Row(name="kmeans", baseline="faiss-cpu", figures={"K=10": "GPU 1.0 s"}),
                "export": second}
    rows = gpu_check.run_rows(["kmeans", "export"], builders=builders, report=path, device_name="H100")
    assert "1 of 2 rows so far" in seen[0] and " H100 | faiss-cpu | ok | K=10: GPU 1.0 s |" in seen[0]
    assert [row.status for row in rows] == ["ok", "failed"]
    final = path.read_text()
    assert "rows so far" not in final and " H100 |  | failed | error: RuntimeError: CUDA error: out of memory |" \
        in final


def test_a_gpu_this_torch_cannot_use_fails_with_the_fix(capsys, monkeypatch):
    """nvidia-smi lists a GPU but torch's build cannot use it (a driver older than its CUDA): not "no CUDA device"
    and exit 0, but the mismatch, its fix and a failing exit."""
    from contrastive.engine import device as device_module
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module, "nvidia_smi_gpus", lambda: ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"])
    monkeypatch.setattr(device_module, "driver_version", lambda: "535.104")
    assert gpu_check.main([]) == 2
    out = capsys.readouterr().out
    assert "nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA H100 80GB HBM3, driver 535.104)" in out and "R580" in out
    assert "not measured" not in out


# ---------------------------------------------------------------------------------------------------- dry run
#: Rows of the dry run left to make test-slow: the Table 4 pipeline, and DDP's four spawned processes (minutes here).
SLOW_ROWS = ("ddp", "table4")
#: The pipeline row's dry run is tests/bench/test_on_device.py's (slow), from the bundle as a lent machine runs it.
ON_DEVICE_ROWS = ("pipeline",)
FAST_ROWS = [row for row in gpu_check.ROWS if row not in SLOW_ROWS + ON_DEVICE_ROWS]


def _table(report) -> dict[str, list[str]]:
    """row name -> its cells, from the gpu-check section of a report."""
    lines = [line for line in report.read_text().splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0]: cells for cells in (gpu_check._cells(line) for line in lines[1:])}


def test_the_dry_run_runs_every_row_on_the_cpu_into_its_own_report(tmp_path, monkeypatch, capsys):
    """`make gpu-check DRY=1`: every row (SLOW_ROWS in the slow test below, ON_DEVICE_ROWS in the on-device test)
    runs on the CPU at
    DRY_SIZES through the row functions a GPU runs, each comes out ok in a report of its own; BENCHMARKS.md is not
    touched (no --report: a temporary one)."""
    from tests.bench.test_on_device import ROWS as on_device
    assert set(ON_DEVICE_ROWS) <= set(on_device.split(","))  # every row is run somewhere
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "dry.md"
    assert gpu_check.main(["--dry-run", "--rows", ",".join(FAST_ROWS), "--report", str(report)]) == 0
    table = _table(report)
    assert list(table) == FAST_ROWS
    assert all(cells[1].endswith("CPU (dry run, toy sizes)") and cells[3] == "ok" for cells in table.values()), table
    assert "2 decoders" in table["clip"][4] and "AMI" in table["kmeans"][4]
    assert "mclpipe-tiny-vit, the CC12M preset's step: random init" in table["clip"][4]  # the ViT-L-14 part
    assert "1 workers, GPU resample" in table["input"][4] and "GPU resample pixels" in table["input"][4]
    assert capsys.readouterr().out.rstrip().endswith(f"{len(FAST_ROWS)} rows ran on the CPU and the GPU sizes check out")
    assert gpu_check.main(["--dry-run", "--rows", "host_syncs"]) == 0 and not (tmp_path / "BENCHMARKS.md").exists()


def test_the_dry_run_fails_on_the_gpu_runs_clip_shards_for_its_workers(tmp_path, monkeypatch, capsys):
    """The mistake that lost a GPU run's clip row (10 shards for 12 open_clip workers) fails the dry run from the GPU
    sizes alone, and the row itself refuses such sizes before writing a shard."""
    import functools
    # 20 steps x 128 / 256 samples a shard = 10 shards, for the GPU run's 4 and 12 workers
    monkeypatch.setitem(gpu_check.ROW_FUNCTIONS, "clip", functools.partial(gpu_check.clip_row, steps=20))
    monkeypatch.setitem(gpu_check.DRY_SIZES, "clip", {**gpu_check.DRY_SIZES["clip"], "decoders": (1, 3)})
    assert gpu_check.main(["--dry-run", "--rows", "clip", "--report", str(tmp_path / "dry.md")]) == 1
    out = capsys.readouterr().out
    assert "clip: the GPU run's sizes: clip: 10 shards for 4 and 12 open_clip workers" in out
    assert "clip: failed in the dry run: SizeError: clip: 2 shards for 3 open_clip workers" in out
    assert not (tmp_path / "clip").exists()


def test_the_large_clip_rate_trains_the_preset_s_step_and_makes_the_cc12m_hours_of_it():
    """The ViT-L-14 part of the clip row, with the tiny ViT on the CPU: the engine trains every step of one
    synthetic batch; the steady rate turns into clip_cc12m_vitl14's hours on 8 GPUs (240M samples a stage)."""
    rate = gpu_check.clip_model_rate(model="mclpipe-tiny-vit", batch=4, steps=4, image_size=32, trainable_blocks=1,
                                     device="cpu", precision="bf16", warmup=1)
    assert rate["steps"] == 4 and rate["samples_per_second"] > 0
    figure = gpu_check.clip_cost_figure({**rate, "samples_per_second": 1000.0})
    assert "1,000 samples/s steady" in figure and "8.3 h a stage, 33.3 h for 4 stages" in figure


@pytest.mark.parametrize("sizes, wrong", [
    (dict(steps=48, batch=128, samples_per_shard=256, decoders=(4, 12)), None),
    (dict(steps=40, batch=128, samples_per_shard=256, decoders=(4, 12)), "20 shards for 12"),  # 8 workers get 2
    (dict(steps=48, batch=128, samples_per_shard=200, decoders=(4,)), "whole shards"),
    (dict(steps=48, batch=96, samples_per_shard=256, decoders=(4,)), "whole shards"),  # 256 is not whole batches
])
def test_clip_sizes_give_every_open_clip_worker_the_same_whole_batches(sizes, wrong):
    if wrong is None:
        gpu_check.check_sizes("clip", **sizes)
    else:
        with pytest.raises(gpu_check.SizeError, match=wrong):
            gpu_check.check_sizes("clip", **sizes)


def test_every_rows_gpu_sizes_check_out_and_a_wrong_preset_setting_does_not():
    for row in gpu_check.ROWS:
        gpu_check.check_sizes(row, **gpu_check.gpu_sizes(row))
    assert gpu_check.gpu_sizes("table4")["preset"] == "paper_table4_trifeature_quick"
    with pytest.raises(gpu_check.SizeError, match="does not load"):
        gpu_check.check_sizes("table4", preset="paper_table4_trifeature_quick", overrides=("train.epoch=2",))
    with pytest.raises(gpu_check.SizeError, match="no steady window"):
        gpu_check.check_sizes("input", steps=4, log_every_steps=4, workers=(4,))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a whole pipeline with its own Prefect server: 6.7 min for table4 on the loaded 2 cores
@pytest.mark.parametrize("row", SLOW_ROWS)
def test_the_dry_run_of_the_pipeline_and_ddp_rows(tmp_path, row):
    """DDP's stages under gloo and the Table 4 quick preset (ResNet-18, K = 5, 2 of its 3 stages + control,
    at 2 steps a stage of 1,000 images of 16 px) end to end on the CPU, one test each (minutes each here); the
    table4 row reads the results table and the stages' rates."""
    report = tmp_path / "dry.md"
    assert gpu_check.main(["--dry-run", "--rows", row, "--report", str(report)]) == 0
    cells = _table(report)[row]
    assert cells[3] == "ok"
    figures = cells[4]
    if row == "ddp":
        # the ranks' shares of the first batch make the single process's forward: the same loss to rounding
        first = [float(part.split("first-step loss difference ")[1].split(",")[0]) for part in figures.split(";")]
        assert len(first) == 2 and max(first) <= gpu_check.FIRST_STEP_TOLERANCE["cpu"], figures
    if row == "table4":
        assert "stage 0: shape " in figures and "(paper 0.44)" in figures and "MCL concat: shape " in figures
        assert "3 stages of 1 epochs" in figures and "h on 8 (ideal scaling)" in figures  # 2 MCL + 1 control


def test_the_table4_quick_preset_is_the_papers_setting_with_fewer_epochs():
    """paper_table4_trifeature_quick differs from paper_table4_trifeature (the paper's Table 4 at tau 0.5) in its
    name, its epochs and bf16 autocast only."""
    from pipeline_config.loader import load_config
    full = load_config("paper_table4_trifeature").model_dump(mode="json")
    quick = load_config("paper_table4_trifeature_quick").model_dump(mode="json")
    assert quick["train"]["epochs"] == 2 and quick["train"]["precision"] == "bf16"
    assert full["train"]["epochs"] == gpu_check.FULL_EPOCHS == 200
    for config in (full, quick):
        config.pop("name"), config.pop("sweep", None), config["train"].pop("epochs"), config["train"].pop("precision")
    assert quick == full
    assert full["method"]["temperature"] == 0.5 and full["mcl"]["clusters"] == 5 and full["mcl"]["control"]
    assert full["model"]["encoder"] == "resnet18" and full["model"]["stem"] == "cifar"
