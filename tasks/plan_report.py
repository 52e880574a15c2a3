"""The plan of a pipeline (``planning``, ``mclpipe plan``) where users look while it runs: a table
artifact of the flow run, ``plan/plan.md`` in the pipeline's MLflow run, and a progress artifact of the flow run
(stage i of N, time left by the plan) updated as steps finish."""
from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact

from planning.model import Plan
from planning.report import markdown, progress_percent, summary_lines, table_rows, time_left
from tasks.links import artifact_key


def publish_plan(*, config, plan: Plan, tracker, parent_run_id: str, out_dir: Path) -> None:
    """The plan table as a Prefect artifact of this flow run and as ``plan/plan.md`` of the pipeline's MLflow run."""
    create_table_artifact(table=table_rows(plan), key=artifact_key("plan", config.name, config.config_hash()[:8]),
                          description=" ".join(summary_lines(plan)[:1]) + " (mclpipe plan; * critical path)")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "plan.md"
    path.write_text(f"# Plan of {config.name}\n\n" + markdown(plan))
    tracker.log_artifact(parent_run_id, path, artifact_path="plan")


class PlanProgress:
    """The flow run's progress artifact: after each finished step, the share of the projected time done and what
    is left (one log line too)."""

    def __init__(self, plan: Plan, *, stages: int):
        self.plan, self.stages, self.done = plan, stages, 1  # step 1, the data's preparation, is done
        self.artifact_id = create_progress_artifact(progress=progress_percent(plan, 1),
                                                    description=self.describe(stage=0))

    def describe(self, *, stage: int | None) -> str:
        rows = self.plan.rows
        where = f"stage {stage + 1} of {self.stages}, " if stage is not None else ""
        title = rows[self.done - 1].title if 0 < self.done <= len(rows) else "done"
        return f"{where}step {self.done} of {len(rows)} ({title}) done; {time_left(self.plan, self.done)}"

    def step_done(self, *, stage: int | None) -> None:
        self.done = min(self.done + 1, len(self.plan.rows))
        description = self.describe(stage=stage)
        get_run_logger().info(description)
        if self.artifact_id is None:
            return
        try:
            update_progress_artifact(self.artifact_id, progress=progress_percent(self.plan, self.done),
                                     description=description)
        except Exception as exc:  # noqa: BLE001 - the Prefect API is gone: the pipeline goes on
            get_run_logger().warning("Prefect API unreachable (%s): plan progress updates stop", exc)
            self.artifact_id = None
