"""The ``launcher`` section: WHERE a stage's training runs (this process, a local torchrun, a Slurm job or a
Kubernetes Job). It never changes a result, so it is outside every content key (schema.py marks the field
``NOT_IN_KEY``): moving a pipeline from a laptop to a cluster reuses the finished steps, and a stage cancelled on
the cluster resumes from its checkpoint on the shared storage.

``kind``:
  - ``local``: today's behaviour. A stage runs in the flow's process, or under a local torchrun when
    ``distributed.nproc_per_node`` x ``nnodes`` > 1.
  - ``torchrun``: always under a local torchrun with ``distributed.nproc_per_node`` processes (also for 1).
  - ``slurm``: one ``sbatch`` job per stage: ``srun`` starts one torchrun agent per node, rendezvous (c10d) on the
    first node, ``slurm.gpus_per_node`` processes per node (``distributed.nproc_per_node`` on CPU-only jobs).
  - ``kubernetes``: one Indexed Job per stage (``kubernetes.nodes`` pods, one torchrun agent each) and a headless
    Service so the pods find pod 0 for the rendezvous; the step directories live on a shared volume.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from launchers import names


class _Launcher(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SlurmLauncherConfig(_Launcher):
    """One sbatch job per GPU stage. The flow (on a login node) submits, polls and tails the job's log."""

    nodes: int = Field(1, ge=1, description="nodes of the job (sbatch --nodes); torchrun --nnodes")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node (--gpus-per-node); one process each. 0 = a CPU "
                                                    "job with distributed.nproc_per_node processes per node")
    cpus_per_task: int | None = Field(None, ge=1, description="CPUs of each node's task (--cpus-per-task)")
    partition: str | None = Field(None, description="sbatch --partition (None: the cluster's default)")
    time_limit: str = Field("04:00:00", description="sbatch --time: M, H:M:S or D-H:M:S")
    account: str | None = Field(None, description="sbatch --account")
    extra_sbatch: list[str] = Field(default_factory=list, description="more sbatch options, one a line, e.g. "
                                                                      "'--constraint=a100' or '--qos=high'")
    setup: list[str] = Field(default_factory=list, description="shell lines run before the stage on every job, e.g. "
                                                               "'module load cuda/12.4', 'source venv/bin/activate'")
    python: str | None = Field(None, description="python on the compute nodes (None: the flow's own interpreter, "
                                                 "right when the virtualenv is on the shared filesystem)")
    signal_lead_seconds: int = Field(90, ge=0, description="Slurm signals the job this long before its time limit "
                                                           "(--signal=B:USR1@N); the job requeues itself and resumes "
                                                           "from its last checkpoint. 0 = no signal")
    rdzv_port: int = Field(0, ge=0, le=65535, description="c10d rendezvous port on the first node; 0 = 29500 + "
                                                       "job id mod 10000 (jobs sharing a node do not collide)")
    poll_seconds: float = Field(10.0, gt=0, description="how often the flow polls squeue and reads the log")
    container_image: str | None = Field(None, description="run every node's processes in this image (pyxis: srun "
                                                          "--container-image), e.g. the one `make image` builds "
                                                          "pushed as registry.example.org#mclpipe:0.2.0, or an "
                                                          "enroot .sqsh file; None: the nodes' own environment")
    container_mounts: list[str] = Field(default_factory=list, description="host paths mounted at the same path "
                                                                          "in the container besides output_dir "
                                                                          "and the working directory (the data)")

    @field_validator("container_image")
    @classmethod
    def _container_image(cls, value: str | None) -> str | None:
        return None if value is None else names.container_image("", value)

    @field_validator("container_mounts")
    @classmethod
    def _mounts(cls, value: list[str]) -> list[str]:
        return [names.absolute_path("", path) for path in value]

    @field_validator("rdzv_port")
    @classmethod
    def _unprivileged_port(cls, value: int) -> int:
        # the rendezvous store listens in the user's job on the first node: a port below 1024 needs root there
        if 0 < value < 1024:
            raise ValueError(f"launcher.slurm.rdzv_port={value} is a privileged port (below 1024) that a job cannot "
                             "listen on: set launcher.slurm.rdzv_port=0 (29500 + job id mod 10000) or 1024-65535")
        return value

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_format(cls, value) -> str:
        value = str(value) if isinstance(value, int) and not isinstance(value, bool) else value  # YAML: 30 -> int
        return names.slurm_time("", value.strip(" ") if isinstance(value, str) else value)

    # Every string below is written into the batch script: checked against what Slurm accepts (launchers/names.py)
    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        return None if value is None else names.slurm_name("", value, several=True)

    @field_validator("account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        return None if value is None else names.slurm_name("", value)

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        return None if value is None else names.script_path("", value)

    @field_validator("extra_sbatch")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        options = [line.strip(" ").removeprefix("#SBATCH").strip(" ") for line in value]
        return [names.sbatch_option("", option) for option in options]

    @field_validator("setup")
    @classmethod
    def _one_line_each(cls, value: list[str]) -> list[str]:
        return [names.one_line("", line) for line in value]


class KubernetesLauncherConfig(_Launcher):
    """One Indexed Job per GPU stage (pods 0..nodes-1, torchrun on each) plus a headless Service for the c10d
    rendezvous on pod 0. The step directories (``output_dir``) and the data must be on ``volume_claim``, mounted at
    ``mount_path`` in the pods AND at the same path where the flow runs."""

    image: str | None = Field(None, description="container image with mclpipe installed (the repo's Dockerfile)")
    namespace: str = Field("default", description="namespace of the Job, its Service and its pods")
    gpus: int = Field(0, ge=0, description="GPUs per pod (nvidia.com/gpu); one process each. 0 = CPU pods with "
                                           "distributed.nproc_per_node processes")
    nodes: int = Field(1, ge=1, description="pods of the Indexed Job (torchrun --nnodes)")
    cpu: str | None = Field(None, description="CPU request and limit of each pod, e.g. '8'")
    memory: str | None = Field(None, description="memory request and limit of each pod, e.g. '64Gi'")
    volume_claim: str | None = Field(None, description="PersistentVolumeClaim (ReadWriteMany) holding output_dir "
                                                       "and the data")
    mount_path: str = Field("/shared", description="where the claim is mounted in the pods")
    service_account: str | None = Field(None, description="pods' service account (None: the namespace default)")
    image_pull_secret: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    rdzv_port: int = Field(29500, ge=1024, le=65535)
    backoff_limit: int = Field(0, ge=0, description="pod retries inside one Job (a rerun of the flow resumes too)")
    ttl_seconds_after_finished: int | None = Field(3600, ge=0, description="the cluster deletes a finished Job "
                                                                           "after this long")
    poll_seconds: float = Field(10.0, gt=0)
    kubeconfig: str | None = Field(None, description="kubeconfig file (None: in-cluster config, else ~/.kube/config)")
    context: str | None = Field(None, description="kubeconfig context")

    # Every string below goes into the Job's or the Service's manifest: checked against what Kubernetes accepts
    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return None if value is None else names.image_reference("", value)

    @field_validator("namespace")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        return names.dns_label("", value)

    @field_validator("volume_claim", "service_account", "image_pull_secret")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        return None if value is None else names.dns_subdomain("", value)

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, value) -> str | None:
        value = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value  # YAML: 8
        return None if value is None else names.quantity("", value)

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            names.label_key("", key)
            names.label_value("", label)
        return value

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return names.absolute_path("", value).rstrip("/") or "/"


