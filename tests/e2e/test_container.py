"""The project's image, built from this tree (`make image`) and run for real (issue 53): `mclpipe run` inside it as
the non-root user with no network and the run root on a mounted volume gives the host's table; `docker stop`
mid-stage ends the run with its one-line resume command and a second container resumes it to the same table; a
mount the user cannot write gets one line. Slow, and in the "docker" group (tests/conftest.py): one process builds
the image once and runs these one after the other."""
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.container import (UID, built_image, docker, owned_by_image_user, run_in_image, summary_results)
from tests.faults.cli_process import MCLPIPE, checkpoint_of, cli_env, one_line, tiny_run_args

pytestmark = pytest.mark.slow
# 128-144 steps a stage, checkpointed every 4: long enough for `docker stop` (about 0.2 s from the command to the
# SIGTERM) to land in the middle of one at one torch thread, about 12 ms a step on the 2-core CI machine
EPOCHS = "train.epochs=16"


@pytest.fixture(scope="module")
def host_results(tmp_path_factory):
    """The table of the host's own run of the same config (the venv's mclpipe)."""
    built_image()  # first: without Docker the tests skip (fail under CI) before a host run they cannot use
    workdir = tmp_path_factory.mktemp("host")
    done = subprocess.run([MCLPIPE, *tiny_run_args(workdir, EPOCHS)], cwd=workdir, env=cli_env(workdir),
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return summary_results(workdir)


@pytest.mark.timeout(5400)  # a cold build of the image (the layer cache makes it seconds), then two runs
def test_the_pipeline_in_the_image_gives_the_hosts_table(tmp_path, host_results):
    run_root = owned_by_image_user(tmp_path / "work")
    done = run_in_image(run_root, "run", "trifeature_tiny", "--set", EPOCHS)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary_results(run_root) == host_results
    # written by the image's non-root user, on the volume
    written = [path for path in (run_root / "runs").rglob("*")]
    assert written and {path.stat().st_uid for path in written} == {UID}
    assert (run_root / "mlflow.db").stat().st_uid == UID


@pytest.mark.timeout(3600)
def test_docker_stop_mid_stage_prints_the_resume_command_and_a_new_container_resumes(tmp_path, host_results):
    run_root = owned_by_image_user(tmp_path / "work")
    name = f"mclpipe-stop-{tmp_path.name}-{int(time.time())}"
    started = run_in_image(run_root, "run", "trifeature_tiny", "--set", EPOCHS, name=name, detach=True)
    assert started.returncode == 0, started.stderr
    try:
        deadline, inspected = time.monotonic() + 900, 0.0
        while checkpoint_of(run_root, "train1") is None:
            # `docker inspect` takes a tenth of a second or more: once a second, and only until stage 1 begins, so
            # that none delays the stop past stage 1's ~1 s between its first checkpoint and its end
            stage_1_began = any((run_root / "runs" / "steps").glob("train1-*"))
            if not stage_1_began and time.monotonic() - inspected > 1:
                state = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
                assert state == "true", docker("logs", name).stderr[-3000:]
                inspected = time.monotonic()
            assert time.monotonic() < deadline, "no checkpoint of stage 1 within 900 s"
            time.sleep(0.05)
        docker("stop", "-t", "60", name, timeout=120)
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout)
        logs = docker("logs", name)
        output = logs.stdout + logs.stderr
    finally:
        docker("rm", "-f", name, check=False)

    assert code == 143, output[-3000:]  # 128 + SIGTERM: tini handed docker's SIGTERM to mclpipe
    line = one_line(output, "interrupted:")
    assert "stopped by SIGTERM during the train step of stage 1 after step" in line
    assert "Traceback" not in output
    stopped_at = int(line.split("after step ", 1)[1].split(";", 1)[0])
    # the stage that was stopped: the one train1 step with a checkpoint now (after the resume both of stage 1's
    # steps, MCL and control, keep one, and which sorts first depends on the config's hash)
    [train1] = [path.parent.parent for path in (run_root / "runs" / "steps").glob("train1-*/checkpoints/last.pt")]
    resume = shlex.split(line.split("Resume with: ", 1)[1])
    assert resume[:2] == ["mclpipe", "resume"]

    resumed = run_in_image(run_root, *resume[1:])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert json.loads((train1 / "train_summary.json").read_text())["resumed_from_step"] == stopped_at
    assert summary_results(run_root) == host_results


