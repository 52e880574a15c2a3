"""The ``launcher`` section (pipeline_config/launcher.py): outside every content key, checked before compute."""
import pytest

from contrastive.errors import ConfigError
from pipeline_config.loader import config_from_dict, load_config


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
    (["launcher.slurm.rdzv_port=80"], "launcher.slurm.rdzv_port=0 (29500 + job id mod 10000) or 1024-65535"),
    (["launcher.kind=slurm", "device=cuda"], "set launcher.slurm.gpus_per_node"),
    (["launcher.kind=slurm", "distributed.backend=nccl"], "or distributed.backend=gloo"),
    (["launcher.kind=slurm", "launcher.slurm.nodes=2", "distributed.nnodes=2", "launcher.slurm.gpus_per_node=4"],
     "distributed.nproc_per_node=4"),
    (["launcher.kind=slurm", "launcher.slurm.nodes=2", "distributed.nnodes=2", "output_dir=/dev/shm/runs"],
     "is on tmpfs (/dev/shm), which only this machine sees"),
    (["launcher.kind=kubernetes"], "launcher.kubernetes.image"),
    (["launcher.kind=kubernetes", "launcher.kubernetes.image=img:1"], "launcher.kubernetes.volume_claim"),
    (["launcher.kind=kubernetes", "launcher.kubernetes.image=img:1", "launcher.kubernetes.volume_claim=pvc",
      "output_dir=/elsewhere/runs"], "output_dir=/shared/runs"),
    (["launcher.kubernetes.namespace=My_NS"], "a Kubernetes name"),
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


# What an attacker would put into a string that reaches sbatch or a manifest: a new script line, a second
# command, a command substitution in both shell spellings.
INJECTIONS = ["gpu\n#SBATCH --wrap=id", "gpu\nid", "gpu;id", "gpu$(id)", "gpu`id`"]
SLURM = {"kind": "slurm"}
KUBERNETES = {"kind": "kubernetes", "kubernetes": {"image": "registry.example.org/mclpipe:0.1",
                                                   "volume_claim": "mclpipe-shared"}}


def _set(raw: dict, dotted: str, value) -> dict:
    node = raw
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return raw


def _launcher_config(launcher: dict, key: str, value):
    """trifeature_tiny with ``launcher`` and ``key`` (a dotted path from the top) set to ``value``; built as a dict
    (a YAML --set would drop what follows a newline as a comment)."""
    import copy
    raw = load_config("trifeature_tiny", ["output_dir=/shared/runs"]).model_dump(mode="json")
    raw["launcher"] = copy.deepcopy(launcher)
    return config_from_dict(_set(raw, key, value))


# Every string of the launcher section that is written into the batch script or a manifest, with a valid value.
SHELL_REACHING = [
    (SLURM, "launcher.slurm.partition", "gpu", lambda v: v),
    (SLURM, "launcher.slurm.account", "lab42", lambda v: v),
    (SLURM, "launcher.slurm.time_limit", "04:00:00", lambda v: v),
    (SLURM, "launcher.slurm.python", "/shared/venv/bin/python", lambda v: v),
    (SLURM, "launcher.slurm.extra_sbatch", ["--qos=high"], lambda v: [f"--qos={v}"]),
    (SLURM, "launcher.slurm.container_image", "registry.example.org#mclpipe:0.2.0", lambda v: v),
    (SLURM, "launcher.slurm.container_mounts", ["/data"], lambda v: ["/data/" + v]),
    (KUBERNETES, "launcher.kubernetes.image", "registry.example.org/mclpipe:0.1", lambda v: v),
    (KUBERNETES, "launcher.kubernetes.namespace", "ml", lambda v: v),
    (KUBERNETES, "launcher.kubernetes.volume_claim", "mclpipe-shared", lambda v: v),
    (KUBERNETES, "launcher.kubernetes.service_account", "mclpipe-trainer", lambda v: v),
    (KUBERNETES, "launcher.kubernetes.image_pull_secret", "registry-login", lambda v: v),
    (KUBERNETES, "launcher.kubernetes.cpu", "8", lambda v: v),
    (KUBERNETES, "launcher.kubernetes.memory", "64Gi", lambda v: v),
    (KUBERNETES, "launcher.kubernetes.mount_path", "/shared", lambda v: "/" + v),
    (KUBERNETES, "launcher.kubernetes.node_selector", {"accelerator": "a100"}, lambda v: {"accelerator": v}),
    (KUBERNETES, "launcher.kubernetes.node_selector", {"accelerator": "a100"}, lambda v: {v: "a100"}),
    (SLURM, "output_dir", "/shared/runs", lambda v: "/shared/" + v),
]


@pytest.mark.parametrize("launcher, key, valid, wrap", SHELL_REACHING, ids=lambda p: p if isinstance(p, str) else "")
def test_shell_reaching_strings_take_a_valid_value(launcher, key, valid, wrap):
    config = _launcher_config(launcher, key, valid)
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    assert str(node) == str(valid) if key == "output_dir" else node == valid


@pytest.mark.parametrize("injection", INJECTIONS)
@pytest.mark.parametrize("launcher, key, valid, wrap", SHELL_REACHING, ids=lambda p: p if isinstance(p, str) else "")
def test_injection_into_a_shell_reaching_string_is_refused_naming_the_key(launcher, key, valid, wrap, injection):
    with pytest.raises(ConfigError) as raised:
        _launcher_config(launcher, key, wrap(injection))
    message = str(raised.value)
    assert key in message and "\n" not in message.replace("\\n", "")  # one line, naming the key