class LauncherConfig(_Launcher):
    """Where GPU stages run; see the module docstring. Checked before any compute (:func:`check_launcher`)."""

    kind: Literal["local", "torchrun", "slurm", "kubernetes"] = "local"
    concurrency_limit: str | None = Field(None, description="name of a Prefect global concurrency limit: one slot "
                                                            "is held for the whole of each GPU stage, so pipelines "
                                                            "sharing a GPU pool do not oversubscribe it")
    concurrency_timeout_seconds: float | None = Field(None, gt=0, description="fail a stage that waited this long "
                                                                              "for a slot (None: wait)")
    concurrency_lease_seconds: float = Field(300, ge=10, description="how long a slot stays taken after its "
                                                                     "holder stopped renewing it (a killed or lost "
                                                                     "process): a live holder renews it; Prefect's "
                                                                     "default is 300")
    slurm: SlurmLauncherConfig = SlurmLauncherConfig()
    kubernetes: KubernetesLauncherConfig = KubernetesLauncherConfig()

    @model_validator(mode="after")
    def _complete(self) -> "LauncherConfig":
        if self.kind == "kubernetes" and not self.kubernetes.image:
            raise ValueError("launcher.kind=kubernetes needs launcher.kubernetes.image: the image with mclpipe "
                             "installed (build the repo's Dockerfile and push it), e.g. "
                             "--set launcher.kubernetes.image=registry.example.org/mclpipe:0.1")
        if self.kind == "kubernetes" and not self.kubernetes.volume_claim:
            raise ValueError("launcher.kind=kubernetes needs launcher.kubernetes.volume_claim: a ReadWriteMany "
                             "PersistentVolumeClaim that holds output_dir and the data (the pods write the step "
                             "directories there), e.g. --set launcher.kubernetes.volume_claim=mclpipe-shared")
        if self.concurrency_limit is not None and not self.concurrency_limit.strip():
            raise ValueError("launcher.concurrency_limit is empty: give the name of a Prefect global concurrency "
                             "limit (prefect gcl create gpus --limit 8) or null")
        return self

    @property
    def remote(self) -> bool:
        return self.kind in ("slurm", "kubernetes")

    def nnodes(self) -> int | None:
        """Nodes of a cluster launch (None: the config's distributed section decides)."""
        return {"slurm": self.slurm.nodes, "kubernetes": self.kubernetes.nodes}.get(self.kind)

    def gpus_per_node(self) -> int | None:
        return {"slurm": self.slurm.gpus_per_node, "kubernetes": self.kubernetes.gpus}.get(self.kind)


