"""torch.compile in the loop (issue 24): DDP before compile, one static-shape graph for the full batch (smaller
batches eager), the step never recompiles the forward, metrics stay tensors until a logging step. Compiled with a counting eager backend (no inductor, no C++
compiler): what is counted is TorchDynamo's graphs, the same on a GPU."""
import numpy as np
import pytest
import torch

from contrastive.engine import loop as loop_module
from contrastive.engine.distributed import DistInfo
from contrastive.engine.loop import read_metrics, train
from contrastive.engine.rng import seed_everything
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.mcl.sampler import ClusterBatchSampler
from contrastive.methods import build_method
from contrastive.modalities.image.adapter import ImageBatchSource, ImageContrastiveTask
from contrastive.modalities.image.augment import TwoViewAugment
from tests.unit.modalities.image.training import AUGMENT, MODEL


@pytest.fixture
def counted_compile(monkeypatch):
    """torch.compile with an eager backend that records every graph TorchDynamo hands it."""
    import torch._dynamo

    graphs = []
    real_compile = torch.compile

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: real_compile(module, backend=backend))
    yield graphs
    torch._dynamo.reset()


def _dynamic_sizes(graph) -> list:
    """The symbolic sizes a graph takes as inputs (a dynamic dimension is one); [] for a static-shape graph."""
    return [node.name for node in graph.graph.nodes
            if node.op == "placeholder" and isinstance(node.meta.get("example_value"), torch.SymInt)]


def test_steps_and_a_trimmed_last_batch_compile_the_forward_once(tmp_path, counted_compile, monkeypatch):
    """SimCLR on 40 images in batches of 16: sizes 16, 16, 8 every epoch, 9 steps with a changing step number.
    One static-shape graph, for the batches of 16; the batches of 8 run the module eagerly: a recompile per size
    or per step would add graphs, a dynamic batch dimension would show as a symbolic size."""
    seed_everything(0)
    images = torch.randint(0, 255, (40, 3, 16, 16), dtype=torch.uint8)
    method = build_method(model_kwargs=MODEL, method_kwargs={"name": "simclr", "temperature": 0.5})
    task = ImageContrastiveTask(method=method, augment=TwoViewAugment(**AUGMENT), seed=0, channels_last=False)
    sampler = ClusterBatchSampler(groups=None, num_samples=40, batch_size=16, seed=0)
    source = ImageBatchSource(sampler=sampler, ids=np.arange(40), groups=None, info=DistInfo(),
                              read_batches=lambda planned: ((rows, images[torch.from_numpy(rows)]) for rows in planned))
    sizes, eager_sizes = [], []
    real_for_batch = loop_module._Forward.for_batch

    def for_batch(self, inputs, *, size):
        chosen = real_for_batch(self, inputs, size=size)
        if chosen is self.module:
            eager_sizes.append(size)
        return chosen
    monkeypatch.setattr(loop_module._Forward, "for_batch", for_batch)

    class Sizes:
        def on_batch(self, *, step, batch):
            sizes.append(len(batch))

        def on_step(self, **kwargs): ...

        def on_epoch_end(self, **kwargs): ...

        def on_checkpoint(self, **kwargs): ...
    result = train(task=task, source=source, optim=OptimSpec(name="adam", lr=1e-3),
                   loop=LoopSpec(epochs=3, log_every_steps=2, checkpoint_every_steps=100, compile=True),
                   device=torch.device("cpu"), checkpoint_path=tmp_path / "last.pt", callbacks=[Sizes()])
    assert sorted(set(sizes)) == [8, 16] and result.steps == 9
    assert len(counted_compile) == 1 and _dynamic_sizes(counted_compile[0]) == []
    assert eager_sizes == [8, 8, 8]


class _SizedRows:
    """Batches of the given sizes, rows of a fixed linear regression."""

    def __init__(self, sizes: list[int]):
        from bench.gpu_check import RegressionRows
        rows = RegressionRows(steps=sum(sizes), device=torch.device("cpu"))
        self.x, self.y, self.sizes = rows.x, rows.y, sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def batches(self, *, epoch: int, start: int):
        from bench.gpu_check import _Rows
        ends = np.cumsum([0, *self.sizes])
        for index in range(start, len(self.sizes)):
            yield _Rows(self.x[ends[index]:ends[index + 1]], self.y[ends[index]:ends[index + 1]])


def test_a_first_batch_smaller_than_the_rest_adds_one_static_graph_not_a_dynamic_one(tmp_path, counted_compile):
    """A stage whose first batch is partial (an MCL group smaller than the batch) compiles it, then the full size
    once more, both static (TorchDynamo's automatic dynamic shapes would make the second graph dynamic); later
    partial batches run eagerly and add nothing."""
    from bench.gpu_check import QuietTask
    train(task=QuietTask(), source=_SizedRows([3, 6, 6, 2, 6, 3]),
          optim=OptimSpec(name="sgd", lr=0.01, schedule="constant"),
          loop=LoopSpec(epochs=1, log_every_steps=3, checkpoint_every_steps=100, compile=True),
          device=torch.device("cpu"), checkpoint_path=tmp_path / "last.pt")
    assert len(counted_compile) == 2
    assert [_dynamic_sizes(graph) for graph in counted_compile] == [[], []]


def test_ddp_comes_before_compile(monkeypatch):
    """The compiled module is the DDP-wrapped one (DDPOptimizer splits at bucket boundaries), not DDP around a
    compiled module."""
    order = []

    class FakeDDP(torch.nn.Module):
        def __init__(self, module, **kwargs):
            super().__init__()
            order.append("ddp")
            self.module = module

    monkeypatch.setattr(loop_module.nn.parallel, "DistributedDataParallel", FakeDDP)
    monkeypatch.setattr(loop_module, "sync_batch_norms", lambda module, device: module)
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: order.append(("compile", type(module))) or module)

    class Task:
        def forward_module(self):
            return torch.nn.Linear(2, 2)
    loop_module._Forward(task=Task(), spec=LoopSpec(epochs=1, compile=True), device=torch.device("cpu"),
                         info=DistInfo(rank=0, world_size=2, local_rank=0))
    assert order == ["ddp", ("compile", FakeDDP)]


