"""The real `mclpipe run` with output_dir on a 1.5 MB tmpfs that the pipeline's projected writes do not fit
(issue 46): refused before its first step, in one line naming the key and the space needed, exit 2, and nothing
written on that disk; `--force` skips the check (the run then starts and fills the disk: the disk-full tests'
ground). Not slow: the refusal comes before any step."""
import subprocess

from tests.faults.cli_process import ANSI, MCLPIPE, cli_env, one_line


def test_a_run_whose_writes_exceed_the_disk_is_refused_before_its_first_step(tmp_path, small_tmpfs):
    # trifeature_quick writes three 10,000 x 256 float16 exports (5 MB each) besides the rest
    args = ["run", "trifeature_quick", "--set", f"output_dir={small_tmpfs / 'runs'}", "--set",
            f"data.cache_dir={tmp_path / 'data'}", "--set", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    refused = subprocess.run([MCLPIPE, *args], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True,
                             timeout=600)
    output = ANSI.sub("", refused.stdout + refused.stderr)
    assert refused.returncode == 2, output[-3000:]
    line = one_line(output, "error:")
    assert line.startswith("error: this pipeline writes about ") and f"under output_dir {small_tmpfs}/runs" in line
    assert "point output_dir at a disk with" in line and "--force runs anyway" in line
    assert "Traceback" not in output
    assert list(small_tmpfs.iterdir()) == []  # nothing written: no step, no record, not even last-stop.txt
    assert not (tmp_path / "data").exists()  # nor was the data prepared