def check_launcher(config) -> None:
    """Checks of ``config.launcher`` against the rest of a pipeline config (its ``distributed`` section and
    ``output_dir``), run while the config validates, so before any compute. ``distributed`` stays the one place
    that says how many processes a stage has (it is part of the content keys: the batch splits over them);
    ``launcher`` says where they run and must agree with it. Raises ConfigError naming the fix."""
    from contrastive.errors import ConfigError

    launcher, d = config.launcher, config.distributed
    if not launcher.remote:
        return
    kind, nodes, gpus = launcher.kind, launcher.nnodes(), launcher.gpus_per_node()
    if d.nnodes != nodes:
        raise ConfigError(f"launcher.{kind}.nodes={nodes} but distributed.nnodes={d.nnodes}: the stage has "
                          f"distributed.nproc_per_node x nnodes processes; set both to the same node count "
                          f"(--set distributed.nnodes={nodes})")
    if gpus and d.nproc_per_node != gpus:
        raise ConfigError(f"launcher.{kind} gives {gpus} GPUs a node (one process each) but "
                          f"distributed.nproc_per_node={d.nproc_per_node}: set distributed.nproc_per_node={gpus}")
    if kind == "slurm":  # the step directories are written into the batch script (#SBATCH --output)
        try:
            names.script_path("output_dir", str(Path(config.output_dir).absolute()))
        except ValueError as exc:
            raise ConfigError(f"{exc} (launcher.kind=slurm writes it into the batch script)") from None
        check_slurm_devices(config)
        if nodes > 1:
            check_shared_storage(config)
    if d.rdzv_endpoint:
        raise ConfigError(f"distributed.rdzv_endpoint={d.rdzv_endpoint!r} with launcher.kind={kind}: the launcher "
                          "puts the rendezvous on the job's first node; set distributed.rdzv_endpoint=null")
    if kind == "kubernetes":
        mount = Path(launcher.kubernetes.mount_path)
        resolved = Path(config.output_dir).absolute()
        if mount != resolved and mount not in resolved.parents:
            raise ConfigError(f"output_dir {resolved} is not under launcher.kubernetes.mount_path {mount}: the pods "
                              f"write the step directories there; set output_dir={mount}/runs (with the claim "
                              "mounted at the same path where the flow runs)")


def check_slurm_devices(config) -> None:
    """The job's GPUs agree with the stage's device and backend: a CPU job (``gpus_per_node=0``) gets no GPU from
    Slurm, so ``device: cuda`` or ``backend: nccl`` (GPUs only) would fail on the nodes after the job waited in
    the queue."""
    from contrastive.errors import ConfigError

    s, d = config.launcher.slurm, config.distributed
    if s.gpus_per_node:
        return
    if getattr(config, "device", "auto") == "cuda":
        raise ConfigError("device=cuda but launcher.slurm.gpus_per_node=0 asks Slurm for no GPU: set "
                          f"launcher.slurm.gpus_per_node (and distributed.nproc_per_node) to the GPUs of a node, or "
                          "device=cpu")
    if d.backend == "nccl":
        raise ConfigError("distributed.backend=nccl but launcher.slurm.gpus_per_node=0 asks Slurm for no GPU (nccl "
                          "runs on GPUs only): set launcher.slurm.gpus_per_node, or distributed.backend=gloo")


