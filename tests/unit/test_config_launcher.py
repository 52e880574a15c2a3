"""The ``launcher`` section (pipeline_config/launcher.py): outside every content key, checked before compute."""
import pytest

from contrastive.errors import ConfigError
from pipeline_config.loader import load_config


def test_launcher_is_not_part_of_any_content_key():
    local = load_config("trifeature_tiny", [])
    assert "launcher" not in local.content()
    moved = load_config("trifeature_tiny", ["launcher.kind=slurm", "launcher.slurm.partition=gpu",
                                            "launcher.slurm.account=lab", "launcher.concurrency_limit=gpus"])
    assert moved.config_hash() == local.config_hash()
    assert moved.launcher.slurm.partition == "gpu" and moved.launcher.remote and not local.launcher.remote


def test_clip_config_has_the_same_section():
    clip = load_config("clip_tiny", ["launcher.kind=torchrun"])
    assert clip.launcher.kind == "torchrun" and "launcher" not in clip.content()
    assert clip.config_hash() == load_config("clip_tiny", []).config_hash()


def test_slurm_options_are_normalised():
    config = load_config("trifeature_tiny", ["launcher.kind=slurm", "launcher.slurm.time_limit=1-00:00:00",
                                             "launcher.slurm.extra_sbatch=['#SBATCH --qos=high', '--constraint=a100']"])
    assert config.launcher.slurm.extra_sbatch == ["--qos=high", "--constraint=a100"]
    assert config.launcher.slurm.time_limit == "1-00:00:00"
    assert load_config("trifeature_tiny", ["launcher.slurm.time_limit=30"]).launcher.slurm.time_limit == "30"


@pytest.mark.parametrize("overrides, fix", [
    (["launcher.kind=ssh"], "launcher.kind"),
    (["launcher.slurm.time_limit=2h"], "H:M:S"),
    (["launcher.slurm.extra_sbatch=['constraint=a100']"], "one option a line"),
    (["launcher.slurm.nodez=2"], "unknown key"),
    (["launcher.kind=slurm", "launcher.slurm.nodes=2"], "--set distributed.nnodes=2"),
    (["launcher.kind=slurm", "launcher.slurm.gpus_per_node=4"], "distributed.nproc_per_node=4"),
    (["launcher.kind=slurm", "distributed.rdzv_endpoint=h:1"], "distributed.rdzv_endpoint=null"),
    (["launcher.kind=kubernetes"], "launcher.kubernetes.image"),
    (["launcher.kind=kubernetes", "launcher.kubernetes.image=img:1"], "launcher.kubernetes.volume_claim"),
    (["launcher.kind=kubernetes", "launcher.kubernetes.image=img:1", "launcher.kubernetes.volume_claim=pvc",
      "output_dir=/elsewhere/runs"], "output_dir=/shared/runs"),
    (["launcher.kubernetes.namespace=My_NS"], "not a Kubernetes name"),
    (["launcher.concurrency_limit=' '"], "prefect gcl create"),
])
def test_bad_launcher_configs_name_the_fix(overrides, fix):
    with pytest.raises(ConfigError, match="invalid config") as raised:
        load_config("trifeature_tiny", overrides)
    assert fix in str(raised.value)


def test_kubernetes_config_under_the_mount_is_valid():
    config = load_config("trifeature_tiny", ["launcher.kind=kubernetes", "launcher.kubernetes.image=img:1",
                                             "launcher.kubernetes.volume_claim=pvc", "output_dir=/shared/runs",
                                             "launcher.kubernetes.nodes=2", "distributed.nnodes=2",
                                             "launcher.kubernetes.gpus=2", "distributed.nproc_per_node=2"])
    assert config.launcher.nnodes() == 2 and config.launcher.gpus_per_node() == 2