def test_a_mount_the_user_cannot_write_gets_one_line(tmp_path):
    run_root = tmp_path / "root-owned"  # owned by root, mode 755: uid 1000 may read it, not write it
    run_root.mkdir(mode=0o755)
    done = run_in_image(run_root, "run", "trifeature_tiny")

    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    output = (done.stdout + done.stderr).strip()
    assert "Traceback" not in output
    [line] = output.splitlines()
    assert "/home/mcl/app" in line and "uid 1000" in line and "chown" in line
    assert list(run_root.iterdir()) == []


def test_the_image_brings_every_cuda_library_torch_links_but_the_driver():
    """Why the base has no CUDA (Dockerfile): the libraries libtorch_cuda.so links come from torch's own nvidia-*
    wheels in the venv; only the driver's libcuda is left, which the NVIDIA toolkit mounts at `docker run --gpus`."""
    script = ("import pathlib, torch; lib = pathlib.Path(torch.__file__).parent / 'lib' / 'libtorch_cuda.so'; "
              "print(lib)")
    lib = docker("run", "--rm", "--network", "none", "--entrypoint", "python", built_image(), "-c", script)
    ldd = docker("run", "--rm", "--network", "none", "--entrypoint", "ldd", built_image(), lib.stdout.strip())
    linked = dict(line.strip().split(" => ", 1) for line in ldd.stdout.splitlines() if " => " in line)
    not_found = sorted(name for name, where in linked.items() if where.startswith("not found"))
    assert not_found in ([], ["libcuda.so.1"]), ldd.stdout
    cuda = {name: where for name, where in linked.items() if name.startswith(("libcudart", "libcublas", "libcudnn",
                                                                              "libnccl"))}
    assert cuda and all("/site-packages/nvidia/" in os.path.normpath(where) for where in cuda.values()), cuda
    env = docker("image", "inspect", "-f", "{{json .Config.Env}}", built_image()).stdout
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env


def test_the_command_a_kubernetes_job_gives_its_pods_trains_a_stage_in_the_image(tmp_path):
    """One image everywhere: the container of the Job the kubernetes launcher builds (its command, environment and
    working directory, image make image's) run under `docker run`, the claim a bind mount at its mount path and
    the c10d rendezvous host (pod 0 of the headless Service) and the pod's own host name (in a pod's /etc/hosts)
    this container. No cluster runs here: the test stops
    at that boundary (docs/launchers.md)."""
    from contrastive.engine.launch import write_launch_args
    from launchers.base import JobSpec
    from launchers.kubernetes import KubernetesSpec, build_job
    from tests.faults.tiny_data import tiny_trifeature
    from tests.faults.train_tiny_stage import tiny_spec

    shared = owned_by_image_user(tmp_path / "claim")  # the PersistentVolumeClaim every pod mounts
    dataset = tiny_trifeature(shared / "data")
    in_pods = lambda path: "/shared" / path.relative_to(shared)  # noqa: E731
    stage = shared / "runs" / "train" / "ab12"
    stage.mkdir(parents=True)
    spec = tiny_spec(in_pods(dataset), in_pods(stage), epochs=1)
    args = write_launch_args(entry="contrastive.modalities.image.steps:train_stage_from_json",
                             kwargs={"spec": spec.to_json()}, backend="gloo", stage_dir=stage)
    subprocess.run(["chown", "-R", f"{UID}:{UID}", str(shared)], check=True)
    name = "mclpipe-mcl-train-ab12-0a1b2c"
    job = build_job(name=name, job=JobSpec(name="mclpipe-mcl-train-ab12", stage_dir=in_pods(stage),
                                           args_path=in_pods(args), nproc_per_node=1, nnodes=1, python="python",
                                           workdir=Path("/shared"), env=(("PYTHONUNBUFFERED", "1"),)),
                    spec=KubernetesSpec(image=built_image(), volume_claim="mclpipe-shared", nodes=1))
    [pod] = job.spec.template.spec.containers
    environment = [option for variable in pod.env or [] for option in ("-e", f"{variable.name}={variable.value}")]
    done = docker("run", "--rm", "--network", "none", "--hostname", f"{name}-0",
                  "--add-host", f"{name}-0.{name}:127.0.0.1", "--add-host", f"{name}-0:127.0.0.1", "-v", f"{shared}:/shared", "-w", pod.working_dir,
                  *environment, "--entrypoint", pod.command[0], pod.image, *pod.command[1:], timeout=1200,
                  check=False)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert pod.image == built_image() and pod.command[:3] == ["python", "-m", "torch.distributed.run"]
    summary = json.loads((stage / "train_summary.json").read_text())
    assert summary["steps"] > 0 and (stage / "model" / "model.pt").stat().st_uid == UID
