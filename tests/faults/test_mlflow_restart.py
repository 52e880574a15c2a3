"""The MLflow tracking server of the team stack (on PostgreSQL) SIGKILLed mid-stage and started again a few seconds
later, as a redeploy or an OOM kill followed by a restart would do: the stage trains on while the server is away
(its metrics wait in the step directory's journal), the run finishes (exit 0) with at most one line about the
outage and no traceback, and every stage run holds each expected training metric step exactly once. Slow: a real
`mlflow server` on PostgreSQL (.ci/setup-postgres.sh, as `make stack` starts it) and a run of a few minutes."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from contrastive.engine.ports import free_port
from tasks.tracking import PENDING_FILE
from tests.e2e.stack import BIN, PG_PORT, REPO, psql, wait_for
from tests.faults.cli_process import MCLPIPE, checkpoint_of, cli_env, one_line, start

pytestmark = pytest.mark.slow
# 8 steps an epoch, checkpoints at epoch ends only (the preset's every 4 steps cost half the time): the restart
# test's stage 0 trains 1,200 steps, longer than the 3 s its server stays away and its restart; the outage test's
# stage 0 2,560 steps, longer than a stop past its grace takes (the 5 s grace, tries every 2.5 s): about 4x either
# at 80 steps/s, the rate of two such runs side by side on the 2-core CI machine with one torch thread each (each step
# logging to the server; `make test-slow` sets OMP_NUM_THREADS, 2026-11-29). Each test checks that its stage was
# still training when it needed to be, so a faster machine fails with that line rather than passing without an
# outage.
EPOCHS, OUTAGE_EPOCHS = 150, 320
STAGE1_EPOCHS = 4  # the restart test's stage 1, trained after the outage
LOG_EVERY = 2  # the preset's train.log_every_steps


class MlflowServer:
    """`mlflow server` on a PostgreSQL database, started as .ci/stack.sh starts it, in its own process group (its
    workers die with it), killable and restartable on the same port, database and artifact folder."""

    def __init__(self, root: Path, database: str):
        self.root, self.port, self.process = root, free_port(), None
        self.command = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers",
                        "1", "--backend-store-uri",
                        f"postgresql+psycopg2://mclpipe:mclpipe@127.0.0.1:{PG_PORT}/{database}",
                        "--artifacts-destination", str(root / "mlartifacts")]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = self.root / "mlflow.log"
        with open(log, "a") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_for(f"{self.url}/health", self.process, log)

    def kill(self) -> None:
        """SIGKILL to the server and its workers (the OOM killer's way), nothing flushed or closed."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@contextmanager
def mlflow_on_postgres(root: Path):
    subprocess.run(["bash", str(REPO / ".ci" / "setup-postgres.sh")], check=True, capture_output=True, text=True)
    database = f"mlflow_restart_{uuid.uuid4().hex[:8]}"
    psql(f"CREATE DATABASE {database} OWNER mclpipe")
    server = MlflowServer(root, database)
    try:
        server.start()
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()
        psql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def run_args(workdir: Path, mlflow_url: str, *, epochs: int = EPOCHS, stages: int = 2) -> list[str]:
    sets = [f"output_dir={workdir / 'runs'}", f"data.cache_dir={workdir / 'data'}", f"tracking.uri={mlflow_url}",
            f"mcl.num_stages={stages}", "mcl.control=false", f"train.epochs={epochs}",
            "train.checkpoint_every_steps=1000", "tracking.system_metrics_seconds=2"]
    return ["run", "trifeature_tiny", *[arg for value in sets for arg in ("--set", value)]]


@pytest.mark.timeout(1800)
def test_mlflow_server_killed_and_restarted_mid_stage_loses_and_repeats_no_metric(tmp_path):
    workdir = tmp_path / "run"
    with mlflow_on_postgres(tmp_path) as server:
        # the outage is in stage 0; stage 1 (after it, on the restarted server) needs only a few epochs
        cli = start(workdir, [*run_args(workdir, server.url), "--set", f"stage_overrides.1.train.epochs={STAGE1_EPOCHS}"])
        cli.wait_for(lambda: checkpoint_of(workdir, "train0") is not None, timeout=900,
                     what="the first checkpoint of stage 0")
        server.kill()
        journal = checkpoint_of(workdir, "train0").parent.parent / PENDING_FILE
        # the stage goes on training: its next checkpoints' metrics wait on disk
        cli.wait_for(journal.exists, timeout=300, what=f"metrics kept in {journal} while the server is away")
        time.sleep(3)
        assert not (journal.parent / "train_summary.json").exists(), "stage 0 ended before the server came back"
        server.start()
        code, _ = cli.wait(timeout=1200)
        output = cli.output
        assert code == 0, output[-4000:]
        assert "Traceback" not in output, output[output.find("Traceback") - 500:][:4000]
        about_outage = [line for line in output.splitlines()
                        if any(word in line for word in ("stopped answering", "Connection refused",
                                                         "Failed to", "MLflow call to", "retrying"))]
        assert len(about_outage) <= 1, "\n".join(about_outage)
        assert not journal.exists()  # everything it kept was sent and acknowledged

        client = MlflowClient(tracking_uri=server.url)
        experiment = client.get_experiment_by_name("mclpipe")
        stages = [r for r in client.search_runs([experiment.experiment_id]) if "stage" in r.data.tags]
        assert sorted(r.data.tags["stage"] for r in stages) == ["0", "1"]
        for run in sorted(stages, key=lambda r: r.data.tags["stage"]):
            stage = run.data.tags["stage"]
            trained = json.loads(next((workdir / "runs" / "steps").glob(f"train{stage}-*/train_summary.json"))
                                 .read_text())["steps"]  # cluster-pure batches: not 8 an epoch from stage 1 on
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
            assert sorted(steps) == list(range(LOG_EVERY, trained + 1, LOG_EVERY)), (stage, steps)
            epochs = [m.step for m in client.get_metric_history(run.info.run_id, "train/epoch_loss")]
            assert sorted(epochs) == list(range(EPOCHS if stage == "0" else STAGE1_EPOCHS)), (stage, epochs)
            assert run.info.status == "FINISHED"


@pytest.mark.timeout(1800)
def test_an_outage_past_its_grace_ends_in_one_line_and_the_printed_command_sends_the_kept_metrics_once(tmp_path):
    """The server killed at stage 0's first checkpoint and not started again within tracking.outage_grace_seconds:
    the run stops (exit 2) with one line naming the grace and the command that continues, the journal keeps the
    metrics of the steps its checkpoint holds; with the server back, that command replays them and finishes, so the
    stage's runs (the stopped one and the resumed one) hold every expected step exactly once."""
    workdir = tmp_path / "run"
    with mlflow_on_postgres(tmp_path) as server:
        # stage 0 alone: the outage is in it, and a long stage 1 would only add minutes
        cli = start(workdir, [*run_args(workdir, server.url, epochs=OUTAGE_EPOCHS, stages=1), "--set",
                              "tracking.outage_grace_seconds=5"])
        cli.wait_for(lambda: checkpoint_of(workdir, "train0") is not None, timeout=900,
                     what="the first checkpoint of stage 0")
        server.kill()
        code, _ = cli.wait(timeout=900)
        assert code == 2, cli.output[-4000:]
        assert "Traceback" not in cli.output, cli.output[cli.output.find("Traceback") - 500:][:4000]
        line = one_line(cli.output, "error:")
        assert "has not answered for" in line and "tracking.outage_grace_seconds (5 s)" in line, line
        assert "Continue with: mclpipe resume" in line and line in (workdir / "runs" / "last-stop.txt").read_text()
        journal = checkpoint_of(workdir, "train0").parent.parent / PENDING_FILE
        assert journal.exists()  # what the checkpoint holds, not yet in MLflow
        assert not (journal.parent / "train_summary.json").exists(), "stage 0 ended before the grace ran out"

        server.start()
        resume = shlex.split(line.split("Continue with: ", 1)[1])
        resumed = subprocess.run([MCLPIPE, *resume[1:]], cwd=workdir, env=cli_env(workdir), capture_output=True,
                                 text=True, timeout=1200)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert not journal.exists()

        client = MlflowClient(tracking_uri=server.url)
        experiment = client.get_experiment_by_name("mclpipe")
        stage0 = [r.info.run_id for r in client.search_runs([experiment.experiment_id], "tags.stage = '0'")]
        trained = json.loads(next((workdir / "runs" / "steps").glob("train0-*/train_summary.json")).read_text())
        steps = sorted(m.step for run_id in stage0 for m in client.get_metric_history(run_id, "train/loss"))
        assert steps == list(range(LOG_EVERY, trained["steps"] + 1, LOG_EVERY)), steps
        assert trained["resumed_from_step"] is not None  # the resumed stage trained only the steps after it
