"""The engine's loop on a closed-form task: resume equals an uninterrupted run, gradient accumulation equals the
big batch, lockstep trimming, divergence, precision, clipping, and the checkpoint's contents."""
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from contrastive.engine.checkpoint import load_checkpoint
from contrastive.engine.loop import train
from contrastive.engine.task import LoopSpec, OptimSpec, StageTask
from contrastive.errors import ConfigError, DataError, MclpipeError


@dataclass
class Rows:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    def take(self, n: int) -> "Rows":
        return Rows(self.x[:n], self.y[:n])

    @property
    def keys(self) -> list[str]:
        return [str(float(v)) for v in self.y]


class MeanSquaredError(nn.Module):
    def __init__(self, model: nn.Module, noise: torch.Generator):
        super().__init__()
        self.model = model
        self.noise = noise

    def forward(self, x, y):
        # A draw from the task's generator per batch: resuming must restore it to match an uninterrupted run.
        jitter = 1e-3 * torch.randn(x.shape, generator=self.noise)
        loss = ((self.model(x + jitter).squeeze(1) - y) ** 2).mean()
        return loss, {"task/jitter": float(jitter.abs().mean())}


class RegressionTask(StageTask):
    def __init__(self, seed: int = 0):
        torch.manual_seed(seed)
        self.model = nn.Linear(3, 1)
        self.noise = torch.Generator().manual_seed(seed)
        self.generators = {"noise": self.noise}
        self.after_steps: list[int] = []

    def forward_module(self) -> nn.Module:
        return MeanSquaredError(self.model, self.noise)

    def inputs(self, batch: Rows, *, device, step):
        return {"x": batch.x.to(device), "y": batch.y.to(device)}

    def after_step(self, *, step: int) -> None:
        self.after_steps.append(step)


class FixedBatches:
    """Epoch e's batches: a seeded permutation of 24 rows cut into batches of ``size``."""

    def __init__(self, size: int = 4, rows: int = 24, short_last: int | None = None):
        gen = torch.Generator().manual_seed(123)
        self.x = torch.randn(rows, 3, generator=gen)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3
        self.size, self.rows, self.short_last = size, rows, short_last

    def __len__(self) -> int:
        return self.rows // self.size

    def batches(self, *, epoch: int, start: int):
        order = torch.from_numpy(np.random.default_rng(epoch).permutation(self.rows))
        cut = [order[i:i + self.size] for i in range(0, self.rows, self.size)]
        if self.short_last is not None:
            cut[-1] = cut[-1][:self.short_last]
        for rows in cut[start:]:
            yield Rows(self.x[rows], self.y[rows])


CPU = torch.device("cpu")
SGD = OptimSpec(name="sgd", lr=0.05, weight_decay=0.0, schedule="cosine", warmup_fraction=0.2)


def _run(tmp_path, *, name="ckpt", loop=None, source=None, stop_after=None, task=None, optim=SGD):
    task = task or RegressionTask()
    result = train(task=task, source=source if source is not None else FixedBatches(), optim=optim,
                   loop=loop or LoopSpec(epochs=3, checkpoint_every_steps=4, log_every_steps=1), device=CPU,
                   checkpoint_path=tmp_path / name / "last.pt", stop_after_steps=stop_after)
    return task, result


def test_a_resumed_run_ends_equal_to_an_uninterrupted_one(tmp_path):
    full_task, full = _run(tmp_path, name="full")
    assert full.steps == 18 and full.epochs == 3 and full.resumed_from_step is None
    _, crashed = _run(tmp_path, name="crash", stop_after=7)
    assert crashed.steps == 7
    resumed_task, resumed = _run(tmp_path, name="crash")
    assert resumed.resumed_from_step == 7 and resumed.steps == 18
    for name, value in full_task.model.state_dict().items():
        assert torch.equal(resumed_task.model.state_dict()[name], value), name
    # The history after the resume repeats the uninterrupted run's losses step for step.
    tail = [h["train/loss"] for h in full.history][7:]
    assert [h["train/loss"] for h in resumed.history] == tail


