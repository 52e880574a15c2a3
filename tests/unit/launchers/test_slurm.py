"""The sbatch script and the Slurm client calls (launchers/slurm.py) against hand-written expectations.
The real cluster runs in tests/launchers/test_slurm_real.py."""
import subprocess
from pathlib import Path

import pytest

from contrastive.errors import MclpipeError
from launchers.base import JobHandle, JobSpec, JobState, LogTail
from launchers.slurm import SlurmLauncher, SlurmSpec, build_sbatch_script, parse_scontrol, status_from

JOB = JobSpec(name="mcl-stage0", stage_dir=Path("/shared/runs/train/abc"),
              args_path=Path("/shared/runs/train/abc/train_summary_args.json"), nproc_per_node=4, nnodes=2,
              python="/shared/venv/bin/python", workdir=Path("/shared/mclpipe"),
              env=(("PYTHONPATH", "/shared/mclpipe"), ("NCCL_DEBUG", "WARN x")), log_name="train.log")

EXPECTED = """#!/bin/bash
#SBATCH --job-name=mcl-stage0
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --partition=gpu
#SBATCH --account=lab42
#SBATCH --time=1-00:00:00
#SBATCH --output=/shared/runs/train/abc/train.log
#SBATCH --open-mode=append
#SBATCH --chdir=/shared/mclpipe
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --constraint=a100

# environment (launcher.slurm.setup)
module load cuda/12.4
source /shared/venv/bin/activate
export PYTHONPATH=/shared/mclpipe
export NCCL_DEBUG='WARN x'

head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=29400
echo "mclpipe: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST, rendezvous $head:$port"
requeue() {
  echo "mclpipe: time limit near: requeueing job $SLURM_JOB_ID; it resumes from the last checkpoint"
  scontrol requeue "$SLURM_JOB_ID"
}
trap requeue USR1
# every node sees the step directory (output_dir on shared storage)
srun --nodes=2 --ntasks-per-node=1 /bin/sh -c 'test -d "$0" || { echo "mclpipe: node $(hostname) does not see $0: \
output_dir must be on storage that every node of the job mounts at the same path (see docs/launchers.md)"; exit 3; }' \
/shared/runs/train/abc || exit 3
srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 /shared/venv/bin/python -m torch.distributed.run \
--nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint="$head:$port" \
--rdzv-id="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}" -m contrastive.engine.launch \
/shared/runs/train/abc/train_summary_args.json &
stage=$!
# wait returns early when a trapped signal arrives: wait again until srun itself ended
while true; do wait "$stage"; status=$?; kill -0 "$stage" 2>/dev/null || break; done
echo "mclpipe: stage exited with $status"
exit "$status"
""".replace("\\\n", "")


def test_sbatch_script_two_gpu_nodes():
    spec = SlurmSpec(nodes=2, gpus_per_node=4, cpus_per_task=16, partition="gpu", time_limit="1-00:00:00",
                     account="lab42", extra_sbatch=("--constraint=a100",),
                     setup=("module load cuda/12.4", "source /shared/venv/bin/activate"), signal_lead_seconds=120,
                     rdzv_port=29400)
    assert build_sbatch_script(job=JOB, spec=spec) == EXPECTED


def test_sbatch_script_minimal_cpu_job_has_no_signal_and_a_job_derived_port():
    job = JobSpec(name="s", stage_dir=Path("/d"), args_path=Path("/d/a.json"), nproc_per_node=2)
    script = build_sbatch_script(job=job, spec=SlurmSpec(signal_lead_seconds=0))
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=s", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --time=04:00:00", "#SBATCH --output=/d/job.log", "#SBATCH --open-mode=append"]
    assert "port=$((29500 + SLURM_JOB_ID % 10000))" in script.splitlines()
    assert "trap requeue USR1" not in script and "--nproc-per-node=2" in script
    assert "does not see" not in script  # one node: no check that the nodes share the step directory
    assert "python -m torch.distributed.run" in script


