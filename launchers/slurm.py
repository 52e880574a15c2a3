"""A stage as one Slurm batch job: ``srun`` starts one torchrun agent per node; the agents meet at a c10d
rendezvous on the job's first node and start ``nproc_per_node`` ranks each.

The flow (on a login node) writes the script into the step directory, submits it with ``sbatch --parsable``,
polls ``squeue`` (``sacct`` / ``scontrol`` once the job left the queue), tails the job's log file (on the shared
filesystem), and ``scancel``s the job when the flow run is cancelled.

Containers: with ``container_image`` (pyxis / enroot, ``srun --container-image``) every node's torchrun agent runs
in that image (``make image``'s: mclpipe and its dependencies installed, ``python`` on its PATH); the job's working
directory, its step directory's ``output_dir`` and ``container_mounts`` are mounted at the same paths inside, so the
flow, the nodes and the container read and write the same files.

Preemption and time limits: with ``signal_lead_seconds`` the script asks Slurm for ``--signal=B:USR1@N`` and
traps it: the job requeues itself (``scontrol requeue``), and the requeued job resumes from the stage's last
checkpoint, so a stage longer than the time limit loses at most one checkpoint interval per requeue.
"""
from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from contrastive.errors import MclpipeError
from launchers import names
from launchers.base import JobHandle, JobSpec, JobState, JobStatus, LogTail

# squeue / sacct / scontrol state names -> ours. CONFIGURING, COMPLETING, SUSPENDED, REQUEUED, RESIZING: not
# finished yet (a requeued job comes back as PENDING).
_STATES = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING, "REQUEUE_HOLD": JobState.PENDING, "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING, "RESIZING": JobState.RUNNING, "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED, "TIMEOUT": JobState.FAILED, "NODE_FAIL": JobState.FAILED,
    "PREEMPTED": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED, "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED, "SPECIAL_EXIT": JobState.FAILED, "REVOKED": JobState.FAILED,
}

# the states in which squeue's %N is the job's whole allocation (not the part still completing)
_NODES_ARE_THE_ALLOCATION = frozenset({"CONFIGURING", "RUNNING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"})


@dataclass(frozen=True)
class SlurmSpec:
    """Where and how big: the sbatch options of every stage of a pipeline (built from ``launcher.slurm``)."""

    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    partition: str | None = None
    time_limit: str = "04:00:00"
    account: str | None = None
    extra_sbatch: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    signal_lead_seconds: int = 90
    rdzv_port: int = 0  # 0: 29500 + job id mod 10000, so jobs sharing a node do not collide
    poll_seconds: float = 10.0
    #: pyxis's image (``registry#name:tag``, a ``docker://`` reference or an enroot ``.sqsh`` file); None: the
    #: nodes' own environment
    container_image: str | None = None
    #: more host paths mounted at the same path in the container (the data, a model cache)
    container_mounts: tuple[str, ...] = ()
    #: the output_dir of the pipeline (mounted in the container at the same path)
    output_dir: str | None = None


def sbatch_directives(*, job: JobSpec, spec: SlurmSpec) -> list[str]:
    """The ``#SBATCH`` lines: one task (a torchrun agent) per node; its log appends, so a requeued job continues
    the same file."""
    # the paths first, so a path with a space is reported as the path it is (paths with spaces cannot be written)
    _checked(names.script_path, "the job's log (under output_dir)", str(job.log_path))
    if job.workdir is not None:
        _checked(names.script_path, "the flow's working directory (sbatch --chdir)", str(job.workdir))
    options = [f"--job-name={job.name}", f"--nodes={spec.nodes}", "--ntasks-per-node=1"]
    if spec.gpus_per_node:
        options.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.cpus_per_task:
        options.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.partition:
        options.append(f"--partition={spec.partition}")
    if spec.account:
        options.append(f"--account={spec.account}")
    options += [f"--time={spec.time_limit}", f"--output={job.log_path}", "--open-mode=append"]
    if job.workdir is not None:
        options.append(f"--chdir={job.workdir}")
    if spec.signal_lead_seconds:
        options += ["--requeue", f"--signal=B:USR1@{spec.signal_lead_seconds}"]
    options += list(spec.extra_sbatch)
    # sbatch reads these lines itself (no shell): a value with a newline, space or quote would end the option or
    # add a line, so each is checked again here (the config already checked what it holds)
    return [f"#SBATCH {_checked(names.sbatch_option, 'an #SBATCH line', option)}" for option in options]


