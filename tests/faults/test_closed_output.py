"""`mclpipe run ... 2>&1 | tee run.log` and Ctrl-C: the terminal's SIGINT ends tee too, so the CLI's final line
goes to a pipe nobody reads. The line is kept in <output_dir>/last-stop.txt (``mclpipe status`` prints it) and the
exit code stays the interrupt's, never a silent 1 from the broken pipe."""
import fcntl
import os
import signal
import subprocess
import sys
import termios
import time

import pytest

from tests.faults.cli_process import MCLPIPE, MID_STAGE_EPOCHS, checkpoint_of, cli_env, tiny_run_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_final_line_to_a_closed_pipe_keeps_the_exit_code_and_the_line(tmp_path):
    """The CLI's way out (record the line, print it, exit) when its reader is gone: the exit code is the one
    chosen, the line is in last-stop.txt."""
    code = ("from rich.console import Console; from flows import shutdown; shutdown.install(); "
            f"shutdown.record_stop({str(tmp_path / 'runs')!r}, 'interrupted: stopped by Ctrl-C (SIGINT); Resume with: "
            "mclpipe resume abc'); shutdown.say(Console(stderr=True), 'interrupted: stopped'); "
            "shutdown.say(Console(), 'finished'); shutdown.exit_now(130)")
    read, write = os.pipe()
    os.close(read)  # the reader (tee) is gone before the CLI writes
    done = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=write, cwd=ROOT, timeout=120)
    os.close(write)
    assert done.returncode == 130
    line = (tmp_path / "runs" / "last-stop.txt").read_text()
    assert line.split(" ", 1)[1] == "interrupted: stopped by Ctrl-C (SIGINT); Resume with: mclpipe resume abc\n"

    status = subprocess.run([MCLPIPE, "status", "--output-dir", str(tmp_path / "runs")], capture_output=True,
                            text=True, timeout=120)
    assert status.returncode == 0 and "interrupted: stopped by Ctrl-C" in status.stdout
    missing = subprocess.run([MCLPIPE, "status", "--output-dir", str(tmp_path / "nowhere")], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "no run has ended under" in missing.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ctrl_c_with_output_piped_to_tee_exits_130_and_keeps_the_line(tmp_path):
    workdir = tmp_path / "piped"
    workdir.mkdir()
    master, slave = os.openpty()
    read, write = os.pipe()
    tee = subprocess.Popen(["cat"], stdin=read, stdout=subprocess.DEVNULL)  # the `| tee run.log` of the shell
    os.close(read)
    cli = subprocess.Popen([MCLPIPE, *tiny_run_args(workdir, MID_STAGE_EPOCHS)], cwd=workdir, env=cli_env(workdir),
                           stdin=slave, stdout=write, stderr=write, start_new_session=True,
                           preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    os.close(write)
    deadline = time.time() + 900
    while checkpoint_of(workdir, "train1") is None:
        assert cli.poll() is None and time.time() < deadline, "mclpipe ended before stage 1 checkpointed"
        time.sleep(0.1)
    tee.send_signal(signal.SIGKILL)  # Ctrl-C in the shell ends tee as well as mclpipe
    tee.wait()
    os.write(master, b"\x03")
    code = cli.wait(timeout=120)
    os.close(master)
    assert code == 130
    line = (workdir / "runs" / "last-stop.txt").read_text()
    assert "interrupted: stopped by Ctrl-C (SIGINT) during the train step of stage 1" in line
    assert "Resume with: mclpipe resume" in line
    status = subprocess.run([MCLPIPE, "status", "--output-dir", str(workdir / "runs")], capture_output=True,
                            text=True, timeout=120)
    assert status.returncode == 0 and "Resume with: mclpipe resume" in status.stdout
