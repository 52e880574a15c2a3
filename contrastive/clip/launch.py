"""Run one CLIP training stage under torchrun: ``python -m contrastive.clip.launch <stage_args.json>``.

The Prefect task writes the keyword arguments of :func:`contrastive.clip.stages.train_stage` to a JSON file and
starts ``torchrun --standalone --nproc_per_node N -m contrastive.clip.launch <file>`` (see
:func:`torchrun_command`); every process joins the process group (nccl on GPUs, gloo on CPU), trains its share
and rank 0 writes the stage's files. Multi-node: start the same module with torchrun's ``--nnodes`` /
``--rdzv-endpoint`` yourself; nothing here assumes one node.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch.distributed as dist

from contrastive.clip.distributed import dist_from_env, device_for, init_process_group
from contrastive.errors import MclpipeError

SUMMARY = "train_summary.json"


def torchrun_command(*, args_path: Path, nproc_per_node: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
            "-m", "contrastive.clip.launch", str(args_path)]


def run_under_torchrun(*, kwargs: dict, nproc_per_node: int, log_path: Path) -> dict:
    """Write the stage arguments beside the stage, run torchrun, return rank 0's train summary."""
    stage_dir = Path(kwargs["stage_dir"])
    stage_dir.mkdir(parents=True, exist_ok=True)
    args_path = stage_dir / "stage_args.json"
    args_path.write_text(json.dumps(kwargs, indent=2, default=str))
    with open(log_path, "ab") as log:
        completed = subprocess.run(torchrun_command(args_path=args_path, nproc_per_node=nproc_per_node),
                                   stdout=log, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0:
        raise MclpipeError(f"torchrun training of {stage_dir.name} failed (exit {completed.returncode}); see "
                           f"{log_path}. Rerunning resumes from {stage_dir / 'checkpoints' / 'last.pt'}")
    return json.loads((stage_dir / SUMMARY).read_text())


def main(argv: list[str] | None = None) -> None:
    from contrastive.clip.stages import train_stage

    argv = sys.argv[1:] if argv is None else argv
    kwargs = json.loads(Path(argv[0]).read_text())
    info = dist_from_env()
    device = device_for(name=kwargs["device"], info=info)
    init_process_group(info=info, backend=kwargs.pop("backend", "auto"), device=device)
    try:
        train_stage(**kwargs, info=info)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