def _checked(check, key: str, value: str) -> str:
    try:
        return check(key, value)
    except ValueError as exc:
        raise MclpipeError(f"refusing to write the batch script: {exc}") from None


def container_options(*, job: JobSpec, spec: SlurmSpec) -> list[str]:
    """pyxis's ``srun`` options that run a task in ``spec.container_image`` with the job's files at their own
    paths: the working directory, the output_dir (else the step directory) and ``spec.container_mounts``."""
    if spec.container_image is None:
        return []
    image = _checked(names.container_image, "launcher.slurm.container_image", spec.container_image)
    shared = [str(job.workdir)] if job.workdir is not None else []
    shared += [spec.output_dir or str(job.stage_dir), *spec.container_mounts]
    mounts = ",".join(f"{path}:{path}" for path in dict.fromkeys(
        _checked(names.script_path, "a container mount", path) for path in shared))
    options = [f"--container-image={image}", f"--container-mounts={mounts}"]
    if job.workdir is not None:
        options.append(f"--container-workdir={job.workdir}")
    return options


def torchrun_line(*, job: JobSpec, spec: SlurmSpec) -> str:
    """``srun`` one agent per node (in the stage's container when there is one); c10d rendezvous at
    ``$head:$port`` (every agent computes the same head)."""
    agent = [job.python, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}",
             f"--nproc-per-node={job.nproc_per_node}", "--rdzv-backend=c10d"]
    quoted = " ".join(shlex.quote(part) for part in [*container_options(job=job, spec=spec), *agent])
    launch = " ".join(shlex.quote(part) for part in job.launch_module_args())
    return (f"srun --kill-on-bad-exit=1 --nodes={spec.nodes} --ntasks-per-node=1 {quoted} "
            f'--rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}" {launch}')


def shared_storage_check(*, job: JobSpec, spec: SlurmSpec) -> list[str]:
    """Before the stage, one task per node checks that its node sees the step directory (written by the flow): a
    node without the shared file system ends the job with one line naming the node, instead of a rank failing
    later on a missing args file or a checkpoint only one node has."""
    stage_dir = shlex.quote(str(job.stage_dir))
    missing = ('echo "mclpipe: node $(hostname) does not see $0: output_dir must be on storage that every node of '
               'the job mounts at the same path (see docs/launchers.md)"; exit 3')
    check = shlex.quote('test -d "$0" || { ' + missing + "; }")
    return ["# every node sees the step directory (output_dir on shared storage)",
            f"srun --nodes={spec.nodes} --ntasks-per-node=1 /bin/sh -c {check} {stage_dir} || exit 3"]