def test_metrics_are_read_once_at_a_logging_step(monkeypatch):
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.shape) or original(self))
    metrics = {"a": torch.tensor(0.5), "b": torch.tensor([2.0]), "c": 3}
    assert read_metrics(metrics) == {"a": 0.5, "b": 2.0, "c": 3.0}
    assert reads == [torch.Size([2])]


class _StepReadingLoss(torch.nn.Module):
    """A forward that reads the step in Python, as HEX's schedules do (a graph break, then the rest compiled)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, x, y, step):
        scale = 1.0 / (1.0 + int(step) / 1000)  # a schedule of the step, as HEX's epsilon
        return scale * ((self.linear(x).squeeze(1) - y) ** 2).mean(), {"scale": torch.tensor(scale)}


def test_a_forward_that_reads_the_step_compiles_no_more_as_steps_advance(tmp_path, counted_compile):
    from bench.gpu_check import RegressionRows
    from contrastive.engine.task import StageTask
    from contrastive.methods.base import step_input

    class Task(StageTask):
        def __init__(self):
            torch.manual_seed(0)
            self.model = _StepReadingLoss()

        def forward_module(self):
            return self.model

        def inputs(self, batch, *, device, step):
            return {"x": batch.x, "y": batch.y, "step": step_input(step)}

    graphs = []
    for steps in (2, 12):
        counted_compile.clear()
        train(task=Task(), source=RegressionRows(steps=steps, device=torch.device("cpu")),
              optim=OptimSpec(name="sgd", lr=0.01, schedule="constant"),
              loop=LoopSpec(epochs=1, log_every_steps=5, checkpoint_every_steps=100, compile=True),
              device=torch.device("cpu"), checkpoint_path=tmp_path / f"{steps}.pt")
        graphs.append(len(counted_compile))
        torch._dynamo.reset()
    # 2 steps and 12 steps compile the same graphs: the graph before the step is read and the one after it,
    # recompiled once when the value read changes (TorchDynamo then treats it as dynamic), never per step
    assert graphs[0] == graphs[1] <= 3


class _HalfRows:
    """One rank's share of a regression: batch ``i`` is rows ``8i + 4 * part`` to ``8i + 4 * part + 4`` of
    ``RegressionRows(steps=2 * steps)``; ``part=None`` takes both halves (the batch of 8 a single process sees).
    The two ranks' rows differ, so their gradients differ: equal weights on both ranks and on the single run need
    DDP to average them."""

    def __init__(self, *, steps: int, part: int | None):
        from bench.gpu_check import RegressionRows
        rows = RegressionRows(steps=2 * steps, device=torch.device("cpu"))
        self.x, self.y, self.steps, self.part = rows.x, rows.y, steps, part

    def __len__(self) -> int:
        return self.steps

    def batches(self, *, epoch: int, start: int):
        from bench.gpu_check import _Rows
        for index in range(start, self.steps):
            first = 8 * index + (0 if self.part is None else 4 * self.part)
            last = first + (8 if self.part is None else 4)
            yield _Rows(self.x[first:last], self.y[first:last])


def _compiled_ddp_rank(rank: int, out: str) -> None:
    """A rank of the 2-rank run below: the regression through DDP + torch.compile (eager backend) on its own half
    of each batch, 2 micro-batches a step (the first under the compiled module's no_sync), its final weights saved."""
    from bench.gpu_check import QuietTask
    from contrastive.engine.distributed import DistInfo as Info

    real_compile = torch.compile
    torch.compile = lambda module, **kwargs: real_compile(module, backend="eager")
    task = QuietTask()
    train(task=task, source=_HalfRows(steps=8, part=rank),
          optim=OptimSpec(name="sgd", lr=0.05, schedule="constant"),
          loop=LoopSpec(epochs=1, log_every_steps=2, checkpoint_every_steps=100, compile=True, grad_accumulation=2),
          device=torch.device("cpu"), checkpoint_path=f"{out}/rank{rank}/last.pt",
          info=Info(rank=rank, world_size=2, local_rank=rank))
    torch.save(task.model.state_dict(), f"{out}/weights{rank}.pt")


def test_ddp_then_compile_trains_as_one_process(tmp_path):
    """Each rank sees a different half of every batch of 8 and the single process the whole batch: the mean loss
    over 8 rows is the mean of the two halves' means, so only DDP's averaged gradients bring both ranks onto the
    single run's weights (a rank training on its own gradients ends elsewhere), also through the compiled
    module's no_sync under gradient accumulation."""
    from bench.gpu_check import QuietTask
    from tests.distributed import run_gloo_ranks

    run_gloo_ranks(_compiled_ddp_rank, str(tmp_path))
    single = QuietTask()
    train(task=single, source=_HalfRows(steps=8, part=None),
          optim=OptimSpec(name="sgd", lr=0.05, schedule="constant"),
          loop=LoopSpec(epochs=1, log_every_steps=2, checkpoint_every_steps=100, grad_accumulation=2),
          device=torch.device("cpu"), checkpoint_path=tmp_path / "single" / "last.pt")
    for rank in (0, 1):
        ranked = torch.load(tmp_path / f"weights{rank}.pt")
        for name, value in single.model.state_dict().items():
            assert torch.allclose(ranked[name], value, atol=1e-6), name
