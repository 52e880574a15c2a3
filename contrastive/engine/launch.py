"""Run one training stage under torchrun: ``python -m contrastive.engine.launch <stage_args.json>``.

The Prefect task writes ``{"entry": "package.module:function", "kwargs": {...}, "backend": ...}`` beside the
stage and starts ``torchrun --nproc_per_node N -m contrastive.engine.launch <file>`` (see :func:`torchrun_command`);
every process joins the process group (nccl on GPUs, gloo on CPU) and calls ``function(**kwargs, info=info)``:
it trains its share, rank 0 writes the stage's files. The unimodal and the CLIP stage use this one launcher.

One node: ``--standalone``. Several nodes: ``--nnodes N --rdzv-backend c10d --rdzv-endpoint host:port`` on every
node (the config's ``distributed.nnodes`` / ``distributed.rdzv_endpoint``, or the environment of a cluster job).
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

from contrastive.engine.checkpoint import load_checkpoint
from contrastive.engine.distributed import device_for, dist_from_env, init_process_group
from contrastive.engine.signals import graceful_stop, set_parent_death_signal, wait_forwarding_stop
from contrastive.errors import MclpipeError, StageInterrupted

SUMMARY = "train_summary.json"
#: What an export run as processes leaves for the launcher to read (rank 0 writes it).
EXPORT_SUMMARY = "export_summary.json"
#: What the evaluation sets' encoding run as a job leaves for the launcher to read.
ENCODE_SUMMARY = "encode_summary.json"


def torchrun_command(*, args_path: Path, nproc_per_node: int, nnodes: int = 1,
                     rdzv_endpoint: str | None = None) -> list[str]:
    if nnodes > 1 and not rdzv_endpoint:
        raise MclpipeError("distributed.nnodes > 1 needs distributed.rdzv_endpoint=host:port of the first node")
    rendezvous = ["--standalone"] if nnodes == 1 and not rdzv_endpoint else \
        [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc_per_node={nproc_per_node}",
            "-m", "contrastive.engine.launch", str(args_path)]


def run_under_torchrun(*, entry: str, kwargs: dict, stage_dir: Path, nproc_per_node: int, backend: str,
                       log_path: Path, nnodes: int = 1, rdzv_endpoint: str | None = None,
                       result_file: str = SUMMARY) -> dict:
    """Write the arguments beside the step's outputs, run torchrun, return what rank 0 wrote to ``result_file``."""
    stage_dir = Path(stage_dir)
    args_path = write_launch_args(entry=entry, kwargs=kwargs, backend=backend, stage_dir=stage_dir,
                                  result_file=result_file)
    command = torchrun_command(args_path=args_path, nproc_per_node=nproc_per_node, nnodes=nnodes,
                               rdzv_endpoint=rdzv_endpoint)
    # Its own session, so a terminal's Ctrl-C reaches only this process, which forwards one SIGTERM (the ranks then
    # finish their step and checkpoint); SIGTERM on this process's death, so a killed pipeline leaves no ranks.
    with open(log_path, "ab") as log, graceful_stop():
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=set_parent_death_signal)
        stopped_by = wait_forwarding_stop(process)
    if stopped_by is not None:
        checkpoint = stage_dir / "checkpoints" / "last.pt"
        state = load_checkpoint(checkpoint)
        raise StageInterrupted(signum=stopped_by, checkpoint=str(checkpoint) if state else None,
                               step=state["step"] if state else None)
    if process.returncode != 0:
        tail = Path(log_path).read_text(errors="replace").splitlines()[-15:]
        raise MclpipeError(f"torchrun training of {stage_dir.name} failed (exit {process.returncode}); its last "
                           "lines:\n  " + "\n  ".join(tail) + f"\nFull log: {log_path}. Rerunning resumes from "
                           f"{stage_dir / 'checkpoints' / 'last.pt'}")
    return json.loads((stage_dir / result_file).read_text())


def write_launch_args(*, entry: str, kwargs: dict, backend: str, stage_dir: Path, result_file: str = SUMMARY) -> Path:
    """The JSON every process of a launch reads (here, or on a cluster's nodes through the shared filesystem)."""
    stage_dir = Path(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    args_path = stage_dir / f"{Path(result_file).stem}_args.json"
    args_path.write_text(json.dumps({"entry": entry, "kwargs": kwargs, "backend": backend}, indent=2, default=str))
    return args_path


def resolve_entry(entry: str):
    module, _, function = entry.partition(":")
    return getattr(importlib.import_module(module), function)


def device_name(kwargs: dict) -> str:
    """The config's device of a launch's kwargs: a stage's ``spec``, an export's ``export`` or an encoding's
    ``encode`` carries it (``device``); "auto" when none does."""
    if "device" in kwargs:
        return kwargs["device"]
    return next((value["device"] for value in kwargs.values() if isinstance(value, dict) and "device" in value),
                "auto")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    payload = json.loads(Path(argv[0]).read_text())
    info = dist_from_env()
    kwargs = payload["kwargs"]
    device = device_for(name=device_name(kwargs), info=info)
    init_process_group(info=info, backend=payload.get("backend", "auto"), device=device)
    try:
        resolve_entry(payload["entry"])(**kwargs, info=info)
        if dist.is_initialized():
            dist.barrier()  # no rank tears its connections down while another still talks to it
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def exit_after_success() -> NoReturn:
    """End a rank whose share finished (its files are written, its process group destroyed) without the
    interpreter's finalization: a process group object still referenced then (the DDP module's reducer holds one)
    is destroyed while the interpreter is torn down, and gloo's worker threads can abort the process there
    ("terminate called without an active exception", SIGABRT: CI, 2026-11-28, one two-process stage in about 60),
    failing a torchrun launch whose stage had finished. The streams are flushed first; DataLoader workers end on
    their own when their parent goes."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_after_success()