# file systems that live on one machine: a job's other nodes see their own (empty) one at the same path
NODE_LOCAL_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs", "zram")


def check_shared_storage(config, *, mounts: str = "/proc/mounts") -> None:
    """A multi-node job's ranks write and read the step directories (checkpoints, the export) and the data under
    ``output_dir`` / ``data.cache_dir`` on every node: refuse a path on a file system that exists on one machine
    only (tmpfs, ramfs). Whether a network file system is mounted on every node cannot be seen from here: the
    batch script checks that on each node before the stage starts (launchers/slurm.py)."""
    from contrastive.errors import ConfigError

    paths = {"output_dir": config.output_dir}
    cache_dir = getattr(getattr(config, "data", None), "cache_dir", None)
    if cache_dir:
        paths["data.cache_dir"] = cache_dir
    for key, path in paths.items():
        kind, mount = filesystem_of(Path(path).absolute(), mounts=mounts)
        if kind in NODE_LOCAL_FILESYSTEMS:
            raise ConfigError(f"{key}={Path(path).absolute()} is on {kind} ({mount}), which only this machine sees, "
                              f"but launcher.slurm.nodes={config.launcher.slurm.nodes}: set {key} to storage every "
                              "node mounts at the same path (NFS, Lustre, GPFS, ...)")


def filesystem_of(path: Path, *, mounts: str = "/proc/mounts") -> tuple[str, str]:
    """(type, mount point) of the file system holding ``path``: the longest mount point above it (unknown, / where
    the mount table cannot be read)."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return "unknown", "/"
    best = ("unknown", "/")
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(fields[1].replace("\\040", " "))
        if (point == path or point in path.parents) and len(str(point)) >= len(best[1]):
            best = (fields[2], str(point))
    return best


def build_launcher(launcher: LauncherConfig, *, rdzv_endpoint: str | None = None,
                   output_dir: str | None = None):
    """The library launcher of this section (None for ``local``: the caller keeps today's in-process / local
    torchrun path) and how often to poll it. ``rdzv_endpoint``: distributed.rdzv_endpoint, for a hand-made
    multi-node ``torchrun`` launch."""
    from launchers.local import LocalTorchrunLauncher

    if launcher.kind == "local":
        return None, 0.0
    if launcher.kind == "torchrun":
        return LocalTorchrunLauncher(rdzv_endpoint=rdzv_endpoint), 1.0
    if launcher.kind == "slurm":
        from launchers.slurm import SlurmLauncher, SlurmSpec
        s = launcher.slurm
        spec = SlurmSpec(nodes=s.nodes, gpus_per_node=s.gpus_per_node, cpus_per_task=s.cpus_per_task,
                         partition=s.partition, time_limit=s.time_limit, account=s.account,
                         extra_sbatch=tuple(s.extra_sbatch), setup=tuple(s.setup),
                         signal_lead_seconds=s.signal_lead_seconds, rdzv_port=s.rdzv_port, poll_seconds=s.poll_seconds,
                         container_image=s.container_image, container_mounts=tuple(s.container_mounts),
                         output_dir=output_dir)
        return SlurmLauncher(spec=spec), s.poll_seconds
    from launchers.kubernetes import KubernetesLauncher, KubernetesSpec
    k = launcher.kubernetes
    spec = KubernetesSpec(image=k.image, namespace=k.namespace, gpus=k.gpus, nodes=k.nodes, cpu=k.cpu,
                          memory=k.memory, volume_claim=k.volume_claim, mount_path=k.mount_path,
                          service_account=k.service_account, image_pull_secret=k.image_pull_secret,
                          node_selector=tuple(sorted(k.node_selector.items())), rdzv_port=k.rdzv_port,
                          backoff_limit=k.backoff_limit, ttl_seconds_after_finished=k.ttl_seconds_after_finished)
    return KubernetesLauncher(spec=spec, kubeconfig=k.kubeconfig, context=k.context), k.poll_seconds


def node_python(launcher: LauncherConfig) -> str | None:
    """The interpreter the job's nodes run (None: the flow's own; the image's ``python`` on Kubernetes and in a
    Slurm job's container)."""
    if launcher.kind == "slurm" and launcher.slurm.container_image and launcher.slurm.python is None:
        return "python"
    return {"slurm": launcher.slurm.python, "kubernetes": "python"}.get(launcher.kind)
