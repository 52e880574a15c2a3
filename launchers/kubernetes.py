"""A stage as a Kubernetes Indexed Job plus a headless Service, through the official ``kubernetes`` client.

Choice: a plain ``batch/v1`` Indexed Job (no JobSet / Kubeflow operator to install): ``nodes`` pods with
completion indexes 0..nodes-1, ``completions = parallelism = nodes``, one torchrun agent per pod. The pods' subdomain
is a headless Service selecting the Job's pods (``publishNotReadyAddresses``), so pod 0 is reachable as
``<job>-0.<service>`` before it is ready: every agent meets at the c10d rendezvous there. The step directories
(args, checkpoints, results) are on a ReadWriteMany PersistentVolumeClaim mounted at the same path in the pods as
where the flow runs, so a rerun resumes from the checkpoint the pods wrote. ``/dev/shm`` is a memory volume (NCCL
and DataLoader workers need more than the container default).

Tested up to the API boundary only (a fake API server in tests/unit/launchers/test_kubernetes.py): no cluster was
available where mclpipe is developed.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from contrastive.errors import MclpipeError
from launchers import names
from launchers.base import JobHandle, JobSpec, JobState, JobStatus

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class KubernetesSpec:
    """The pods of every stage of a pipeline (built from ``launcher.kubernetes``)."""

    image: str
    volume_claim: str
    namespace: str = "default"
    gpus: int = 0
    nodes: int = 1
    cpu: str | None = None
    memory: str | None = None
    mount_path: str = "/shared"
    service_account: str | None = None
    image_pull_secret: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    rdzv_port: int = 29500
    backoff_limit: int = 0
    ttl_seconds_after_finished: int | None = 3600

    def __post_init__(self):
        """Every string that goes into a manifest, against what Kubernetes accepts (the config checked them
        already; this holds for a spec built any other way)."""
        key = "launcher.kubernetes."
        checks = [(names.image_reference, "image", self.image),
                  (names.dns_subdomain, "volume_claim", self.volume_claim),
                  (names.dns_label, "namespace", self.namespace),
                  (names.absolute_path, "mount_path", self.mount_path),
                  (names.quantity, "cpu", self.cpu), (names.quantity, "memory", self.memory),
                  (names.dns_subdomain, "service_account", self.service_account),
                  (names.dns_subdomain, "image_pull_secret", self.image_pull_secret)]
        for label, value in self.node_selector:
            checks += [(names.label_key, "node_selector", label), (names.label_value, "node_selector", value)]
        try:
            for check, name, value in checks:
                if value is not None:
                    check(key + name, value)
        except ValueError as exc:
            raise MclpipeError(f"refusing to build the Kubernetes Job: {exc}") from None


def _client():
    try:
        from kubernetes import client
    except ImportError:
        raise MclpipeError("launcher.kind=kubernetes needs the kubernetes client: pip install 'mclpipe[kubernetes]'"
                           ) from None
    return client


def workdir_in_pods(*, job: JobSpec, spec: KubernetesSpec) -> str:
    """The flow's directory when it is on the shared volume (relative paths then mean the same), else the mount."""
    mount = Path(spec.mount_path)
    if job.workdir is not None and (Path(job.workdir) == mount or mount in Path(job.workdir).parents):
        return str(job.workdir)
    return str(mount)


def _check_name(name: str) -> None:
    """The Job's and the Service's name (also a label value and the pods' subdomain): an RFC 1123 label."""
    try:
        names.dns_label("the Job's name", name)
    except ValueError as exc:
        raise MclpipeError(f"refusing to build the Kubernetes Job: {exc}") from None


def build_service(*, name: str, job: JobSpec, spec: KubernetesSpec):
    """Headless Service over the Job's pods: DNS for ``<name>-<index>.<name>`` (the rendezvous on index 0)."""
    client = _client()
    _check_name(name)
    return client.V1Service(
        api_version="v1", kind="Service",
        metadata=client.V1ObjectMeta(name=name, namespace=spec.namespace, labels={"app": "mclpipe", "mclpipe/job": name}),
        spec=client.V1ServiceSpec(cluster_ip="None", publish_not_ready_addresses=True,
                                  selector={"job-name": name},
                                  ports=[client.V1ServicePort(name="rdzv", port=spec.rdzv_port,
                                                              target_port=spec.rdzv_port)]))