def build_sbatch_script(*, job: JobSpec, spec: SlurmSpec) -> str:
    """The batch script of one stage. ``srun`` runs in the background and the shell waits for it, so the USR1
    trap (time limit near) runs at once instead of after the stage."""
    if spec.nodes != job.nnodes:
        raise MclpipeError(f"job {job.name}: {job.nnodes} nodes of processes but the Slurm job has {spec.nodes} "
                           "nodes: set launcher.slurm.nodes and distributed.nnodes to the same count")
    port = str(spec.rdzv_port) if spec.rdzv_port else "$((29500 + SLURM_JOB_ID % 10000))"
    exports = [f"export {_checked(names.env_name, 'a job variable', name)}={shlex.quote(value)}"
               for name, value in job.env]
    setup = [_checked(names.one_line, "launcher.slurm.setup", line) for line in spec.setup]
    lines = ["#!/bin/bash", *sbatch_directives(job=job, spec=spec), "",
             "# environment (launcher.slurm.setup)", *setup, *exports, "",
             'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', f"port={port}",
             'echo "mclpipe: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST, '
             'rendezvous $head:$port"']
    if spec.signal_lead_seconds:
        lines += ["requeue() {",
                  '  echo "mclpipe: time limit near: requeueing job $SLURM_JOB_ID; it resumes from the last '
                  'checkpoint"',
                  '  scontrol requeue "$SLURM_JOB_ID"',
                  "}",
                  "trap requeue USR1"]
    if spec.nodes > 1:
        lines += shared_storage_check(job=job, spec=spec)
    lines += [torchrun_line(job=job, spec=spec) + " &",
              "stage=$!",
              "# wait returns early when a trapped signal arrives: wait again until srun itself ended",
              'while true; do wait "$stage"; status=$?; kill -0 "$stage" 2>/dev/null || break; done',
              'echo "mclpipe: stage exited with $status"',
              'exit "$status"', ""]
    return "\n".join(lines)