def test_node_counts_must_agree():
    with pytest.raises(MclpipeError, match="launcher.slurm.nodes and distributed.nnodes"):
        build_sbatch_script(job=JOB, spec=SlurmSpec(nodes=1))


def test_the_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(EXPECTED)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


@pytest.mark.parametrize("state, exit_code, expected", [
    ("PENDING", None, (JobState.PENDING, "")), ("REQUEUED", None, (JobState.PENDING, "")),
    ("RUNNING", None, (JobState.RUNNING, "")), ("COMPLETING", None, (JobState.RUNNING, "")),
    ("COMPLETED", "0:0", (JobState.SUCCEEDED, "")), ("CANCELLED by 0", "0:15", (JobState.CANCELLED, "CANCELLED")),
    ("CANCELLED+", None, (JobState.CANCELLED, "CANCELLED")),
    ("FAILED", "1:0", (JobState.FAILED, "FAILED, exit code 1:0")),
    ("TIMEOUT", "0:0", (JobState.FAILED, "TIMEOUT, exit code 0:0")),
    ("OUT_OF_MEMORY", None, (JobState.FAILED, "OUT_OF_MEMORY")),
])
def test_slurm_states(state, exit_code, expected):
    status = status_from(state, exit_code)
    assert (status.state, status.detail) == expected


def test_unknown_state_names_the_check():
    with pytest.raises(MclpipeError, match="scontrol show job"):
        status_from("WEIRD")


def test_parse_scontrol():
    fields = parse_scontrol("JobId=7 JobName=s UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0")
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "1:0" and fields["JobId"] == "7"


class FakeSlurm:
    """Answers the Slurm commands like a cluster without accounting (sacct fails): ``answers`` maps a command to
    (exit code, stdout), or to a function of its arguments that returns them."""

    def __init__(self, answers):
        self.calls, self.answers = [], answers

    def __call__(self, args, **kwargs):
        self.calls.append(args)
        answer = self.answers.get(args[0], (0, ""))
        code, out = answer(args) if callable(answer) else answer
        return subprocess.CompletedProcess(args, code, stdout=out, stderr="boom" if code else "")


def test_submit_poll_cancel_commands(tmp_path):
    fake = FakeSlurm({"sbatch": (0, "123;cluster\n"), "squeue": (0, ""), "sacct": (1, ""),
                      "scontrol": (0, "JobId=123 JobState=COMPLETED ExitCode=0:0\n")})
    launcher = SlurmLauncher(spec=SlurmSpec(), run=fake)
    job = JobSpec(name="s", stage_dir=tmp_path, args_path=tmp_path / "a.json", nproc_per_node=1)
    handle = launcher.submit(job)
    assert handle.job_id == "123" and fake.calls[0] == ["sbatch", "--parsable", str(tmp_path / "job.sbatch")]
    assert (tmp_path / "job.sbatch").read_text().startswith("#!/bin/bash\n#SBATCH --job-name=s\n")
    assert launcher.poll(handle).state is JobState.SUCCEEDED
    assert [c[0] for c in fake.calls[1:]] == ["squeue", "sacct", "scontrol"]
    launcher.cancel(handle)
    assert fake.calls[-1] == ["scancel", "123"]


def test_sbatch_refusal_is_reported(tmp_path):
    launcher = SlurmLauncher(run=FakeSlurm({"sbatch": (1, "")}))
    with pytest.raises(MclpipeError, match="sbatch --parsable .* failed .*boom"):
        launcher.submit(JobSpec(name="s", stage_dir=tmp_path, args_path=tmp_path / "a.json", nproc_per_node=1))


def test_missing_slurm_clients_name_the_fix(tmp_path):
    def absent(args, **kwargs):
        raise FileNotFoundError(args[0])
    with pytest.raises(MclpipeError, match="Slurm client commands .* launcher.kind=local"):
        SlurmLauncher(run=absent).submit(JobSpec(name="s", stage_dir=tmp_path, args_path=tmp_path / "a.json",
                                                 nproc_per_node=1))