def test_a_stage_stopped_after_its_last_checkpoint_resumes_with_its_final_loss(tmp_path):
    # killed between the end-of-training checkpoint and the summary: the resume has no step left to train
    _, full = _run(tmp_path, name="full")
    _, finished = _run(tmp_path, name="crash")
    resumed_task, resumed = _run(tmp_path, name="crash")
    assert resumed.resumed_from_step == 18 and resumed.steps == 18 and resumed.history == []
    assert resumed.final_loss == finished.final_loss == full.final_loss
    assert resumed.final_loss == full.history[-1]["train/loss"]


def test_the_checkpoint_holds_everything_a_resume_needs(tmp_path):
    _run(tmp_path, stop_after=5)
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "epoch", "batches_consumed", "step",
            "last_loss"} <= set(state)
    assert state["step"] == 5 and state["epoch"] == 0 and state["batches_consumed"] == 5
    assert {"python", "numpy", "torch", "generators"} <= set(state["rng"]) and "noise" in state["rng"]["generators"]


def test_gradient_accumulation_of_two_halves_equals_the_whole_batch(tmp_path):
    # The loss is a mean over rows, so accumulating the halves' mean losses / 2 gives the batch's gradient.
    whole_task, whole = _run(tmp_path, name="whole", source=FixedBatches(size=8),
                             loop=LoopSpec(epochs=2, log_every_steps=1))
    halves_task, halves = _run(tmp_path, name="halves", source=FixedBatches(size=4),
                               loop=LoopSpec(epochs=2, log_every_steps=1, grad_accumulation=2))
    # The two runs see different random jitter draws; without it they are the same computation.
    assert whole.steps == halves.steps == 6
    for name, value in whole_task.model.state_dict().items():
        assert torch.allclose(halves_task.model.state_dict()[name], value, atol=2e-3), name
    assert halves_task.after_steps == list(range(6))


def test_a_batch_too_small_to_train_on_ends_the_epoch_and_is_counted(tmp_path):
    _, result = _run(tmp_path, source=FixedBatches(size=4, short_last=1), loop=LoopSpec(epochs=2))
    assert result.steps == 10 and result.epochs_ended_early == 2 and result.trimmed_samples == 2


def test_divergence_names_the_fix_and_keeps_the_last_checkpoint(tmp_path):
    huge = OptimSpec(name="sgd", lr=1e6, weight_decay=0.0, schedule="constant")
    with pytest.raises(MclpipeError, match="diverged at step .* lower train.lr.*last good checkpoint"):
        _run(tmp_path, optim=huge, loop=LoopSpec(epochs=50, checkpoint_every_steps=2))
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt") is not None


def test_gradient_clipping_bounds_the_update(tmp_path):
    # Constant lr 1, plain SGD (momentum 0): one step moves the weights by exactly the clipped gradient.
    task = RegressionTask()
    before = {n: p.detach().clone() for n, p in task.model.named_parameters()}
    one_step = OptimSpec(name="sgd", lr=1.0, weight_decay=0.0, schedule="constant", momentum=0.0)
    _run(tmp_path, task=task, optim=one_step, loop=LoopSpec(epochs=1, grad_clip_norm=0.01),
         stop_after=1)
    moved = torch.sqrt(sum(((p.detach() - before[n]) ** 2).sum() for n, p in task.model.named_parameters()))
    assert float(moved) == pytest.approx(0.01, rel=1e-4)


def test_bf16_autocast_trains_on_cpu(tmp_path):
    _, result = _run(tmp_path, loop=LoopSpec(epochs=1, precision="bf16", log_every_steps=1))
    assert result.steps == 6 and np.isfinite(result.final_loss)


def test_bad_settings_fail_before_training(tmp_path):
    with pytest.raises(ConfigError, match="precision"):
        _run(tmp_path, loop=LoopSpec(epochs=1, precision="fp8"))
    with pytest.raises(ConfigError, match="grad_accumulation"):
        _run(tmp_path, loop=LoopSpec(epochs=1, grad_accumulation=0))


