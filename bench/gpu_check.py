"""`make gpu-check`: the acceptance rows of a CUDA machine (issue 24), each against a baseline measured side by
side in the same invocation, written into BENCHMARKS.md with the device and the date.

Rows (``--rows`` picks some):

- ``pipeline``: the tiny pipeline end to end with ``device=cuda`` (must pass): wall time and where it trained
  (the ``environment`` every stage records: device, backend, torch / CUDA / driver, GPU).
- ``simclr``: ResNet-50 SimCLR, bf16, channels_last, synthetic 224 px views, the engine's loop against a plain
  PyTorch loop with the same model, loss, optimizer, autocast and memory format; compile off and on: images/s
  ratio (goal >= 1.0x) and MFU.
- ``kmeans``: faiss k-means of 1M x 256 points, K = 20,000 and K = 10, on the GPU against faiss-cpu on the same
  data: seconds and the AMI between the two assignments (faiss's wiki: 55 s for K = 20,000 on one P100).
- ``host_syncs``: host reads per training step of the engine outside logging (goal <= 1).

Not yet here (issue 24 lists them): DDP equivalence under NCCL (needs 2 GPUs), CLIP against ``open_clip_train``,
export against a model-only inference loop. On a machine without CUDA every row prints
"not measured: no CUDA device" and the command exits 0, so CI runs it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from contrastive.engine.task import StageTask

ROWS = ("pipeline", "simclr", "kmeans", "host_syncs")
#: Dense bf16 tensor-core peak (FLOP/s) by device-name fragment, for MFU.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
#: ResNet-50 at 224 px: 4.1 GMACs a forward pass = 8.2 GFLOP; a training step ~3x (forward + backward).
RESNET50_TRAIN_FLOP_PER_IMAGE = 3 * 8.2e9
MARK_BEGIN, MARK_END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"


@dataclass
class Row:
    name: str
    baseline: str
    figures: dict[str, str] = field(default_factory=dict)
    status: str = "ok"  # ok | not measured | failed


# ---------------------------------------------------------------------------------------------------- simclr
def simclr_parts(*, arch: str, device: torch.device, projection_dim: int = 128):
    """(model, optimizer) of SimCLR on a torchvision ResNet: backbone with its classifier replaced by a 2-layer
    projection head, channels_last, on ``device`` (the same for ours and the baseline)."""
    import torchvision
    backbone = getattr(torchvision.models, arch)(weights=None)
    width = backbone.fc.in_features
    backbone.fc = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                      torch.nn.Linear(width, projection_dim))
    model = backbone.to(device, memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def plain_simclr_steps(*, arch: str, device: torch.device, views: tuple[torch.Tensor, torch.Tensor], steps: int,
                       compile: bool) -> float:
    """The baseline: a plain loop a competent user writes (bf16 autocast, channels_last, set_to_none), images/s
    over ``steps`` after a warm-up step."""
    from contrastive.methods.losses import nt_xent
    model, opt = simclr_parts(arch=arch, device=device)
    forward = torch.compile(model) if compile else model

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = nt_xent(z1=forward(views[0]), z2=forward(views[1]), temperature=0.2)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return _images_per_second(step, steps=steps, images=2 * len(views[0]), device=device)


class _SyntheticViews:
    """A batch source of the same two view tensors every step (no input cost: the model side alone)."""

    def __init__(self, views: tuple[torch.Tensor, torch.Tensor], steps: int):
        self.views, self.steps = views, steps

    def __len__(self) -> int:
        return self.steps

    def batches(self, *, epoch: int, start: int):
        for _ in range(start, self.steps):
            yield _ViewBatch(self.views)


@dataclass
class _ViewBatch:
    views: tuple[torch.Tensor, torch.Tensor]

    def __len__(self) -> int:
        return len(self.views[0])

    def take(self, n: int) -> "_ViewBatch":
        return _ViewBatch((self.views[0][:n], self.views[1][:n]))

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in range(len(self))]


def engine_simclr_steps(*, arch: str, device: torch.device, views: tuple[torch.Tensor, torch.Tensor], steps: int,
                        compile: bool, work: Path) -> float:
    """Ours: the same model and loss through ``contrastive.engine.loop.train`` (bf16, channels_last, its
    checkpoint at the end only), images/s over the run's steady part."""
    from contrastive.engine.loop import train
    from contrastive.engine.task import LoopSpec, OptimSpec, StageTask
    from contrastive.methods.losses import nt_xent
    model, _ = simclr_parts(arch=arch, device=device)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, view1, view2):
            return nt_xent(z1=self.model(view1), z2=self.model(view2), temperature=0.2), {}

    class Task(StageTask):
        def __init__(self):
            self.model = Step()

        def forward_module(self):
            return self.model

        def inputs(self, batch, *, device, step):
            return {"view1": batch.views[0], "view2": batch.views[1]}

    arrivals: list[float] = []

    class Clock:
        def on_step(self, *, step, epoch, metrics):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            arrivals.append(time.perf_counter())

        def on_epoch_end(self, **_):
            pass

        def on_checkpoint(self, **_):
            pass
    train(task=Task(), source=_SyntheticViews(views, steps + 1),
          optim=OptimSpec(name="sgd", lr=0.1, momentum=0.9, schedule="constant"),
          loop=LoopSpec(epochs=1, precision="bf16", channels_last=True, compile=compile, log_every_steps=1,
                        checkpoint_every_steps=10 ** 9, stall_seconds=None),
          device=device, checkpoint_path=work / "simclr" / "last.pt", callbacks=[Clock()])
    # from the end of the warm-up step to the end of the last: the same span the baseline times
    return 2 * len(views[0]) * (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def _images_per_second(step: Callable[[], None], *, steps: int, images: int, device: torch.device) -> float:
    step()  # warm-up: cuDNN autotuning, compilation
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return images * steps / (time.perf_counter() - started)


def mfu(*, images_per_second: float, device_name: str) -> float | None:
    """Model FLOPs utilisation of ResNet-50 training: achieved FLOP/s over the device's dense bf16 peak."""
    peak = next((value for fragment, value in PEAK_BF16.items() if fragment in device_name), None)
    return None if peak is None else images_per_second * RESNET50_TRAIN_FLOP_PER_IMAGE / peak


def simclr_row(*, device: torch.device, work: Path, batch: int = 256, steps: int = 30) -> Row:
    views = tuple(torch.randn(batch, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
                  for _ in range(2))
    row = Row(name="simclr", baseline="plain PyTorch loop, same model / loss / SGD / bf16 autocast / channels_last")
    name = torch.cuda.get_device_name(device)
    for compile in (False, True):
        theirs = plain_simclr_steps(arch="resnet50", device=device, views=views, steps=steps, compile=compile)
        ours = engine_simclr_steps(arch="resnet50", device=device, views=views, steps=steps, compile=compile,
                                   work=work / f"compile{int(compile)}")
        utilisation = mfu(images_per_second=ours, device_name=name)
        row.figures[f"compile {'on' if compile else 'off'}"] = (
            f"{ours:,.0f} vs {theirs:,.0f} img/s = {ours / theirs:.2f}x"
            + (f", MFU {100 * utilisation:.0f}%" if utilisation is not None else ""))
    return row


# ---------------------------------------------------------------------------------------------------- k-means
def clustered_points(*, num: int, dim: int, centers: int, seed: int = 0):
    """float32 (num, dim) points around ``centers`` random centres (k-means has structure to find)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((centers, dim)).astype(np.float32)
    return means[rng.integers(0, centers, num)] + 0.5 * rng.standard_normal((num, dim)).astype(np.float32)


def kmeans_row(*, num: int = 1_000_000, dim: int = 256) -> Row:
    import faiss

    from contrastive.mcl.clustering import adjusted_mutual_information, kmeans
    row = Row(name="kmeans", baseline="faiss-cpu on the same points (faiss wiki: K=20,000 in 55 s on a P100)")
    if not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0:
        row.status = "not measured"
        row.figures["why"] = "faiss sees no GPU: install faiss-gpu (docs/operating.md, GPU installs)"
        return row
    points = clustered_points(num=num, dim=dim, centers=1000)
    for k in (20_000, 10):
        seconds = {}
        results = {}
        for on_gpu in (True, False):
            started = time.perf_counter()
            results[on_gpu] = kmeans(features=points, k=k, seed=0, niter=20, spherical=False, use_gpu=on_gpu,
                                     init="random")
            seconds[on_gpu] = time.perf_counter() - started
        ami = adjusted_mutual_information(a=results[True].assignments, b=results[False].assignments)
        row.figures[f"K={k:,}"] = f"GPU {seconds[True]:.1f} s, CPU {seconds[False]:.1f} s, AMI {ami:.3f}"
    return row


# ---------------------------------------------------------------------------------------------------- the rest
def pipeline_row(*, work: Path) -> Row:
    row = Row(name="pipeline", baseline="must pass")
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("mclpipe")), "run", "trifeature_tiny", "--set",
                           "device=cuda", "--set", f"output_dir={work / 'runs'}", "--set",
                           f"data.cache_dir={work / 'data'}", "--set",
                           f"tracking.uri=sqlite:///{work / 'mlflow.db'}"], capture_output=True, text=True,
                          cwd=work)
    row.figures["wall time"] = f"{time.perf_counter() - started:.0f} s"
    if done.returncode != 0:
        row.status = "failed"
        row.figures["error"] = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return row
    summary = next((work / "runs" / "steps").glob("train0-*/train_summary.json"))
    row.figures["trained on"] = ", ".join(f"{k} {v}" for k, v in json.loads(summary.read_text())["environment"].items())
    return row


READS = ("item", "__bool__", "__float__", "__int__", "tolist")  # each waits for the GPU's queued kernels


@dataclass
class _Rows:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)

    def take(self, n: int) -> "_Rows":
        return _Rows(self.x[:n], self.y[:n])

    @property
    def keys(self) -> list[str]:
        return [str(i) for i in range(len(self))]


class RegressionRows:
    """``steps`` batches of 4 rows of a fixed linear regression, on ``device``."""

    def __init__(self, *, steps: int, device: torch.device):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(4 * steps, 3, generator=gen).to(device)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5], device=device)
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def batches(self, *, epoch: int, start: int):
        for index in range(start, self.steps):
            yield _Rows(self.x[4 * index:4 * index + 4], self.y[4 * index:4 * index + 4])


class QuietLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, x, y):
        return ((self.linear(x).squeeze(1) - y) ** 2).mean(), {}


class QuietTask(StageTask):
    """A linear regression whose forward reads nothing on the host (no metrics): the loop's own reads count."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = QuietLoss()

    def forward_module(self):
        return self.model

    def inputs(self, batch, *, device, step):
        return {"x": batch.x, "y": batch.y}


def host_reads_per_step(*, device: torch.device, steps: int = 60, accumulation: int = 1) -> float:
    """Host reads (READS, patched to count) per optimizer step of the engine's loop on ``device``, outside
    logging and checkpointing; one epoch, so its end adds two (the epoch's mean loss and the last loss)."""
    from contrastive.engine.loop import train
    from contrastive.engine.task import LoopSpec, OptimSpec
    counts = {"n": 0}
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(original):
        def read(self, *args, **kwargs):
            counts["n"] += 1
            return original(self, *args, **kwargs)
        return read
    with tempfile.TemporaryDirectory() as work:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counted(original))
        try:
            train(task=QuietTask(), source=RegressionRows(steps=steps * accumulation, device=device),
                  optim=OptimSpec(name="sgd", lr=0.01, schedule="constant"),
                  loop=LoopSpec(epochs=1, log_every_steps=10 ** 6, checkpoint_every_steps=10 ** 6,
                                grad_accumulation=accumulation), device=device, checkpoint_path=Path(work) / "last.pt")
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
    return counts["n"] / steps


def host_syncs_row(*, device: torch.device) -> Row:
    return Row(name="host_syncs", baseline="goal <= 1 per step outside logging",
               figures={"reads per step": f"{host_reads_per_step(device=device):.2f}"})


# ---------------------------------------------------------------------------------------------------- report
def report_markdown(rows: list[Row], *, device: str, date: str, seconds: float) -> str:
    lines = [MARK_BEGIN, f"### `make gpu-check` on {device}, {date} ({seconds / 60:.1f} min)", "",
             "| row | baseline | status | figures |", "|---|---|---|---|"]
    for row in rows:
        figures = "; ".join(f"{k}: {v}" for k, v in row.figures.items()) or "-"
        lines.append(f"| {row.name} | {row.baseline} | {row.status} | {figures} |")
    return "\n".join([*lines, MARK_END]) + "\n"


def write_report(markdown: str, path: Path) -> None:
    """Replace the gpu-check section of ``path`` (between its markers), or append one."""
    text = path.read_text() if path.exists() else ""
    if MARK_BEGIN in text and MARK_END in text:
        before, rest = text.split(MARK_BEGIN, 1)
        text = before + markdown + rest.split(MARK_END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + markdown
    path.write_text(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--report", type=Path, default=Path("BENCHMARKS.md"), help="where the table goes")
    args = parser.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}: use {', '.join(ROWS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        for name in args.rows:
            print(f"{name}: not measured: no CUDA device")
        return 0
    device = torch.device("cuda", 0)
    started = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        builders = {"pipeline": lambda: pipeline_row(work=work / "pipeline"),
                    "simclr": lambda: simclr_row(device=device, work=work),
                    "kmeans": kmeans_row, "host_syncs": lambda: host_syncs_row(device=device)}
        for name in args.rows:
            (work / "pipeline").mkdir(exist_ok=True)
            try:
                row = builders[name]()
            except Exception as exc:  # noqa: BLE001 - one failed row is reported, the others still run
                row = Row(name=name, baseline="", status="failed", figures={"error": f"{type(exc).__name__}: {exc}"})
            print(f"{row.name}: {row.status}: " + "; ".join(f"{k}: {v}" for k, v in row.figures.items()), flush=True)
            rows.append(row)
    markdown = report_markdown(rows, device=torch.cuda.get_device_name(device),
                               date=datetime.date.today().isoformat(), seconds=time.perf_counter() - started)
    write_report(markdown, args.report)
    return 1 if any(row.status == "failed" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
