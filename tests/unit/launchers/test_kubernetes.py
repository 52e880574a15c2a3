"""The Kubernetes launcher (launchers/kubernetes.py) up to the API boundary: the Job and Service of a
2-node config against hand-written manifests and the client's API models, and submit / poll / logs / cancel
through the official client against a fake API server speaking HTTP on loopback. No real cluster is involved."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from tests.components import require_modules  # noqa: E402

KUBERNETES_EXTRA = "pip install -e '.[test]' (make install): kubernetes and kubernetes-validate"
kubernetes = require_modules("kubernetes", fix=KUBERNETES_EXTRA)
from kubernetes import client  # noqa: E402

from contrastive.errors import MclpipeError  # noqa: E402
from launchers.base import JobFailed, JobSpec, JobState, run_job  # noqa: E402
from launchers.kubernetes import (KubernetesLauncher, KubernetesSpec, build_job,  # noqa: E402
                                              build_service, job_status)

JOB = JobSpec(name="mclpipe-mcl-train-ab12", stage_dir=Path("/shared/runs/train/ab12"),
              args_path=Path("/shared/runs/train/ab12/train_summary_args.json"), nproc_per_node=4, nnodes=2,
              python="python", workdir=Path("/shared/mclpipe"),
              env=(("PYTHONPATH", "/home/me/mclpipe"), ("PYTHONUNBUFFERED", "1")))
SPEC = KubernetesSpec(image="registry.example.org/mclpipe:0.1", volume_claim="mclpipe-shared", namespace="ml",
                      gpus=4, nodes=2, cpu="16", memory="64Gi", service_account="trainer")
NAME = "mclpipe-mcl-train-ab12-0a1b2c"
LABELS = {"app": "mclpipe", "mclpipe/job": NAME}
AMOUNTS = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"}

EXPECTED_JOB = {
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": NAME, "namespace": "ml", "labels": LABELS,
                 "annotations": {"mclpipe/stage-dir": "/shared/runs/train/ab12"}},
    "spec": {
        "completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0,
        "ttlSecondsAfterFinished": 3600,
        "template": {"metadata": {"labels": LABELS}, "spec": {
            "restartPolicy": "Never", "subdomain": NAME, "serviceAccountName": "trainer",
            "containers": [{
                "name": "stage", "image": "registry.example.org/mclpipe:0.1", "workingDir": "/shared/mclpipe",
                "command": ["python", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=4",
                            "--rdzv-backend=c10d", f"--rdzv-endpoint={NAME}-0.{NAME}:29500", f"--rdzv-id={NAME}",
                            "-m", "contrastive.engine.launch", "/shared/runs/train/ab12/train_summary_args.json"],
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "ports": [{"containerPort": 29500, "name": "rdzv"}],
                "resources": {"requests": AMOUNTS, "limits": AMOUNTS},
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}, {"name": "dshm", "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": "mclpipe-shared"}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        }},
    },
}
EXPECTED_SERVICE = {
    "apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "namespace": "ml", "labels": LABELS},
    "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"job-name": NAME},
             "ports": [{"name": "rdzv", "port": 29500, "targetPort": 29500}]},
}


def serialized(obj) -> dict:
    return client.ApiClient().sanitize_for_serialization(obj)


class Response:  # what ApiClient.deserialize reads
    def __init__(self, data: dict):
        self.data = json.dumps(data)


def test_two_node_job_and_service_match_the_hand_written_manifests():
    assert serialized(build_job(name=NAME, job=JOB, spec=SPEC)) == EXPECTED_JOB
    assert serialized(build_service(name=NAME, job=JOB, spec=SPEC)) == EXPECTED_SERVICE


def test_manifests_are_valid_api_objects():
    api = client.ApiClient()
    job = api.deserialize(Response(EXPECTED_JOB), "V1Job")
    assert job.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"
    assert serialized(job) == EXPECTED_JOB  # nothing dropped: every field is a field of the API model
    assert serialized(api.deserialize(Response(EXPECTED_SERVICE), "V1Service")) == EXPECTED_SERVICE
    with pytest.raises(ValueError):  # the models check required fields on the client side
        client.V1Container(name=None, image="x")


def test_pods_work_in_the_mount_when_the_flow_directory_is_elsewhere():
    job = JobSpec(name="j", stage_dir=Path("/shared/r"), args_path=Path("/shared/r/a.json"), nproc_per_node=1,
                  workdir=Path("/home/me"))
    one = KubernetesSpec(image="i", volume_claim="c")
    assert build_job(name="j-1", job=job, spec=one).spec.template.spec.containers[0].working_dir == "/shared"
    with pytest.raises(MclpipeError, match="launcher.kubernetes.nodes and distributed.nnodes"):
        build_job(name="j-1", job=JOB, spec=one)


@pytest.mark.parametrize("status, expected", [
    ({}, (JobState.PENDING, "")), ({"active": 2}, (JobState.RUNNING, "")),
    ({"succeeded": 2, "conditions": [{"type": "Complete", "status": "True"}]}, (JobState.SUCCEEDED, "")),
    ({"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                   "message": "Job has reached the specified backoff limit"}]},
     (JobState.FAILED, "BackoffLimitExceeded: Job has reached the specified backoff limit")),
])
def test_job_states(status, expected):
    job = client.ApiClient().deserialize(Response({"status": status}), "V1Job")
    result = job_status(job)
    assert (result.state, result.detail) == expected


class FakeApiServer(BaseHTTPRequestHandler):
    """The few Kubernetes API paths the launcher uses, with a scripted Job: each status read advances it."""
    requests: list = []
    script: list = []  # one (job status, pod-0 log, failed pod-1 log or None) per status read
    step = 0

    def log_message(self, *args):
        pass

    def _send(self, code: int, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        url = urlparse(self.path)
        type(self).requests.append((self.command, url.path, parse_qs(url.query), body))
        return url, body

    def do_POST(self):
        url, body = self._record()
        self._send(201, body)

    def do_DELETE(self):
        self._record()
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def do_GET(self):
        url, _ = self._record()
        cls = type(self)
        status, log0, log1 = cls.script[min(cls.step, len(cls.script)) - 1] if cls.step else ({}, "", None)
        if url.path.endswith("/status"):
            cls.step += 1
            status = cls.script[min(cls.step, len(cls.script)) - 1][0]
            return self._send(200, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"},
                                    "status": status})
        if url.path.endswith("/pods"):
            pods = [{"metadata": {"name": "p0", "labels": {"batch.kubernetes.io/job-completion-index": "0"}},
                     "status": {"phase": "Running"}}]
            if log1 is not None:
                pods.append({"metadata": {"name": "p1", "labels": {"batch.kubernetes.io/job-completion-index": "1"}},
                             "status": {"phase": "Failed"}})
            return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods})
        if url.path.endswith("/p0/log"):
            return self._send(200, log0, "text/plain")
        if url.path.endswith("/p1/log"):
            return self._send(200, log1 or "", "text/plain")
        self._send(404, {"kind": "Status", "code": 404})


@pytest.fixture
def api_server():
    FakeApiServer.requests, FakeApiServer.step = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    yield client.ApiClient(configuration)
    server.shutdown()


def launcher(api_client) -> KubernetesLauncher:
    return KubernetesLauncher(spec=SPEC, api_client=api_client)


def test_submit_stream_and_succeed_through_the_api(api_server):
    FakeApiServer.script = [({}, "", None), ({"active": 2}, "rank 0 up\nstep 1\n", None),
                            ({"succeeded": 2, "conditions": [{"type": "Complete", "status": "True"}]},
                             "rank 0 up\nstep 1\nstep 2\ndone\n", None)]
    lines = []
    status = run_job(launcher(api_server), JOB, on_line=lines.append, poll_seconds=0, sleep=lambda s: None)
    assert status.state is JobState.SUCCEEDED and lines == ["rank 0 up", "step 1", "step 2", "done"]
    posts = [(path, body) for method, path, _, body in FakeApiServer.requests if method == "POST"]
    assert [path for path, _ in posts] == ["/api/v1/namespaces/ml/services", "/apis/batch/v1/namespaces/ml/jobs"]
    name = posts[1][1]["metadata"]["name"]
    assert name.startswith("mclpipe-mcl-train-ab12-") and len(name) == len(NAME)
    assert posts[1][1] == json.loads(json.dumps(EXPECTED_JOB).replace(NAME, name))
    assert posts[0][1] == json.loads(json.dumps(EXPECTED_SERVICE).replace(NAME, name))
    pod_queries = [query for method, path, query, _ in FakeApiServer.requests if path.endswith("/pods")]
    assert pod_queries[0] == {"labelSelector": [f"job-name={name}"]}
    assert not [r for r in FakeApiServer.requests if r[0] == "DELETE"]


def test_a_failed_job_raises_with_its_name_and_the_failed_pods_lines(api_server):
    FakeApiServer.script = [({"active": 2}, "step 1\n", None),
                            ({"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                                           "reason": "BackoffLimitExceeded"}]},
                             "step 1\nstep 2\n", "Traceback\nRuntimeError: NCCL timeout\n")]
    with pytest.raises(JobFailed) as raised:
        run_job(launcher(api_server), JOB, on_line=lambda line: None, poll_seconds=0, sleep=lambda s: None)
    message = str(raised.value)
    assert f"kubernetes job {raised.value.job_id} of mclpipe-mcl-train-ab12 ended failed (BackoffLimitExceeded)" \
        in message
    assert raised.value.last_lines == ["step 1", "step 2", "--- pod p1 (index 1)", "Traceback",
                                       "RuntimeError: NCCL timeout"]


def test_an_interrupted_flow_deletes_the_job_and_its_service(api_server):
    FakeApiServer.script = [({"active": 2}, "step 1\n", None)]

    def cancelled(seconds):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_job(launcher(api_server), JOB, on_line=lambda line: None, poll_seconds=1, sleep=cancelled)
    deletes = [(path, body) for method, path, _, body in FakeApiServer.requests if method == "DELETE"]
    name = deletes[0][0].rsplit("/", 1)[1]
    assert deletes == [(f"/apis/batch/v1/namespaces/ml/jobs/{name}", {"propagationPolicy": "Foreground"}),
                       (f"/api/v1/namespaces/ml/services/{name}", None)]


def test_missing_credentials_name_the_fix(tmp_path):
    with pytest.raises(MclpipeError, match="launcher.kubernetes.kubeconfig"):
        KubernetesLauncher(spec=SPEC, kubeconfig=str(tmp_path / "no-such-kubeconfig")).apis()


# The Kubernetes versions mclpipe's manifests must be valid for (docs/launchers.md): Indexed Jobs are GA from 1.24.
SUPPORTED_VERSIONS = ("1.27.0", "1.30.0", "1.33.0", "1.37.0")


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_job_and_service_are_valid_against_the_official_schemas(version):
    """The rendered Indexed Job, headless Service and volumes against the OpenAPI schemas of each supported
    Kubernetes release (kubernetes-validate ships them; strict: no field the API does not know)."""
    kubernetes_validate = require_modules("kubernetes_validate", fix=KUBERNETES_EXTRA)
    serialize = client.ApiClient().sanitize_for_serialization
    validated = []
    for resource in (build_job(name=NAME, job=JOB, spec=SPEC), build_service(name=NAME, job=JOB, spec=SPEC)):
        manifest = serialize(resource)
        kubernetes_validate.validate(manifest, version, strict=True)  # raises ValidationError on what is refused
        validated.append(manifest["kind"])
    assert validated == ["Job", "Service"]


def test_the_schema_check_catches_what_the_api_would_refuse():
    """The check is not vacuous: a misspelt field and a wrong type are rejected by the same schemas."""
    kubernetes_validate = require_modules("kubernetes_validate", fix=KUBERNETES_EXTRA)
    manifest = client.ApiClient().sanitize_for_serialization(build_job(name=NAME, job=JOB, spec=SPEC))
    manifest["spec"]["completionMod"] = manifest["spec"].pop("completionMode")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, SUPPORTED_VERSIONS[-1], strict=True)
    manifest["spec"]["completionMode"] = manifest["spec"].pop("completionMod")
    manifest["spec"]["completions"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, SUPPORTED_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("injection", ["ml\nid", "ml;id", "ml$(id)", "ml`id`"])
@pytest.mark.parametrize("field", ["image", "volume_claim", "namespace", "mount_path", "cpu", "memory",
                                   "service_account", "image_pull_secret", "node_selector key",
                                   "node_selector value"])
def test_a_spec_built_around_the_config_is_still_checked(field, injection):
    """Defence in depth: a KubernetesSpec built by other code than the config (whose validators refuse these
    first) is checked when it is made; names are RFC 1123, labels and quantities as Kubernetes accepts them."""
    value = "/" + injection if field == "mount_path" else injection
    changes = ({"node_selector": ((value, "a100"),)} if field == "node_selector key" else
               {"node_selector": (("accelerator", value),)} if field == "node_selector value" else {field: value})
    with pytest.raises(MclpipeError, match="refusing to build the Kubernetes Job: launcher.kubernetes"):
        KubernetesSpec(**{**SPEC.__dict__, **changes})


def test_the_job_name_is_checked_where_the_manifests_are_built():
    for build in (build_job, build_service):
        with pytest.raises(MclpipeError, match="the Job's name"):
            build(name="mclpipe;id", job=JOB, spec=SPEC)
