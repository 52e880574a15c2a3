"""contrastive/engine/launch.py: a rank whose share finished exits 0 without the interpreter's finalization."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_finished_rank_exits_zero_though_finalization_would_abort_it(tmp_path):
    """The entry writes its file and registers an exit handler that aborts (SIGABRT), as gloo's threads can while
    a still-referenced process group is destroyed at interpreter exit: the launched process exits 0 with the
    entry's file written, because nothing runs after its share finished."""
    args = tmp_path / "args.json"
    out = tmp_path / "done.txt"
    args.write_text(json.dumps({"entry": "tests.unit.engine.launch_entries:finish_then_abort_at_exit",
                                "kwargs": {"out": str(out)}, "backend": "auto"}))
    done = subprocess.run([sys.executable, "-m", "contrastive.engine.launch", str(args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert out.read_text() == "rank 0 of 1"