def test_logged_metrics_carry_loss_lr_throughput_and_the_tasks_numbers(tmp_path):
    _, result = _run(tmp_path, loop=LoopSpec(epochs=1, log_every_steps=2))
    assert [h["step"] for h in result.history] == [2.0, 4.0, 6.0]
    assert {"train/loss", "train/lr", "train/samples_per_s", "train/epoch", "task/jitter"} <= set(result.history[0])


class SlowBatches(FixedBatches):
    """FixedBatches whose reader sleeps before every batch: a stage that waits for its input."""

    def batches(self, *, epoch: int, start: int):
        import time
        for batch in super().batches(epoch=epoch, start=start):
            time.sleep(0.1)
            yield batch


class SlowStepTask(RegressionTask):
    """A task whose step takes 50 ms on the training thread: the model, not the input, is the bottleneck (the
    share then stays low even on a machine busy with other work, where a 1 ms step would not)."""

    def inputs(self, batch: Rows, *, device, step):
        import time
        time.sleep(0.05)
        return super().inputs(batch, device=device, step=step)


def test_the_share_of_time_spent_waiting_for_data_is_measured_and_warned_once(tmp_path, caplog):
    loop = LoopSpec(epochs=2, log_every_steps=2, checkpoint_every_steps=1000)
    with caplog.at_level("WARNING", logger="contrastive.engine.loop"):
        _, slow = _run(tmp_path, name="slow", source=SlowBatches(), loop=loop)
        _, fast = _run(tmp_path, name="fast", loop=loop, task=SlowStepTask())
    assert slow.summary()["data_wait_share"] > 0.5 > fast.summary()["data_wait_share"]
    assert slow.history[-1]["train/data_wait_share"] > 0.5 and 0 <= fast.history[-1]["train/data_wait_share"] < 0.5
    warnings = [r.message for r in caplog.records if "waited for its input" in r.message]
    assert len(warnings) == 1 and "train.workers" in warnings[0] and "data.decode_workers" in warnings[0]


class HangingBatches(FixedBatches):
    """A reader that delivers ``good`` batches, then blocks (a hung mount): it sleeps far beyond the limit."""

    def __init__(self, good: int):
        import threading
        super().__init__()
        self.good = good
        self.release = threading.Event()  # the test lets the stuck reader go when it is done with it
        self.hung_at: float | None = None  # when it stopped delivering (time.monotonic)

    def batches(self, *, epoch: int, start: int):
        import time
        for index, batch in enumerate(super().batches(epoch=epoch, start=start)):
            if index == self.good:
                self.hung_at = time.monotonic()
                self.release.wait(3600)
            yield batch

    def describe(self, *, epoch: int, position: int) -> str:
        return "the test reader on /mnt/hung"


@pytest.mark.parametrize("good, limit, message", [
    (3, 0.5, r"no batch for 0\.5 s: the test reader on /mnt/hung \(epoch 0, batch 3 of 6\) did not deliver the next "
             "batch"),
    (0, 1.5, r"no batch for 1\.5 s: the test reader on /mnt/hung \(epoch 0, batch 0 of 6\) did not deliver the first "
             "batch"),
])
def test_a_reader_that_stops_ends_the_stage_within_the_limit(tmp_path, good, limit, message):
    """A limit of 0.5 s: the next batch waited for 0.5 s, an epoch's first for 3x (1.5 s), each named as set. The
    stage ends once the limit has passed since the loop asked for the batch, not before (a reader that is only slow
    keeps its stage) and not much after (a hung mount holds no slot for long): a watcher that waits twice its
    limit, or the first batch's limit for the next, fails here."""
    import time

    from contrastive.engine.feed import InputStalled

    class Clock:
        """When the loop last finished a step or a checkpoint: it asks for the next batch right after."""
        last = 0.0

        def on_step(self, **_):
            self.last = time.monotonic()

        def on_epoch_end(self, **_):
            self.last = time.monotonic()

        def on_checkpoint(self, **_):
            self.last = time.monotonic()
    loop = LoopSpec(epochs=2, checkpoint_every_steps=2, stall_seconds=0.5)
    source, clock = HangingBatches(good=good), Clock()
    with pytest.raises(InputStalled, match=message + r"\. .*if it is only slow, raise train\.stall_seconds$"):
        train(task=RegressionTask(), source=source, optim=SGD, loop=loop, device=CPU,
              checkpoint_path=tmp_path / "ckpt" / "last.pt", callbacks=[clock])
    ended = time.monotonic()
    source.release.set()
    # from the later of the reader's stop and the loop's last step (the reader may stop while the loop still
    # trains on batches read ahead): the wait for the batch that never came, and a little scheduling
    waited = ended - max(source.hung_at, clock.last)
    assert limit <= waited < 1.4 * limit + 0.1, waited
    if good:
        assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["step"] == 2  # what was trained is kept


