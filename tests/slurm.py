"""Test helper: the real single-node Slurm cluster of .ci/setup-slurm.sh (partition `debug`). Tests that need it
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
