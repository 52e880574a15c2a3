"""Test helper: the real Slurm clusters of .ci/setup-slurm.sh (one node, partition `debug`) and
.ci/setup-slurm-2node.sh (two nodes in network namespaces, partition `pair`). Tests that need them
are skipped where Slurm's packages are not installed on this machine, and fail there under CI (tests/components.py)."""
import os
import shutil
import subprocess
from pathlib import Path

from tests.components import missing

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / ".ci" / "setup-slurm.sh"


def slurm_answers() -> bool:
    probe = subprocess.run(["sinfo", "-h", "-p", "debug", "-o", "%T"], capture_output=True, text=True)
    return probe.returncode == 0 and any(s.startswith(("idle", "mixed", "alloc")) for s in probe.stdout.split())


def require_slurm() -> str:
    """The `debug` partition of this host's Slurm, started with .ci/setup-slurm.sh when installed but down."""
    absent = [tool for tool in ("sbatch", "squeue", "scancel", "slurmctld", "slurmd", "munged")
              if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()]
    if absent:
        missing(f"Slurm is not installed here ({', '.join(absent)} missing)",
                fix="run .ci/setup-slurm.sh as root (apt-get install slurm-wlm munge)")
    if not slurm_answers():
        if os.geteuid() != 0:
            missing("Slurm is installed but not running, and starting it needs root", fix="sudo .ci/setup-slurm.sh")
        subprocess.run(["bash", str(SETUP)], check=True, timeout=180)
    assert slurm_answers(), "the debug partition is not up after .ci/setup-slurm.sh; see /var/log/slurm/"
    return "debug"


SETUP_TWO_NODES = ROOT / ".ci" / "setup-slurm-2node.sh"
TWO_NODE_CONF = "/etc/slurm-2node/slurm.conf"
TWO_NODES = ("mcl-node1", "mcl-node2")


def two_nodes_idle() -> bool:
    probe = subprocess.run(["sinfo", "-h", "-N", "-p", "pair", "-o", "%N %T"], capture_output=True, text=True,
                           env={**os.environ, "SLURM_CONF": TWO_NODE_CONF})
    idle = [line.split()[0] for line in probe.stdout.splitlines()
            if line.split()[1].startswith(("idle", "mixed", "alloc")) and not line.split()[1].endswith("*")]
    return probe.returncode == 0 and sorted(idle) == list(TWO_NODES)


def require_two_nodes(monkeypatch) -> str:
    """The `pair` partition of the two-node cluster of .ci/setup-slurm-2node.sh (two slurmd in their own network
    namespaces), (re)started when a node is down; ``SLURM_CONF`` points this test's Slurm clients at it."""
    monkeypatch.setenv("SLURM_CONF", TWO_NODE_CONF)
    if shutil.which("sinfo") is None or not two_nodes_idle():
        if os.geteuid() != 0:
            missing("the two-node Slurm cluster is not up, and starting it (network namespaces) needs root",
                    fix="sudo .ci/setup-slurm-2node.sh")
        subprocess.run(["bash", str(SETUP_TWO_NODES)], check=True, timeout=300)
    assert two_nodes_idle(), "the pair partition has not two idle nodes after .ci/setup-slurm-2node.sh"
    return "pair"