def test_a_forgotten_job_is_reported(tmp_path):
    launcher = SlurmLauncher(run=FakeSlurm({"squeue": (1, ""), "sacct": (1, ""), "scontrol": (1, "")}))
    handle = JobHandle(kind="slurm", job_id="9", log=LogTail(tmp_path / "log"))
    with pytest.raises(MclpipeError, match="no longer knows job 9"):
        launcher.poll(handle)


@pytest.mark.parametrize("injection", ["gpu\n#SBATCH --wrap=id", "gpu\nid", "gpu;id", "gpu$(id)", "gpu`id`"])
@pytest.mark.parametrize("field", ["partition", "account", "time_limit", "extra_sbatch", "job name", "log path"])
def test_a_spec_built_around_the_config_still_cannot_add_a_script_line(field, injection):
    """Defence in depth: a SlurmSpec or JobSpec built by other code than the config (whose validators refuse these
    first, tests/unit/test_config_launcher.py) is checked again when the script is written."""
    spec, job = SlurmSpec(nodes=2, partition="gpu"), JOB
    if field == "extra_sbatch":
        spec = SlurmSpec(nodes=2, extra_sbatch=(f"--qos={injection}",))
    elif field == "job name":
        job = JobSpec(**{**JOB.__dict__, "name": injection})
    elif field == "log path":
        job = JobSpec(**{**JOB.__dict__, "stage_dir": Path("/shared") / injection})
    else:
        spec = SlurmSpec(nodes=2, **{field: injection})
    with pytest.raises(MclpipeError, match="refusing to write the batch script: .* is refused"):
        build_sbatch_script(job=job, spec=spec)


def test_a_working_directory_with_a_space_is_named_as_such():
    job = JobSpec(**{**JOB.__dict__, "workdir": Path("/home/me/my runs")})
    with pytest.raises(MclpipeError, match=r"the flow's working directory \(sbatch --chdir\)='/home/me/my runs' is "
                                           "refused: a path of letters"):
        build_sbatch_script(job=job, spec=SlurmSpec(nodes=2))


def test_setup_lines_and_variables_cannot_add_a_script_line():
    with pytest.raises(MclpipeError, match="launcher.slurm.setup"):
        build_sbatch_script(job=JOB, spec=SlurmSpec(nodes=2, setup=("module load cuda\nid",)))
    with pytest.raises(MclpipeError, match="a job variable"):
        build_sbatch_script(job=JobSpec(**{**JOB.__dict__, "env": (("X;id", "1"),)}), spec=SlurmSpec(nodes=2))
    # a variable's value and the interpreter are quoted for the shell: `$(id)` stays text
    job = JobSpec(**{**JOB.__dict__, "env": (("NCCL_DEBUG", "$(id)"),), "python": "/opt/my python"})
    script = build_sbatch_script(job=job, spec=SlurmSpec(nodes=2))
    assert "export NCCL_DEBUG='$(id)'" in script and "'/opt/my python' -m torch.distributed.run" in script


def test_the_storage_check_names_the_node_that_does_not_see_the_step_directory(tmp_path):
    """The two-node script's first step, run here (one "node": this machine) with srun standing for itself."""
    job = JobSpec(**{**JOB.__dict__, "stage_dir": tmp_path / "absent"})
    [check] = [line for line in build_sbatch_script(job=job, spec=SlurmSpec(nodes=2)).splitlines()
               if "does not see" in line]
    command = check.removeprefix("srun --nodes=2 --ntasks-per-node=1 ")
    absent = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert absent.returncode == 3
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert absent.stdout.strip() == (f"mclpipe: node {host} does not see {tmp_path / 'absent'}: output_dir must be on "
                                     "storage that every node of the job mounts at the same path "
                                     "(see docs/launchers.md)")
    (tmp_path / "absent").mkdir()
    assert subprocess.run(["bash", "-c", command], capture_output=True, text=True).returncode == 0