def test_a_source_with_no_batch_is_refused_before_training(tmp_path):
    from contrastive.errors import DataError
    with pytest.raises(DataError, match="plans no batch"):
        _run(tmp_path, source=FixedBatches(size=4, rows=3))


def test_a_watched_source_yields_the_same_batches_and_reraises_its_errors():
    from contrastive.engine.feed import watched
    assert list(watched(iter(range(50)), seconds=5)) == list(range(50))

    def broken():
        yield 1
        raise ValueError("unreadable shard 7")
    with pytest.raises(ValueError, match="unreadable shard 7"):
        list(watched(broken(), seconds=5))


def test_a_checkpoint_of_other_trainable_parameters_names_the_fix(tmp_path):
    """A resume whose model trains other parameters than the checkpoint's optimizer held (a version that froze a
    layer since) stops with the checkpoint's folder to delete, not the optimizer's bare ValueError."""
    _run(tmp_path, name="crash", stop_after=7)
    frozen = RegressionTask()
    frozen.model.bias.requires_grad_(False)
    with pytest.raises(DataError, match=r"delete .*crash to train the stage from its start"):
        _run(tmp_path, name="crash", task=frozen)


def test_the_time_spent_writing_checkpoints_is_measured(tmp_path, monkeypatch):
    """18 steps, a checkpoint every 4 and at each of 3 epoch ends (6 steps an epoch): 7 saves, each made 50 ms
    slower here; the summary's checkpoint_seconds holds them (a benchmark or a user can tell the stage's checkpoint
    cost from its training)."""
    import time

    from contrastive.engine import loop as loop_module
    real_save = loop_module.save_checkpoint
    saves = []

    def slow_save(*args, **kwargs):
        saves.append(1)
        time.sleep(0.05)
        return real_save(*args, **kwargs)
    monkeypatch.setattr(loop_module, "save_checkpoint", slow_save)
    _, result = _run(tmp_path)
    summary = result.summary()
    assert len(saves) == 7
    assert 0.05 * len(saves) <= summary["checkpoint_seconds"] < summary["seconds"]


class _Plan:
    """A callback that records what ``on_train_start`` hears (the progress bar's length and first step)."""

    def __init__(self):
        self.heard = []

    def on_train_start(self, *, total_steps: int, step: int) -> None:
        self.heard.append((total_steps, step))

    def on_step(self, *, step, epoch, metrics):
        pass

    def on_epoch_end(self, *, epoch, metrics):
        pass

    def on_checkpoint(self, *, path, step):
        pass


def test_callbacks_hear_the_sources_planned_steps_and_where_a_resumed_stage_starts(tmp_path):
    loop = LoopSpec(epochs=3, checkpoint_every_steps=4, log_every_steps=1)
    source = FixedBatches(size=4, rows=28)  # 7 batches an epoch, whatever a caller reckons from its own sizes
    first, again = _Plan(), _Plan()
    train(task=RegressionTask(), source=source, optim=SGD, loop=loop, device=CPU,
          checkpoint_path=tmp_path / "c" / "last.pt", callbacks=[first], stop_after_steps=9)
    train(task=RegressionTask(), source=source, optim=SGD, loop=loop, device=CPU,
          checkpoint_path=tmp_path / "c" / "last.pt", callbacks=[again])
    assert first.heard == [(21, 0)] and again.heard == [(21, 9)]
