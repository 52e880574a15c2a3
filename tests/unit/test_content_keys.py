"""Content keys that mean what they say: a setting is keyed as what the stage does with it. ``precision: auto`` is
keyed as the precision it resolves to on the stage's kind of device; a setting the chosen optimizer or loop does not
read (Adam's momentum, the rollback settings of a loop that stops at a NaN) is not keyed at all; a setting left at
its default keeps the key it always had."""
import pytest

from contrastive.engine import precision
from contrastive.modalities.registry import modality_for
from pipeline_config.loader import load_config
from pipeline_config.schema import digest_of

DATA = {"digest": "data", "dir": "/data", "num_train": 1000}


def train_key(preset: str, *overrides: str, stage: int = 1) -> str:
    """The content key of stage ``stage``'s training (cluster-pure batches) of ``preset`` with ``overrides``."""
    config = load_config(preset, list(overrides))
    return digest_of(modality_for(config.pipeline).train_content(
        config.for_stage(stage), stage=stage, seed=stage, data=DATA, batches_key="batches", inherit_key=None))


@pytest.fixture
def bf16_device(monkeypatch):
    """Whether this machine's CPU computes in bf16 natively (what ``auto`` resolves by), set by the test."""
    def set_native(native: bool) -> None:
        monkeypatch.setattr(precision, "native_bf16", lambda device: native)
    return set_native


@pytest.mark.parametrize("preset", ["trifeature_tiny", "text_tiny", "embeddings_tiny"])
def test_auto_precision_is_keyed_as_the_precision_it_resolves_to(preset, bf16_device):
    auto = ("train.precision=auto", "device=cpu")
    bf16_device(True)  # a bf16 CPU: auto trains as bf16 does, and reuses its stages
    assert train_key(preset, *auto) == train_key(preset, "train.precision=bf16", "device=cpu")
    assert train_key(preset, *auto) != train_key(preset, "train.precision=fp32", "device=cpu")
    bf16_device(False)  # elsewhere auto means fp32: a bf16 result is not reused for it
    assert train_key(preset, *auto) == train_key(preset, "train.precision=fp32", "device=cpu")
    assert train_key(preset, *auto) != train_key(preset, "train.precision=bf16", "device=cpu")


def test_auto_precision_stays_auto_in_the_key_where_a_cluster_node_resolves_it(bf16_device):
    """On Slurm the stage trains on a node the flow's cannot probe: ``auto`` is keyed as written there."""
    remote = ("train.precision=auto", "launcher.kind=slurm")
    for native in (True, False):
        bf16_device(native)
        assert train_key("trifeature_tiny", *remote) not in {
            train_key("trifeature_tiny", "train.precision=bf16", "launcher.kind=slurm"),
            train_key("trifeature_tiny", "train.precision=fp32", "launcher.kind=slurm")}
    assert load_config("trifeature_tiny", list(remote)).train_key_content()["precision"] == "auto"


def test_a_fixed_precision_keeps_the_key_it_had():
    """Only ``auto`` is resolved: bf16 and fp32 are keyed as the section's content always held them."""
    for value in ("fp32", "bf16", "fp16"):
        config = load_config("trifeature_tiny", [f"train.precision={value}"])
        assert config.train_key_content() == config.train.content()


def test_momentum_is_out_of_the_key_of_an_optimizer_that_reads_none():
    # Adam and AdamW ignore train.momentum: a changed momentum reuses every stage, and the pipeline hash stays
    for optimizer in ("adam", "adamw"):
        base = (f"train.optimizer={optimizer}",)
        assert train_key("trifeature_tiny", *base, "train.momentum=0.5") == train_key("trifeature_tiny", *base)
        assert load_config("trifeature_tiny", [*base, "train.momentum=0.5"]).config_hash() == \
            load_config("trifeature_tiny", list(base)).config_hash()
    # SGD and LARS read it: it is keyed
    for optimizer in ("sgd", "lars"):
        base = (f"train.optimizer={optimizer}",)
        assert train_key("trifeature_tiny", *base, "train.momentum=0.5") != train_key("trifeature_tiny", *base)
    # left at its default, an Adam stage keeps the key it had before momentum was left out (its content holds 0.9)
    assert load_config("trifeature_tiny").train.content()["momentum"] == 0.9


def test_rollback_settings_are_out_of_the_key_of_a_loop_that_stops_at_a_nan():
    stop = train_key("trifeature_tiny")
    assert train_key("trifeature_tiny", "train.max_rollbacks=5", "train.rollback_lr_factor=0.25") == stop
    rollback = train_key("trifeature_tiny", "train.on_nonfinite=rollback")
    assert rollback != stop
    assert train_key("trifeature_tiny", "train.on_nonfinite=rollback", "train.max_rollbacks=5") != rollback
