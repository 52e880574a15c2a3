""".ci/setup-postgres.sh, which every PostgreSQL test and `make stack` call, often several at once (one lock on the
cluster's directory lets one at a time set it up). The server it starts must not inherit that lock: a postgres
holding it for its whole life made every later setup wait forever, so the slow suite's stack tests all timed out
(CI, 2026-11-26)."""
import subprocess

import pytest

from tests.e2e.stack import PG_DIR, REPO

pytestmark = pytest.mark.slow


def test_the_running_server_leaves_the_setup_lock_free_and_a_second_setup_returns():
    setup = ["bash", str(REPO / ".ci" / "setup-postgres.sh")]
    subprocess.run(setup, check=True, capture_output=True, text=True, timeout=600)
    # the server is running now; nobody but a setup in progress (the other test process's, a second or two) may hold
    # the directory's lock: wait for that, not for a server that holds it for its whole life
    free = subprocess.run(["flock", "--wait", "60", "--conflict-exit-code", "9", PG_DIR, "true"], timeout=90)
    assert free.returncode == 0, f"the lock on {PG_DIR} is held: {subprocess.run(['fuser', PG_DIR], capture_output=True, text=True).stdout}"
    again = subprocess.run(setup, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.startswith("postgresql://"), again.stderr[-2000:]
