"""A pipeline whose stages run split across TWO real Slurm nodes (.ci/setup-slurm-2node.sh: two slurmd, each in its
own network namespace with its own host name and address; `launcher.slurm.nodes=2`, `distributed.nnodes=2`, one
gloo process a node) equals the same pipeline as two processes on one node (`launcher.kind=torchrun`,
`distributed.nproc_per_node=2`): the same losses step for step, the same exported embeddings, the same results table.
What only a second node shows: the c10d rendezvous on the job's first node reached by its name from the other one,
LOCAL_RANK 0 on both nodes (rank 1 is node 2's local rank 0), the sampler's partition across nodes, checkpoints and
exports written by global rank 0 alone on the file system both nodes see."""
from pathlib import Path

import pytest

from flows.pipeline import mcl_pipeline
from pipeline_config.loader import load_config
from tests.launchers.compare import assert_same_arrays, assert_same_losses
from tests.slurm import require_two_nodes

pytestmark = pytest.mark.slow

# the image pipeline's stage 0, its clustering and an MCL stage on pseudo-label batches (each a group's samples,
# split over the two nodes), their exports and the evaluation; each modality's stage alone on two nodes:
# tests/launchers/test_slurm_two_nodes.py
IMAGE = ["mcl.num_stages=2", "mcl.clusters=4", "mcl.control=false"]
ONE_NODE = ["launcher.kind=torchrun", "distributed.nproc_per_node=2", "distributed.backend=gloo"]


def two_nodes(partition: str) -> list[str]:
    return ["launcher.kind=slurm", f"launcher.slurm.partition={partition}", "launcher.slurm.nodes=2",
            "distributed.nnodes=2", "distributed.nproc_per_node=1", "distributed.backend=gloo",
            "launcher.slurm.cpus_per_task=1", "launcher.slurm.time_limit=15", "launcher.slurm.poll_seconds=0.5"]


def run(preset: str, overrides: list[str], root: Path, data: Path) -> dict:
    config = load_config(preset, [f"output_dir={root / 'runs'}", f"data.cache_dir={data}",
                                  f"tracking.uri=sqlite:///{root / 'mlflow.db'}", *overrides])
    summary = mcl_pipeline(config)
    summary["output_dir"] = Path(config.output_dir)
    return summary


def step_dirs(output_dir: Path, result: str) -> dict[str, Path]:
    """The directories holding ``result`` (train_metrics.jsonl, manifest.json) under the run's step directories,
    by their step's kind and stage (the step directory's name without its content hash)."""
    steps = output_dir / "steps"
    return {path.relative_to(steps).parts[0].rsplit("-", 1)[0]: path.parent for path in steps.rglob(result)}


def test_an_image_pipeline_split_across_two_nodes_equals_two_processes_on_one(tmp_path, monkeypatch):
    partition = require_two_nodes(monkeypatch)
    one = run("trifeature_tiny", [*IMAGE, *ONE_NODE], tmp_path / "one", tmp_path / "data")
    two = run("trifeature_tiny", [*IMAGE, *two_nodes(partition)], tmp_path / "two", tmp_path / "data")

    jobs = sorted((two["output_dir"] / "steps").rglob("*_job.log"))
    assert len(jobs) == 4, jobs  # train and export of both stages
    for log in jobs:  # every job ran on both nodes, met on node 1 and ended well
        text = log.read_text()
        assert "on mcl-node[1-2], rendezvous mcl-node1:" in text and "mclpipe: stage exited with 0" in text, log

    for result, compare in (("train_metrics.jsonl", assert_same_losses), ("manifest.json", assert_same_arrays)):
        steps_one, steps_two = step_dirs(one["output_dir"], result), step_dirs(two["output_dir"], result)
        assert steps_two and steps_two.keys() == steps_one.keys(), result
        for name, step_dir in steps_one.items():
            compare(steps_two[name], step_dir)

    assert two["results"].keys() == one["results"].keys()
    for row, metrics in one["results"].items():
        assert two["results"][row] == pytest.approx(metrics, abs=1e-6), row
