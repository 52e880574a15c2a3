"""Helpers of the fault tests that drive the real `mclpipe` CLI in a subprocess: its environment (a Prefect home and
an MLflow store of the test's own, its own temporary Prefect server), its process tree, and what Prefect recorded."""
from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil

MCLPIPE = str(Path(sys.executable).with_name("mclpipe"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: Stages of the tiny preset long enough to be stopped in the middle of one: 10 epochs of 8 or 9 steps (80-90),
#: checkpointed every 4. A test signals within about 0.1 s of a checkpoint; at one torch thread a step takes about
#: 12 ms on the 2-core CI machine with another test beside it (`make test-slow`, 2026-11-29), so the 70-odd steps
#: after the first checkpoint leave nearly a second. Each test asserts it stopped mid-stage.
_MID_STAGE_EPOCH_COUNT = 10
MID_STAGE_EPOCHS = f"train.epochs={_MID_STAGE_EPOCH_COUNT}"
MID_STAGE_STEPS = 8 * _MID_STAGE_EPOCH_COUNT  # the fewest steps such a stage has


def cli_env(workdir: Path) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(workdir / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "COLUMNS": "250", "MCLPIPE_LOG_LEVEL": "INFO"}  # the tests read the run's INFO lines (flows/console.py)
    env.pop("PREFECT_API_URL", None)  # a user's run: its own temporary local server
    return env


def tiny_run_args(workdir: Path, *extra: str) -> list[str]:
    """`mclpipe run` on the tiny preset (3 stages) with everything under ``workdir``; ``extra``: more --set."""
    sets = [f"output_dir={workdir / 'runs'}", f"data.cache_dir={workdir / 'data'}",
            f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}", *extra]
    return ["run", "trifeature_tiny", *[arg for value in sets for arg in ("--set", value)]]


def start(workdir: Path, args: list[str], *, terminal: bool = False) -> "Cli":
    workdir.mkdir(parents=True, exist_ok=True)
    return Cli(workdir, args, terminal=terminal)


class Cli:
    """`mclpipe ARGS` in its own session; with ``terminal`` its stdin/stdout/stderr are a pseudo-terminal that is
    its controlling terminal (so a typed Ctrl-C is the terminal's SIGINT to its foreground process group)."""

    def __init__(self, workdir: Path, args: list[str], *, terminal: bool):
        self.workdir, self.chunks = workdir, []
        if terminal:
            self.master, slave = os.openpty()
            self.process = subprocess.Popen([MCLPIPE, *args], cwd=workdir, env=cli_env(workdir), stdin=slave,
                                            stdout=slave, stderr=slave, start_new_session=True,
                                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
            os.close(slave)
            source = self.master
        else:
            self.master = None
            read, write = os.pipe()
            self.process = subprocess.Popen([MCLPIPE, *args], cwd=workdir, env=cli_env(workdir), stdout=write,
                                            stderr=write, start_new_session=True)
            os.close(write)
            source = read
        self.reader = threading.Thread(target=self._read, args=(source,), daemon=True)
        self.reader.start()

    def _read(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not chunk:
                break
            self.chunks.append(chunk)
        os.close(fd)

    @property
    def output(self) -> str:
        return ANSI.sub("", b"".join(self.chunks).decode(errors="replace"))

    def wait_for(self, predicate, *, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            if self.process.poll() is not None:
                raise AssertionError(f"mclpipe exited ({self.process.returncode}) before {what}:\n"
                                     f"{self.output[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output[-3000:]}")

    def type_ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def server(self) -> psutil.Process | None:
        """The temporary Prefect server process of this CLI (None until started)."""
        for child in self.descendants():
            try:
                if "flows.local_server" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def wait(self, timeout: float) -> tuple[int, float]:
        """(exit status, seconds it took)."""
        started = time.time()
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code, time.time() - started


def checkpoint_of(workdir: Path, prefix: str) -> Path | None:
    found = sorted((workdir / "runs" / "steps").glob(f"{prefix}-*/checkpoints/last.pt"))
    return found[0] if found else None


def one_line(output: str, prefix: str) -> str:
    lines = [line.strip() for line in output.replace("\r", "\n").splitlines() if line.strip().startswith(prefix)]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def prefect_states(workdir: Path) -> dict[str, list[tuple[str, str]]]:
    """{"flow_runs": [(name, state)], "task_runs": [(name, state)]} from the Prefect database of the CLI's server
    (read directly: that server went with the CLI)."""
    with sqlite3.connect(workdir / "prefect" / "prefect.db") as db:
        return {"flow_runs": db.execute("select name, state_type from flow_run").fetchall(),
                "task_runs": db.execute("select name, state_type from task_run").fetchall()}


def gone(processes: list[psutil.Process], *, timeout: float) -> list[psutil.Process]:
    """The processes still alive after ``timeout`` seconds."""
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return alive
