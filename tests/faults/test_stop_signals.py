"""SIGINT / SIGTERM during training: the step in progress finishes, a checkpoint is written, StageInterrupted names
it, and a rerun ends equal to an uninterrupted run (contrastive.engine.signals + engine.loop)."""
import os
import signal
import time

import pytest

from contrastive.engine import signals
from contrastive.engine.checkpoint import load_checkpoint
from contrastive.errors import StageInterrupted
from tests.faults.train_tiny_stage import train
from tests.faults.tiny_data import assert_same_weights, stage_weights, tiny_trifeature


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return tiny_trifeature(tmp_path_factory.mktemp("data"))


@pytest.fixture(autouse=True)
def restore_handlers():
    before = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


class SignalAt:
    """Training callback that sends this process ``signum`` when step ``step`` has been logged (``times`` times)."""

    def __init__(self, *, step: int, signum: int, times: int = 1):
        self.step, self.signum, self.times, self.seen = step, signum, times, []

    def on_step(self, *, step, epoch, metrics):
        self.seen.append(step)
        if step == self.step:
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)

    def on_epoch_end(self, *, epoch, metrics):
        pass

    def on_checkpoint(self, *, path, step):
        pass


def run_stage(dataset_dir, stage_dir, callbacks=()):
    from contrastive.modalities.image import steps as stages
    from tests.faults.train_tiny_stage import tiny_spec
    return stages.train_stage(tiny_spec(dataset_dir, stage_dir), callbacks=list(callbacks))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_stage_checkpoints_the_step_then_resume_equals_uninterrupted(dataset_dir, tmp_path, signum):
    reference = tmp_path / "reference"
    train(dataset_dir, reference)  # 3 epochs x 8 steps

    stage_dir = tmp_path / "stopped"
    with pytest.raises(StageInterrupted) as stopped:
        run_stage(dataset_dir, stage_dir, [SignalAt(step=11, signum=signum)])
    exc = stopped.value
    # The step in progress (11) finished and was checkpointed; nothing after it ran.
    assert exc.signum == signum and exc.step == 11 and exc.exit_code == 128 + signum
    assert exc.checkpoint == str(stage_dir / "checkpoints" / "last.pt")
    assert load_checkpoint(stage_dir / "checkpoints" / "last.pt")["step"] == 11
    assert not (stage_dir / "model" / "model.pt").exists()
    assert "checkpoint kept at" in str(exc) and ("SIGTERM" in str(exc) or "Ctrl-C" in str(exc))
    assert signals.stop_requested() is None  # consumed: nothing is re-delivered later

    summary = run_stage(dataset_dir, stage_dir)
    assert summary["resumed_from_step"] == 11 and summary["steps"] == 24
    assert_same_weights(stage_dir, stage_weights(reference))


def test_second_signal_stops_at_once_naming_the_last_checkpoint(dataset_dir, tmp_path):
    stage_dir = tmp_path / "stage"
    with pytest.raises(StageInterrupted) as stopped:
        run_stage(dataset_dir, stage_dir, [SignalAt(step=6, signum=signal.SIGINT, times=2)])
    # The second Ctrl-C raised inside the step-6 callbacks, before step 6's periodic checkpoint was written.
    assert stopped.value.step == 5 and stopped.value.checkpoint == str(stage_dir / "checkpoints" / "last.pt")
    assert load_checkpoint(stage_dir / "checkpoints" / "last.pt")["step"] == 5


def test_outside_training_the_installed_handlers_raise_at_once():
    signals.install_stop_handlers()
    with pytest.raises(StageInterrupted) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs at the next bytecode boundary
    assert stopped.value.signum == signal.SIGTERM and stopped.value.checkpoint is None
    assert str(stopped.value) == "stopped by SIGTERM"


def test_a_request_training_did_not_consume_goes_to_the_previous_handler():
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    with signals.graceful_stop():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert signals.stop_requested() == signal.SIGTERM and received == []  # deferred, not delivered
    assert received == [signal.SIGTERM]  # the scope ended before a step consumed it: handed on
    assert signal.getsignal(signal.SIGTERM) is not signals._defer


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_torchrun_ranks_after_a_checkpoint_then_resume_equals(dataset_dir, tmp_path):
    """Under torchrun (2 gloo ranks) the launching process forwards one SIGTERM; the ranks agree to stop after the
    same step, rank 0 checkpoints it, and a relaunch resumes to the uninterrupted weights."""
    import threading

    from contrastive.engine.launch import run_under_torchrun
    from tests.faults.train_tiny_stage import tiny_spec

    def launch(stage_dir, entry="contrastive.modalities.image.steps:train_stage_from_json"):
        return run_under_torchrun(entry=entry,
                                  kwargs={"spec": tiny_spec(dataset_dir, stage_dir, epochs=6).to_json()},
                                  stage_dir=stage_dir, nproc_per_node=2, backend="gloo",
                                  log_path=tmp_path / f"{stage_dir.name}.log")

    launch(tmp_path / "reference")
    stage_dir = tmp_path / "stopped"
    checkpoint = stage_dir / "checkpoints" / "last.pt"

    def stop_when_training():
        while not (checkpoint.exists() and (load_checkpoint(checkpoint) or {}).get("step", 0) >= 3):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_training, daemon=True).start()
    with pytest.raises(StageInterrupted) as stopped:  # 50 ms a step more: the stop lands mid-stage on a busy machine
        launch(stage_dir, entry="tests.launchers.slow_stage:train_slow_from_json")
    assert stopped.value.signum == signal.SIGTERM and stopped.value.checkpoint == str(checkpoint)
    assert 3 <= stopped.value.step < 48 and load_checkpoint(checkpoint)["step"] == stopped.value.step
    assert not (stage_dir / "model" / "model.pt").exists()

    summary = launch(stage_dir)
    assert summary["resumed_from_step"] == stopped.value.step and summary["steps"] == 48
    assert_same_weights(stage_dir, stage_weights(tmp_path / "reference"))