def test_setup_lines_may_be_shell_but_one_line_each():
    """``setup`` is shell by design (``source venv/bin/activate && ...``): only a new line is refused there; who may
    set it at all is the deployment's run policy (operator only)."""
    line = "module load cuda/12.4; source /shared/venv/bin/activate"
    config = _launcher_config(SLURM, "launcher.slurm.setup", [line])
    assert config.launcher.slurm.setup == [line]
    for line in ("module load cuda\nid", "module load cuda\r", "a\x00b"):
        with pytest.raises(ConfigError, match="launcher.slurm.setup"):
            _launcher_config(SLURM, "launcher.slurm.setup", [line])


@pytest.mark.parametrize("key, value", [
    ("launcher.slurm.partition", "gpu,debug"), ("launcher.slurm.time_limit", "1-12"),
    ("launcher.slurm.extra_sbatch", ["--constraint=a100&nvlink", "--gres=gpu:a100:2", "--mail-user=me@lab.org",
                                     "--exclusive", "-C", "--mem=0"]),
    ("launcher.kubernetes.image", "localhost:5000/team/mclpipe:0.1@sha256:" + "a" * 64),
    ("launcher.kubernetes.image", "mclpipe"), ("launcher.kubernetes.cpu", "500m"),
    ("launcher.kubernetes.volume_claim", "shared.claims.lab"),
    ("launcher.kubernetes.node_selector", {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}),
])
def test_what_each_system_accepts_passes(key, value):
    """Accepted, and kept as written (no validator rewrites what the scheduler or the API server reads)."""
    launcher = SLURM if ".slurm." in key else KUBERNETES
    config = _launcher_config(launcher, key, value)
    kept = config
    for part in key.split("."):
        kept = getattr(kept, part.replace("-", "_"))
    assert kept == value


@pytest.mark.parametrize("key, value", [
    ("launcher.slurm.time_limit", "30\n"), ("launcher.kubernetes.namespace", "ml\n"),
    ("launcher.kubernetes.namespace", "a" * 64), ("launcher.kubernetes.image", "Registry/MCL:0.1"),
    ("launcher.kubernetes.image", "mclpipe:0.1 --privileged"), ("launcher.kubernetes.mount_path", "/shared/../etc"),
    ("launcher.kubernetes.memory", "64 GB"), ("launcher.slurm.extra_sbatch", ["--qos=high --wrap=id"]),
    ("launcher.slurm.extra_sbatch", ["--output='/tmp/x'"]),
])
def test_what_each_system_refuses_is_refused(key, value):
    launcher = SLURM if ".slurm." in key else KUBERNETES
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _launcher_config(launcher, key, value)


MOUNTS = """/dev/vda / ext4 rw 0 0
tmpfs /dev/shm tmpfs rw 0 0
fileserver:/export /shared nfs4 rw 0 0
tmpfs /shared/scratch tmpfs rw 0 0
"""


@pytest.mark.parametrize("path, expected", [
    ("/shared/runs", ("nfs4", "/shared")), ("/shared/scratch/runs", ("tmpfs", "/shared/scratch")),
    ("/shared/scratchy", ("nfs4", "/shared")), ("/home/me", ("ext4", "/")), ("/dev/shm", ("tmpfs", "/dev/shm")),
])
def test_the_file_system_of_a_path_is_its_longest_mount_point(tmp_path, path, expected):
    from pathlib import Path

    from pipeline_config.launcher import filesystem_of
    (tmp_path / "mounts").write_text(MOUNTS)
    assert filesystem_of(Path(path), mounts=str(tmp_path / "mounts")) == expected


def test_a_two_node_job_refuses_an_output_dir_only_this_machine_sees(tmp_path):
    from pipeline_config.launcher import check_shared_storage
    (tmp_path / "mounts").write_text(MOUNTS)
    two_nodes = ["launcher.kind=slurm", "launcher.slurm.nodes=2", "distributed.nnodes=2",
                 "data.cache_dir=/shared/data"]
    check_shared_storage(load_config("trifeature_tiny", [*two_nodes, "output_dir=/shared/runs"]),
                         mounts=str(tmp_path / "mounts"))  # on the NFS mount: accepted
    config = load_config("trifeature_tiny", [*two_nodes, "output_dir=/shared/scratch/runs"])
    with pytest.raises(ConfigError) as raised:
        check_shared_storage(config, mounts=str(tmp_path / "mounts"))
    assert str(raised.value) == ("output_dir=/shared/scratch/runs is on tmpfs (/shared/scratch), which only this "
                                 "machine sees, but launcher.slurm.nodes=2: set output_dir to storage every node "
                                 "mounts at the same path (NFS, Lustre, GPFS, ...)")


def test_a_slurm_container_runs_the_image_s_python_unless_one_is_named():
    from pipeline_config.launcher import node_python

    image = load_config("trifeature_tiny", ["launcher.kind=slurm",
                                            "launcher.slurm.container_image=registry.example.org#mclpipe:0.2.0"])
    assert node_python(image.launcher) == "python"
    named = load_config("trifeature_tiny", ["launcher.kind=slurm", "launcher.slurm.container_image=/i/mclpipe.sqsh",
                                            "launcher.slurm.python=/opt/venv/bin/python"])
    assert node_python(named.launcher) == "/opt/venv/bin/python"
    assert node_python(load_config("trifeature_tiny", ["launcher.kind=slurm"]).launcher) is None