LOST = {"squeue": (0, ""), "sacct": (1, ""), "sinfo": (0, "mcl-node1|idle|none\nmcl-node2|down*|Not responding\n"
                                                          "mcl-node2|down*|Not responding\n"),
        "scontrol": (0, "JobId=5 JobState=NODE_FAIL Reason=NodeDown NodeList=mcl-node[1-2] ExitCode=0:0\n")}


def test_a_failed_job_names_the_node_it_lost(tmp_path):
    fake = FakeSlurm(LOST)
    launcher = SlurmLauncher(run=fake)
    handle = JobHandle(kind="slurm", job_id="5", log=LogTail(tmp_path / "log"))
    status = launcher.poll(handle)
    assert (status.state, status.detail) == (JobState.FAILED,
                                             "NODE_FAIL, exit code 0:0; lost node mcl-node2 (down*: Not responding)")
    assert ["sinfo", "-h", "-N", "-n", "mcl-node[1-2]", "-o", "%N|%T|%E"] in fake.calls


def test_the_failure_names_job_node_and_resume_command_on_its_first_line(tmp_path):
    from launchers.base import JobFailed, run_job

    job = JobSpec(name="mcl-train0", stage_dir=tmp_path, args_path=tmp_path / "a.json", nproc_per_node=1, nnodes=2)
    launcher = SlurmLauncher(spec=SlurmSpec(nodes=2), run=FakeSlurm({**LOST, "sbatch": (0, "5\n")}))
    with pytest.raises(JobFailed) as raised:
        run_job(launcher, job, on_line=lambda line: None, poll_seconds=0)
    first = str(raised.value).splitlines()[0]
    assert first.startswith("slurm job 5 of mcl-train0 ended failed (NODE_FAIL, exit code 0:0; lost node mcl-node2 "
                            "(down*: Not responding)); to resume the stage from ")
    assert f"{tmp_path / 'checkpoints' / 'last.pt'}, run the same `mclpipe run` command again" in first


def test_a_failed_job_on_well_nodes_names_none(tmp_path):
    answers = {**LOST, "sinfo": (0, "mcl-node1|idle|none\nmcl-node2|mixed|none\n"),
               "scontrol": (0, "JobId=5 JobState=FAILED NodeList=mcl-node[1-2] ExitCode=1:0\n")}
    status = SlurmLauncher(run=FakeSlurm(answers)).poll(JobHandle(kind="slurm", job_id="5",
                                                                  log=LogTail(tmp_path / "log")))
    assert status.detail == "FAILED, exit code 1:0"


def test_a_job_slurm_requeued_after_losing_a_node_is_cancelled_and_names_it(tmp_path):
    """A --requeue job whose node died goes back to the queue (Slurm's own requeue): it would wait for that node
    (or rerun elsewhere unseen), so the launcher ends it and names the node."""
    fake = FakeSlurm({**LOST, "squeue": (0, "RUNNING|mcl-node[1-2]\n")})
    launcher = SlurmLauncher(run=fake)
    handle = JobHandle(kind="slurm", job_id="5", log=LogTail(tmp_path / "log"))
    assert launcher.poll(handle).state is JobState.RUNNING
    fake.answers["squeue"] = (0, "PENDING|\n")  # requeued: no nodes of its own any more
    status = launcher.poll(handle)
    assert (status.state, status.detail) == (
        JobState.FAILED, "NODE_FAIL: Slurm requeued it after losing node mcl-node2 (down*: Not responding); cancelled")
    assert fake.calls[-1] == ["scancel", "5"]
    assert ["sinfo", "-h", "-N", "-n", "mcl-node[1-2]", "-o", "%N|%T|%E"] in fake.calls