def build_job(*, name: str, job: JobSpec, spec: KubernetesSpec):
    """The Indexed Job: ``spec.nodes`` pods, each ``torchrun --nnodes N --nproc-per-node P`` with the c10d
    rendezvous at pod 0 of the headless Service ``name``."""
    client = _client()
    _check_name(name)
    if spec.nodes != job.nnodes:
        raise MclpipeError(f"job {job.name}: {job.nnodes} nodes of processes but the Kubernetes Job has {spec.nodes} "
                           "pods: set launcher.kubernetes.nodes and distributed.nnodes to the same count")
    command = [job.python, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}",
               f"--nproc-per-node={job.nproc_per_node}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint={name}-0.{name}:{spec.rdzv_port}", f"--rdzv-id={name}",
               *job.launch_module_args()]
    # the image has mclpipe installed: the flow's PYTHONPATH (a path on the login machine) would mean nothing there
    env = [client.V1EnvVar(name=key, value=value) for key, value in job.env if key != "PYTHONPATH"]
    amounts = {key: value for key, value in (("cpu", spec.cpu), ("memory", spec.memory)) if value}
    if spec.gpus:
        amounts["nvidia.com/gpu"] = str(spec.gpus)
    container = client.V1Container(
        name="stage", image=spec.image, command=command, env=env, working_dir=workdir_in_pods(job=job, spec=spec),
        ports=[client.V1ContainerPort(container_port=spec.rdzv_port, name="rdzv")],
        resources=client.V1ResourceRequirements(requests=amounts or None, limits=amounts or None),
        volume_mounts=[client.V1VolumeMount(name="shared", mount_path=spec.mount_path),
                       client.V1VolumeMount(name="dshm", mount_path="/dev/shm")])
    pod = client.V1PodSpec(
        restart_policy="Never", subdomain=name, containers=[container],
        service_account_name=spec.service_account, node_selector=dict(spec.node_selector) or None,
        image_pull_secrets=[client.V1LocalObjectReference(name=spec.image_pull_secret)]
        if spec.image_pull_secret else None,
        volumes=[client.V1Volume(name="shared", persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                     claim_name=spec.volume_claim)),
                 client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory"))])
    labels = {"app": "mclpipe", "mclpipe/job": name}
    return client.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=client.V1ObjectMeta(name=name, namespace=spec.namespace, labels=labels,
                                     annotations={"mclpipe/stage-dir": str(job.stage_dir)}),
        spec=client.V1JobSpec(
            completion_mode="Indexed", completions=spec.nodes, parallelism=spec.nodes,
            backoff_limit=spec.backoff_limit, ttl_seconds_after_finished=spec.ttl_seconds_after_finished,
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod)))


def job_status(job) -> JobStatus:
    """Our state of a V1Job: its Complete / Failed condition, else running while a pod is active."""
    status = job.status
    for condition in status.conditions or []:
        if condition.status == "True" and condition.type == "Complete":
            return JobStatus(JobState.SUCCEEDED)
        if condition.status == "True" and condition.type == "Failed":
            reason = ": ".join(part for part in (condition.reason, condition.message) if part)
            return JobStatus(JobState.FAILED, reason)
    if status.active or status.ready:
        return JobStatus(JobState.RUNNING)
    return JobStatus(JobState.PENDING)


def k8s_name(base: str) -> str:
    """A fresh DNS-1123 name per submission (a rerun must not collide with a finished Job kept for its TTL)."""
    stem = "".join(c if c.isalnum() or c == "-" else "-" for c in base.lower())[:52].strip("-")
    return f"{stem}-{secrets.token_hex(3)}"


