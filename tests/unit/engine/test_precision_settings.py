"""The CUDA numerics settings (TF32, cuDNN autotuner) and the loss scaler's state across CPU and GPU."""
import contextlib

import pytest
import torch

from contrastive.engine.precision import configure_cuda_numerics, load_scaler_state
from pipeline_config.loader import load_config


@pytest.fixture
def restore_backends():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


def test_tf32_and_the_autotuner_are_set_on_a_gpu_only(restore_backends):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.benchmark = False
    configure_cuda_numerics(device=torch.device("cpu"), tf32=True, cudnn_benchmark=True)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.benchmark
    configure_cuda_numerics(device=torch.device("cuda", 0), tf32=True, cudnn_benchmark=True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.backends.cudnn.benchmark
    configure_cuda_numerics(device=torch.device("cuda", 0), tf32=False, cudnn_benchmark=False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.benchmark


def test_the_settings_are_on_by_default_and_out_of_the_content_key():
    default = load_config("trifeature_tiny")
    changed = load_config("trifeature_tiny", ["train.tf32=false", "train.cudnn_benchmark=false"])
    assert default.train.loop_spec().tf32 and default.train.loop_spec().cudnn_benchmark
    assert not changed.train.loop_spec().tf32
    assert changed.config_hash() == default.config_hash()


def test_a_stage_without_a_scaler_resumes_where_one_is_enabled():
    """fp16 on the CPU runs without a scaler (an empty state in the checkpoint); on a GPU the same stage has an
    enabled one, which refuses an empty state: the loop starts it fresh instead, and back the other way too."""
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    enabled = torch.amp.GradScaler("cpu", enabled=True)
    with pytest.raises(RuntimeError):
        enabled.load_state_dict(disabled.state_dict())  # what torch does with it
    load_scaler_state(enabled, disabled.state_dict())
    assert enabled.get_scale() == torch.amp.GradScaler("cpu", enabled=True).get_scale()
    load_scaler_state(disabled, enabled.state_dict())  # GPU -> CPU: a disabled scaler ignores it
    trained = torch.amp.GradScaler("cpu", enabled=True, init_scale=1024.0)
    trained.scale(torch.tensor(1.0))  # a scaler that has scaled a loss has a state to keep
    restored = torch.amp.GradScaler("cpu", enabled=True)
    load_scaler_state(restored, trained.state_dict())
    assert restored.get_scale() == 1024.0


def test_auto_is_bf16_where_the_cpu_has_native_bf16_and_fp32_elsewhere(monkeypatch):
    from contrastive.engine import precision

    cpu = torch.device("cpu")
    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    assert precision.resolve_precision("auto", device=cpu) == "fp32"
    assert isinstance(precision.autocast_context(precision="auto", device=cpu), type(contextlib.nullcontext()))
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert precision.resolve_precision("auto", device=cpu) == "bf16"
    with precision.autocast_context(precision="auto", device=cpu):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    # a named precision is never changed, and auto never needs a loss scaler
    assert precision.resolve_precision("fp32", device=cpu) == "fp32"
    assert not precision.grad_scaler(precision="auto", device=cpu).is_enabled()
    with pytest.raises(precision.ConfigError, match="auto"):
        precision.resolve_precision("half", device=cpu)