def test_the_lost_node_is_named_though_the_job_was_seen_completing_on_the_well_one(tmp_path):
    """Between a node's failure and Slurm's requeue the job is COMPLETING, and squeue's %N lists only the nodes
    still cleaning up (the well one): the launcher keeps the whole allocation, so the requeued job still names and
    ends on the lost node (the two-node CI run that waited 2 minutes on the queue)."""
    def sinfo_of_the_named_nodes(args):
        named = args[args.index("-n") + 1]
        lines = {"mcl-node1": "mcl-node1|mixed|none\n", "mcl-node2": "mcl-node2|down*|Not responding\n"}
        return 0, "".join(line for node, line in lines.items() if named in (node, "mcl-node[1-2]"))

    fake = FakeSlurm({**LOST, "squeue": (0, "RUNNING|mcl-node[1-2]\n"), "sinfo": sinfo_of_the_named_nodes})
    launcher = SlurmLauncher(run=fake)
    handle = JobHandle(kind="slurm", job_id="5", log=LogTail(tmp_path / "log"))
    assert launcher.poll(handle).state is JobState.RUNNING
    fake.answers["squeue"] = (0, "COMPLETING|mcl-node1\n")
    assert launcher.poll(handle).state is JobState.RUNNING
    fake.answers["squeue"] = (0, "PENDING|\n")
    status = launcher.poll(handle)
    assert (status.state, status.detail) == (
        JobState.FAILED, "NODE_FAIL: Slurm requeued it after losing node mcl-node2 (down*: Not responding); cancelled")
    assert fake.calls[-1] == ["scancel", "5"]


def test_a_job_requeued_on_well_nodes_waits_in_the_queue(tmp_path):
    """Its own requeue before the time limit (USR1) or a preemption: the job comes back, nothing is cancelled."""
    fake = FakeSlurm({**LOST, "squeue": (0, "RUNNING|mcl-node[1-2]\n"),
                      "sinfo": (0, "mcl-node1|idle|none\nmcl-node2|drained|maintenance\n")})
    launcher = SlurmLauncher(run=fake)
    handle = JobHandle(kind="slurm", job_id="5", log=LogTail(tmp_path / "log"))
    launcher.poll(handle)
    fake.answers["squeue"] = (0, "PENDING|\n")
    assert launcher.poll(handle).state is JobState.PENDING
    assert ["scancel", "5"] not in fake.calls


def test_a_container_image_runs_each_node_s_agent_in_it_with_the_job_s_files_at_their_paths():
    """launcher.slurm.container_image (pyxis): the agent's srun gets the image, the working directory, output_dir
    and the extra mounts at their own paths, and the image's python; without it the line is unchanged. No pyxis
    runs here: the line is checked as Slurm receives it (docs/launchers.md)."""
    from launchers.slurm import torchrun_line

    job = JobSpec(name="s", stage_dir=Path("/shared/runs/steps/train0-k"), args_path=Path("/shared/runs/a.json"),
                  nproc_per_node=1, python="python", workdir=Path("/shared/mclpipe"))
    spec = SlurmSpec(container_image="registry.example.org#mclpipe:0.2.0", output_dir="/shared/runs",
                     container_mounts=("/data", "/shared/runs"))
    line = torchrun_line(job=job, spec=spec)
    assert line.startswith("srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1 "
                           "'--container-image=registry.example.org#mclpipe:0.2.0' "
                           "--container-mounts=/shared/mclpipe:/shared/mclpipe,/shared/runs:/shared/runs,/data:/data "
                           "--container-workdir=/shared/mclpipe python -m torch.distributed.run ")
    assert "--container" not in torchrun_line(job=job, spec=SlurmSpec())
    with pytest.raises(MclpipeError, match="container_image"):
        torchrun_line(job=job, spec=SlurmSpec(container_image="mclpipe:0.2 ; rm -rf /"))


def test_the_container_s_step_directory_is_mounted_when_output_dir_is_not_known():
    from launchers.slurm import container_options

    job = JobSpec(name="s", stage_dir=Path("/scratch/steps/t"), args_path=Path("/scratch/a.json"), nproc_per_node=1)
    assert container_options(job=job, spec=SlurmSpec(container_image="/images/mclpipe.sqsh")) == [
        "--container-image=/images/mclpipe.sqsh", "--container-mounts=/scratch/steps/t:/scratch/steps/t"]