@dataclass
class KubernetesLauncher:
    """Create / read / delete the Job and its Service with the official client. ``api_client``: a configured
    ``kubernetes.client.ApiClient`` (tests point one at a fake API server); None: in-cluster config, else the
    kubeconfig (``kubeconfig``, ``context``)."""

    spec: KubernetesSpec
    kubeconfig: str | None = None
    context: str | None = None
    api_client: object = None
    kind: str = "kubernetes"
    _apis: tuple = field(default=None, repr=False)

    def apis(self):
        if self._apis is None:
            client = _client()
            api_client = self.api_client
            if api_client is None:
                from kubernetes import config
                try:
                    if self.kubeconfig or self.context:
                        raise config.ConfigException("a kubeconfig was named")
                    config.load_incluster_config()
                except config.ConfigException:
                    try:
                        config.load_kube_config(config_file=self.kubeconfig, context=self.context)
                    except (config.ConfigException, FileNotFoundError, OSError) as exc:
                        raise MclpipeError(f"no Kubernetes credentials ({exc}): run the flow in the cluster, or set "
                                           "launcher.kubernetes.kubeconfig (and .context)") from None
                api_client = client.ApiClient()
            self._apis = (client.BatchV1Api(api_client), client.CoreV1Api(api_client))
        return self._apis

    def submit(self, job: JobSpec) -> JobHandle:
        batch, core = self.apis()
        name = k8s_name(job.name)
        ns = self.spec.namespace
        core.create_namespaced_service(ns, build_service(name=name, job=job, spec=self.spec))
        try:
            batch.create_namespaced_job(ns, build_job(name=name, job=job, spec=self.spec))
        except Exception:
            self._delete_service(core, name)
            raise
        return JobHandle(kind=self.kind, job_id=name, extra={"lines_seen": 0})

    def poll(self, handle: JobHandle) -> JobStatus:
        batch, _ = self.apis()
        return job_status(batch.read_namespaced_job_status(handle.job_id, self.spec.namespace))

    def _pods(self, handle: JobHandle):
        _, core = self.apis()
        return core.list_namespaced_pod(self.spec.namespace, label_selector=f"job-name={handle.job_id}").items

    def _log(self, pod) -> list[str]:
        from kubernetes.client.rest import ApiException
        _, core = self.apis()
        try:
            # raw bytes: this client's str conversion of a log answer can give "b'...'" (its repr) instead
            response = core.read_namespaced_pod_log(pod.metadata.name, self.spec.namespace, container="stage",
                                                    _preload_content=False)
            text = response.data.decode(errors="replace")
        except ApiException as exc:
            if exc.status in (400, 404):  # the container has not started yet (or is gone)
                return []
            raise
        return text.splitlines()

    def _rank0_pod(self, handle: JobHandle):
        pods = [p for p in self._pods(handle) if (p.metadata.labels or {}).get(INDEX_LABEL, "0") == "0"]
        return pods[0] if pods else None

    def new_lines(self, handle: JobHandle) -> list[str]:
        """Lines of pod 0 (rank 0 logs there) not yet returned."""
        pod = self._rank0_pod(handle)
        if pod is None:
            return []
        lines = self._log(pod)
        seen = handle.extra["lines_seen"]
        handle.extra["lines_seen"] = len(lines)
        return lines[seen:]

    def last_lines(self, handle: JobHandle, n: int = 20) -> list[str]:
        """Pod 0's last lines, then those of every other failed pod (where a rank other than 0 died)."""
        out = []
        for pod in self._pods(handle):
            index = (pod.metadata.labels or {}).get(INDEX_LABEL, "0")
            if index == "0" or (pod.status and pod.status.phase == "Failed"):
                lines = self._log(pod)[-n:]
                out += ([f"--- pod {pod.metadata.name} (index {index})"] if index != "0" else []) + lines
        return out

    def _delete_service(self, core, name: str) -> None:
        from kubernetes.client.rest import ApiException
        try:
            core.delete_namespaced_service(name, self.spec.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def cancel(self, handle: JobHandle) -> None:
        """Delete the Job with its pods (foreground propagation) and the Service."""
        from kubernetes.client.rest import ApiException
        batch, core = self.apis()
        try:
            batch.delete_namespaced_job(handle.job_id, self.spec.namespace,
                                        body=_client().V1DeleteOptions(propagation_policy="Foreground"))
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._delete_service(core, handle.job_id)