def parse_scontrol(text: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` of ``scontrol show job -o`` -> dict (values have no spaces except the last)."""
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def state_name(state: str) -> str:
    """The bare Slurm state name of what squeue / sacct / scontrol print (``CANCELLED by 0``, ``RUNNING+``)."""
    return state.split()[0].rstrip("+") if state.strip() else "UNKNOWN"


def status_from(state: str, exit_code: str | None = None) -> JobStatus:
    """Our state for a Slurm state name (``CANCELLED by 0`` -> CANCELLED)."""
    name = state_name(state)
    ours = _STATES.get(name)
    if ours is None:
        raise MclpipeError(f"Slurm reported job state {state!r}, which mclpipe does not know: check the job with "
                           "`scontrol show job <id>`")
    detail = name if ours in (JobState.FAILED, JobState.CANCELLED) else ""
    if exit_code and ours is JobState.FAILED:
        detail += f", exit code {exit_code}"
    return JobStatus(ours, detail)


@dataclass
class SlurmLauncher:
    """sbatch / squeue / sacct / scontrol / scancel through subprocess, so any Slurm that has its clients on
    this machine works (the flow runs on a login node). ``run`` is replaceable for tests."""

    spec: SlurmSpec = field(default_factory=SlurmSpec)
    kind: str = "slurm"
    run: object = subprocess.run

    def _call(self, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
        try:
            completed = self.run(args, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise MclpipeError(f"{args[0]} not found: launcher.kind=slurm needs the Slurm client commands on the "
                               "machine that runs the flow (a login node), or choose launcher.kind=local") from None
        if check and completed.returncode != 0:
            raise MclpipeError(f"`{' '.join(args)}` failed (exit {completed.returncode}): "
                               f"{(completed.stderr or completed.stdout).strip()}")
        return completed

    def submit(self, job: JobSpec) -> JobHandle:
        script_path = Path(job.stage_dir) / f"{job.log_path.stem}.sbatch"
        script_path.parent.mkdir(parents=True, exist_ok=True)
        script_path.write_text(build_sbatch_script(job=job, spec=self.spec))
        tail = LogTail(job.log_path)
        out = self._call(["sbatch", "--parsable", str(script_path)]).stdout.strip()
        job_id = out.split(";")[0]  # --parsable: "id" or "id;cluster"
        if not job_id.isdigit():
            raise MclpipeError(f"sbatch did not answer with a job id (got {out!r}); see {script_path}")
        return JobHandle(kind=self.kind, job_id=job_id, log=tail, extra={"script": script_path})

    def poll(self, handle: JobHandle) -> JobStatus:
        status, nodes = self._state(handle)
        if nodes:  # the nodes of its current run: a requeued job has none, and where it ran matters then
            handle.extra["nodes"] = nodes
        if status.state is JobState.FAILED:
            lost = self.lost_nodes(handle.job_id, nodes=handle.extra.get("nodes"))
            if lost:
                status = JobStatus(status.state, f"{status.detail}; lost node {', '.join(lost)}")
        elif status.state is JobState.PENDING and handle.extra.get("nodes"):
            # Back in the queue after it ran: our own requeue (the time limit's USR1), a preemption, or Slurm's
            # requeue after one of its nodes failed (a --requeue job). The last one would wait for that node, or
            # run again elsewhere unseen: it ends here, naming the node, and the rerun resumes it.
            lost = self.lost_nodes(handle.job_id, nodes=handle.extra["nodes"], responding_only=True)
            if lost:
                self.cancel(handle)
                status = JobStatus(JobState.FAILED, f"NODE_FAIL: Slurm requeued it after losing node "
                                                    f"{', '.join(lost)}; cancelled")
        return status

    def lost_nodes(self, job_id: str, *, nodes: str | None = None, responding_only: bool = False) -> list[str]:
        """The job's nodes (``nodes``, a Slurm node list, else the job's own from ``scontrol``) that Slurm holds
        down, failed, not responding (``*``) or, unless ``responding_only``, drained, each as
        ``name (state: reason)``: where a failed multi-node job lost its node. Empty when all are well."""
        if not nodes:
            shown = self._call(["scontrol", "show", "job", "-o", job_id], check=False)
            nodes = parse_scontrol(shown.stdout).get("NodeList", "") if shown.returncode == 0 else ""
        if not nodes or nodes == "(null)":
            return []
        listed = self._call(["sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T|%E"], check=False)
        bad = ("down", "fail", "failing") if responding_only else ("down", "fail", "failing", "drain", "drained",
                                                                  "draining")
        lost = []
        for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
            name, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if name and (state.endswith("*") or state.rstrip("*~#!%$@^-").split("+")[0] in bad):
                why = f": {reason}" if reason and reason != "none" else ""
                entry = f"{name} ({state}{why})"
                if entry not in lost:  # sinfo -N lists a node once per partition
                    lost.append(entry)
        return lost

    def _state(self, handle: JobHandle) -> tuple[JobStatus, str]:
        """The job's state and the node list of its current run ("" while pending or completing, or when only
        sacct / scontrol still know it)."""
        queued = self._call(["squeue", "-h", "-t", "all", "-j", handle.job_id, "-o", "%T|%N"], check=False)
        if queued.returncode == 0 and queued.stdout.strip():
            state, _, nodes = queued.stdout.strip().splitlines()[0].partition("|")
            # A COMPLETING job lists only the nodes still cleaning up: after a node failure, the well ones. Taken as
            # its nodes, they would hide the lost one once Slurm requeues the job.
            whole_allocation = state_name(state) in _NODES_ARE_THE_ALLOCATION
            return status_from(state), nodes.strip() if whole_allocation else ""
        accounted = self._call(["sacct", "-n", "-P", "-X", "-j", handle.job_id, "-o", "State,ExitCode"],
                               check=False)  # fails on clusters without accounting: then scontrol
        if accounted.returncode == 0 and accounted.stdout.strip():
            state, _, exit_code = accounted.stdout.strip().splitlines()[0].partition("|")
            return status_from(state, exit_code), ""
        shown = self._call(["scontrol", "show", "job", "-o", handle.job_id], check=False)
        if shown.returncode == 0 and shown.stdout.strip():
            fields = parse_scontrol(shown.stdout)
            return status_from(fields.get("JobState", ""), fields.get("ExitCode")), ""
        raise MclpipeError(f"Slurm no longer knows job {handle.job_id} (not in squeue, sacct or scontrol): see its "
                           f"log {handle.log.path}; rerunning the flow resumes the stage from its checkpoint")

    def new_lines(self, handle: JobHandle) -> list[str]:
        return handle.log.new_lines()

    def last_lines(self, handle: JobHandle, n: int = 20) -> list[str]:
        return handle.log.last_lines(n)

    def cancel(self, handle: JobHandle) -> None:
        self._call(["scancel", handle.job_id], check=False)
