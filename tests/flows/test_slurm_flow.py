"""`mclpipe run` with launcher.kind=slurm: the flow runs here, its training and export stages as jobs on the real
single-node Slurm cluster (.ci/setup-slurm.sh), and the stage's model equals the same stage trained in-process."""
import json
from pathlib import Path

import pytest
import torch

from contrastive.modalities.image import steps as stages
from flows.pipeline import mcl_pipeline
from tests.slurm import require_slurm

pytestmark = pytest.mark.slow


def test_one_stage_pipeline_on_slurm_equals_the_local_run(tiny_config, tmp_path):
    partition = require_slurm()
    config = tiny_config("mcl.num_stages=1", "mcl.clusters=4", "launcher.kind=slurm",
                         f"launcher.slurm.partition={partition}", "launcher.slurm.time_limit=15",
                         "launcher.slurm.poll_seconds=1")
    summary = mcl_pipeline(config)
    assert {"probe/color", "probe/shape"} <= set(summary["results"]["stage 0"])

    [stage_dir] = [p.parent for p in Path(config.output_dir).rglob("train_summary_job.sbatch")]
    log = (stage_dir / "train_summary_job.log").read_text()
    assert "mclpipe: job " in log and "mclpipe: stage exited with 0" in log
    assert list(Path(config.output_dir).rglob("export_summary_job.sbatch")), "the export ran as a Slurm job too"

    args = json.loads((stage_dir / "train_summary_args.json").read_text())
    spec = stages.ImageStageSpec.from_json({**args["kwargs"]["spec"], "stage_dir": str(tmp_path / "local")})
    stages.train_stage(spec)
    local = torch.load(tmp_path / "local" / "model" / "model.pt", weights_only=True)["state_dict"]
    remote = torch.load(stage_dir / "model" / "model.pt", weights_only=True)["state_dict"]
    for name, value in local.items():
        assert torch.equal(remote[name], value), name


@pytest.mark.parametrize("kind", ["local", "torchrun"])
def test_two_process_stages_here_through_either_local_kind(tiny_config, kind):
    """launcher.kind=local with 2 processes keeps today's torchrun path; kind=torchrun runs the same through the
    launcher interface (log streamed, job log beside the stage)."""
    config = tiny_config("mcl.num_stages=1", "mcl.clusters=4", f"launcher.kind={kind}",
                         "distributed.nproc_per_node=2", "distributed.backend=gloo")
    summary = mcl_pipeline(config)
    assert {"probe/color", "probe/shape"} <= set(summary["results"]["stage 0"])
    logs = {p.name for p in Path(config.output_dir).rglob("*.log")}
    assert ("train_summary_job.log" in logs) == (kind == "torchrun")
    assert ("torchrun.log" in logs) == (kind == "local")
